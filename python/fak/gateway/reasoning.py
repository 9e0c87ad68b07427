"""A model's reasoning (``<think>…</think>``) apart from its answer.

Qwen3's chat templates (and DeepSeek-R1's, QwQ's) let the model think before it answers: the
assistant turn opens with ``<think>\\n``, the reasoning, ``\\n</think>\\n\\n``, then the answer; a
thinking-only variant pre-fills ``<think>\\n`` in the prompt, so the model's text starts inside
the reasoning and only ``</think>`` shows; ``enable_thinking=false`` pre-fills an empty
``<think>\\n\\n</think>\\n\\n``. The gateway returns the reasoning in each protocol's own place
(chat completions ``reasoning_content``, Anthropic ``thinking`` blocks, Responses ``reasoning``
items) and only the answer as content, so tool calls are parsed from the answer alone — vLLM's
``Qwen3ReasoningParser`` / ``DeepSeekR1ReasoningParser`` behave the same way.

- ``template_thinks(source)``: whether a chat template has thinking (it names both tags);
- ``ReasoningSplitter``: generated text → ``(reasoning, content)`` pieces, streamed (a tag split
  across deltas included), starting in the reasoning when the prompt already opened it;
- ``prompt_opens_reasoning(prompt)``: whether a rendered prompt ends inside an open
  ``<think>``.
"""

from __future__ import annotations

__all__ = [
    "THINK_CLOSE",
    "THINK_OPEN",
    "ReasoningSplitter",
    "prompt_opens_reasoning",
    "template_thinks",
]

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def template_thinks(source: str | None) -> bool:
    """Whether a chat template (its Jinja source) has thinking: it writes or reads both
    ``<think>`` and ``</think>`` (Qwen3's templates do; Qwen2.5's and Qwen3-Coder's do not)."""
    return bool(source) and THINK_OPEN in source and THINK_CLOSE in source  # type: ignore[operator]


def prompt_opens_reasoning(prompt: str) -> bool:
    """Whether ``prompt`` (the rendered chat prompt, generation prompt included) ends inside an
    open ``<think>`` (a thinking-only template's pre-fill): the model's text then starts as
    reasoning."""
    tail = prompt.rstrip()
    return tail.endswith(THINK_OPEN)


def _partial(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


class ReasoningSplitter:
    """Streaming split of generated text into reasoning and content.

    Args:
        in_reasoning: the prompt already opened ``<think>`` (``prompt_opens_reasoning``).

    ``feed(delta)`` and ``finish()`` return ``(reasoning, content)`` text of the deltas seen so
    far that are decided; text that may still be a tag is held. Reasoning is what stands between
    ``<think>`` (only at the start of the answer, after blanks, or in the prompt) and
    ``</think>``, without the newlines the template puts around it; the content is what follows
    ``</think>`` less its leading newlines, or the whole text when the answer does not open with
    ``<think>``. A generation that ends inside the reasoning (``max_tokens``) is all reasoning.
    """

    def __init__(self, *, in_reasoning: bool = False) -> None:
        self._state = "reasoning" if in_reasoning else "start"
        self._buf = ""
        self._lead = True  # strip the newlines the template puts after <think> / </think>

    @property
    def in_reasoning(self) -> bool:
        """Whether the text seen so far ends inside the reasoning."""
        return self._state == "reasoning"

    def feed(self, delta: str) -> tuple[str, str]:
        """Consume a generated text delta; return the ``(reasoning, content)`` it decides."""
        self._buf += delta
        reasoning = content = ""
        while self._buf:
            if self._state == "start":
                head = self._buf.lstrip()
                if not head:
                    return reasoning, content
                if head.startswith(THINK_OPEN):
                    self._buf = head[len(THINK_OPEN):]
                    self._state, self._lead = "reasoning", True
                    continue
                if THINK_OPEN.startswith(head):
                    return reasoning, content
                self._state, self._lead = "content", False  # no reasoning: the text as it came
                continue
            if self._state == "reasoning":
                if self._lead:
                    self._buf = self._buf.lstrip("\n")
                    if not self._buf:
                        return reasoning, content
                    self._lead = False
                end = self._buf.find(THINK_CLOSE)
                if end < 0:
                    keep = _partial(self._buf, THINK_CLOSE)
                    body = self._buf[:len(self._buf) - keep]
                    held = len(body) - len(body.rstrip("\n"))  # newlines that may precede </think>
                    reasoning += body[:len(body) - held]
                    self._buf = self._buf[len(body) - held:]
                    return reasoning, content
                reasoning += self._buf[:end].rstrip("\n")
                self._buf = self._buf[end + len(THINK_CLOSE):]
                self._state, self._lead = "content", True
                continue
            if self._lead:
                self._buf = self._buf.lstrip("\n")
                if not self._buf:
                    return reasoning, content
                self._lead = False
            content += self._buf
            self._buf = ""
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        """End of generation: what is held (reasoning when the answer ended inside it)."""
        buf, self._buf = self._buf, ""
        if self._state == "reasoning":
            return buf.rstrip("\n"), ""
        if self._state == "start":
            return "", buf
        return "", buf.lstrip("\n") if self._lead else buf
