"""Tool calls of text-protocol agents: fenced shell blocks in assistant content.

Agents such as mini-swe-agent and fak's own text protocol do not use OpenAI tool calls: they ask
the model for one fenced block and run it. They find blocks with a regex over the whole reply —
fak's agent with ```` ```(bash|sh|shell)[ \\t]*\\n(.*?)``` ````, mini-swe-agent with
```` ```bash\\s*\\n(.*?)\\n``` ```` — so a block counts wherever its opening fence appears, even
inside another fenced block. When a request carries ``X-Fak-Text-Tools: bash``, the gateway finds
blocks the same way, only more widely, and adjudicates each as a call of the tool ``bash`` with
arguments ``{"command": <block text>}``:

- an opening fence is three backticks, optional blanks, and a shell name (``bash``, ``sh``,
  ``shell``, ``zsh``, ``console``, and mini-swe-agent 2.x's ``mswea_bash_command``; any case)
  not followed by a letter, digit, ``_``, ``+`` or ``-`` — with or without the newline the agents
  require;
- it is searched everywhere in the text, not only at the start of a line or outside other fences;
- the block ends at the next three backticks; a block still open when the generation ends is
  adjudicated too, so a missing closing fence cannot smuggle a command past the policy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fak.toolcalls.segmenter import Block, Text

__all__ = [
    "FENCE",
    "SHELL_FENCE",
    "SHELL_LANGUAGES",
    "BashBlockParser",
    "ShellBlock",
    "bash_command",
    "fence_language",
    "shell_blocks",
]

FENCE = "```"
#: Fence names of shell blocks: the usual ones, and the agents' own (mini-swe-agent 2.x asks for
#: ```` ```mswea_bash_command ````; its 1.x, fak's text protocol and aider write ```` ```bash ````).
SHELL_LANGUAGES = ("bash", "sh", "shell", "zsh", "console", "mswea_bash_command")
SHELL_FENCE = re.compile(r"```[ \t]*(?:" + "|".join(sorted(SHELL_LANGUAGES, key=len, reverse=True))
                         + r")(?![A-Za-z0-9_+\-])", re.IGNORECASE)
# The text after the last backticks that could still grow into an opening fence.
_MAYBE_FENCE = re.compile(r"`{1,3}$|```[ \t]*[A-Za-z_]{0,%d}$" % max(map(len, SHELL_LANGUAGES)))


def bash_command(block: Block) -> str:
    """The command inside a shell block: the text between the fences, stripped."""
    return block.inner.strip()


def fence_language(block: Block) -> str:
    """The shell name of a block's opening fence, lower-cased (``"bash"`` for ```` ```Bash ````)."""
    opening = block.raw[: len(block.raw) - len(block.inner) - (len(FENCE) if block.closed else 0)]
    return opening.lstrip("`").strip().lower()


@dataclass(frozen=True, slots=True)
class ShellBlock:
    """A shell block of a whole text: the ``Block``, its index among the text's blocks (``N`` of
    the gateway's ``call_ref`` ``block:N``) and its span ``[start, end)`` in the text (Python
    string indices), the same span the gateway's verdict for it carries."""

    block: Block
    index: int
    start: int
    end: int


def shell_blocks(text: str) -> list[ShellBlock]:
    """Every shell block of ``text``, found exactly as the gateway finds them (``BashBlockParser``)."""
    parser = BashBlockParser()
    out: list[ShellBlock] = []
    pos = 0
    for piece in parser.feed(text) + parser.finish():
        size = len(piece.text) if isinstance(piece, Text) else len(piece.raw)
        if isinstance(piece, Block):
            out.append(ShellBlock(piece, len(out), pos, pos + size))
        pos += size
    return out


def _could_open(tail: str) -> bool:
    """Whether ``tail`` (text after the last backticks run) may still become an opening fence."""
    match = _MAYBE_FENCE.search(tail)
    if match is None or match.start() != 0:
        return False
    letters = match.group(0).lstrip("`").strip().lower()
    return any(lang.startswith(letters) for lang in SHELL_LANGUAGES) if letters else True


class BashBlockParser:
    """Streaming splitter of assistant content into ``Text`` and shell-block ``Block`` pieces.

    ``feed(delta)`` returns the pieces ``delta`` completes (text that might start an opening fence
    is held back until it is decided); ``finish()`` returns the rest, an unclosed block as
    ``Block(closed=False)``. Concatenating ``Text.text`` and ``Block.raw`` gives back the input.
    """

    def __init__(self) -> None:
        self._buf = ""
        self._open = ""  # the opening fence of the current block ("" outside a block)
        self._scan_from = 0

    def feed(self, delta: str) -> list[Text | Block]:
        """Consume a content delta; return the pieces it completes."""
        self._buf += delta
        out: list[Text | Block] = []
        while True:
            if self._open:
                end = self._buf.find(FENCE, self._scan_from)
                if end < 0:
                    self._scan_from = max(0, len(self._buf) - len(FENCE) + 1)
                    return out
                inner = self._buf[:end]
                out.append(Block(inner, self._open + inner + FENCE, True))
                self._buf = self._buf[end + len(FENCE):]
                self._open, self._scan_from = "", 0
                continue
            match = SHELL_FENCE.search(self._buf)
            if match is not None and match.end() < len(self._buf):
                if match.start():
                    out.append(Text(self._buf[: match.start()]))
                self._open = match.group(0)
                self._buf = self._buf[match.end():]
                self._scan_from = 0
                continue
            # no decided opening fence: emit all but a tail that may still become one
            cut = len(self._buf)
            last = self._buf.rfind("`")
            if last >= 0:
                start = last
                while start > 0 and self._buf[start - 1] == "`":
                    start -= 1
                start = max(start, last - 2)
                if _could_open(self._buf[start:]):
                    cut = start
            if match is not None:  # a fence name at the very end: wait for the next character
                cut = min(cut, match.start())
            if cut:
                out.append(Text(self._buf[:cut]))
            self._buf = self._buf[cut:]
            return out

    def finish(self) -> list[Text | Block]:
        """End of the content: what is held back, an unclosed block as ``Block(closed=False)``."""
        buf, self._buf = self._buf, ""
        if self._open:
            opening, self._open = self._open, ""
            return [Block(buf, opening + buf, False)]
        match = SHELL_FENCE.search(buf)
        if match is not None:  # "...```bash" right at the end: an (empty) unclosed block
            out: list[Text | Block] = [Text(buf[: match.start()])] if match.start() else []
            return out + [Block(buf[match.end():], buf[match.start():], False)]
        return [Text(buf)] if buf else []
