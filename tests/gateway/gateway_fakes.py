"""Fakes for gateway tests: ``FakeEngine`` (``fak.Engine``'s contract, no model) and ``FakePolicy``.

FakeEngine is a deterministic stand-in for ``fak.Engine``.

Tokens are Unicode characters (token id = code point; Qwen's three chat specials get ids above
the Unicode range), the chat template is Qwen2.5's layout (including its tool block and
``<tool_call>``/``<tool_response>`` rendering), and the reply is a pure function of the prompt:

- ``script``: ``[(trigger, reply), ...]``; the trigger found *last* in the prompt picks the reply
  (so a later turn's trigger wins in a multi-turn conversation).
- a prompt ending in the gateway's forced ``<tool_call>`` pre-fill gets a call completed (a valid
  one, or what ``forced_names`` / ``forced_arguments`` script), held to ``prefix_choices`` the
  way a constrained model is (``_constrained``);
- otherwise a pseudo-random sentence seeded by the prompt's SHA-256.

``xml_engine()`` is the same fake speaking Qwen3-Coder's XML form: its ``chat_template`` is the
Qwen3-Coder-layout test template (``tests/data/qwen3_coder_style.jinja``, rendered by
``fak.chat.ChatTemplate``, which is how the gateway tells the form), it answers ``XML_SCRIPT``,
and it completes the XML pre-fills (``<tool_call>\n``, ``<tool_call>\n<function=F>\n``) in that
form (``forced_xml_arguments`` scripts a named call's parameters).

Streaming is an async generator that yields ``chunk`` tokens per ``Delta``, sleeping ``delay``
seconds between deltas; closing it early (``aclose``) counts as a cancellation and frees the
sequence's KV blocks, like the real engine. ``stats()`` has the contract's keys.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fak import _native
from fak.errors import KVCacheFullError
from fak.sampling import SamplingParams
from litestar import Litestar, Request, Response, get, post
from litestar.response import Stream

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
BASH_TOOL = {"type": "function", "function": {
    "name": "bash", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}

SCRIPT = [
    ("weather", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
    ("two calls", 'Let me check both.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                  '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'),
    ("broken", '<tool_call>\n{"name": "get_weather", "arguments": {"city": \n</tool_call>'),
    ("unterminated", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}'),
    ("<tool_response>", "It is sunny in Paris."),
    ("clean up", 'Cleaning.\n<tool_call>\n{"name": "bash", "arguments": {"command": "rm -rf /"}}\n</tool_call>\n'
                 '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>'),
    ("list files", "I will list the files.\n```bash\nls -la\n```"),
    ("wipe disk", "Wiping now.\n```bash\nsudo shutdown -h now\n```\nDone."),
    ("never close", "Here:\n```bash\nsudo reboot"),
    ("no markers", '{"name": "get_weather", "arguments": {"city": "Lima"}}'),
    ("json answer", '{"answer": 4}'),
]


#: A chat template in Qwen3-Coder's layout (tools as <function> entries, XML calls).
XML_TEMPLATE = Path(__file__).resolve().parents[1] / "data" / "qwen3_coder_style.jinja"


def xml_call(name: str, **params: str) -> str:
    """One call in Qwen3-Coder's XML form, as its template writes it."""
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


FORECAST_TOOL = {"type": "function", "function": {
    "name": "get_forecast", "description": "Forecast of a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "hourly": {"type": "boolean"},
        "fields": {"type": "array", "items": {"type": "string"}}}, "required": ["city", "days"]}}}

XML_SCRIPT = [
    ("weather", xml_call("get_weather", city="Paris")),
    ("two calls", "Let me check both.\n" + xml_call("get_weather", city="Paris") + "\n"
                  + xml_call("get_weather", city="Rome")),
    ("forecast", "A typed call.\n" + xml_call("get_forecast", city="São Paulo", days="3", hourly="True",
                                              fields='["temp", "rain"]')),
    ("cut off", "Running.\n<tool_call>\n<function=bash>\n<parameter=command>\nrm -rf /tmp/bu"),
    ("html", xml_call("bash", command="echo '<b>a < b</b>' > out.html\ncat out.html")),
    ("<tool_response>", "It is sunny in Paris."),
    ("clean up", "Cleaning.\n" + xml_call("bash", command="rm -rf /") + "\n" + xml_call("bash", command="ls -la")),
]


def scrape(http: Any, url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``GET url/metrics`` parsed: ``{(sample name, sorted labels): value}``."""
    from prometheus_client.parser import text_string_to_metric_families

    r = http.get(url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def audit_lines(path: Any) -> list[dict[str, Any]]:
    """The JSON lines of an audit log file."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


SPECIALS = {"<|im_start|>": 0x110001, "<|im_end|>": 0x110002, "<|endoftext|>": 0x110003}
SPECIAL_TEXT = {v: k for k, v in SPECIALS.items()}
WORDS = ("alpha", "beta", "gamma", "delta", "kernel", "token", "cache", "batch", "prefill", "decode",
         "rope", "norm", "tensor", "block", "query", "value", "model", "agent", "policy", "gate")


def _offered_tools(prompt_text: str) -> dict[str, dict[str, Any]]:
    """The ``parameters`` of each tool in the fake template's ``<tools>`` block, by name, in order."""
    start, end = prompt_text.find("<tools>\n"), prompt_text.find("\n</tools>")
    tools: dict[str, dict[str, Any]] = {}
    if start >= 0 and end > start:
        for line in prompt_text[start + 8:end].splitlines():
            fn = json.loads(line).get("function", {})
            tools[fn.get("name", "")] = fn.get("parameters") or {}
    return tools


def _offered_xml_tools(prompt_text: str) -> dict[str, list[str]]:
    """The required parameters of each tool in the XML template's ``<tools>`` block, by name, in order."""
    start, end = prompt_text.find("<tools>"), prompt_text.find("</tools>")
    tools: dict[str, list[str]] = {}
    if start >= 0 and end > start:
        for entry in re.finditer(r"<function>\n<name>([^<]*)</name>.*?<required>(.*?)</required>",
                                 prompt_text[start:end], re.S):
            tools[entry.group(1)] = json.loads(entry.group(2))
    return tools


def _forced_xml_params(required: list[str]) -> str:
    """A cooperative model's parameters in a forced XML call: ``forced`` for each required one."""
    return "".join(f"<parameter={p}>\nforced\n</parameter>\n" for p in required)


def _forced_args(parameters: dict[str, Any] | None) -> str:
    """Arguments a cooperative model writes for a forced call: ``"forced"`` for each required
    property, else ``{"forced": true}``."""
    required = (parameters or {}).get("required") or []
    return json.dumps({p: "forced" for p in required} if required else {"forced": True})


@dataclass
class Delta:
    """``fak.Engine`` stream delta: new text, its token ids, finish reason, per-token logprobs."""

    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    logprobs: list[tuple[int, float, list[tuple[int, float]]]] | None = None
    stop_reason: str | None = None  # the stop string that ended the reply (``fak.Engine``'s)
    cached_tokens: int | None = None  # the first delta: prompt tokens the prefix cache held


@dataclass
class FakeEngine:
    """See the module docstring. ``requests`` records ``(prompt_ids, sampling)`` of each stream."""

    script: list[tuple[str, str]] = field(default_factory=list)
    n_ctx: int = 4096
    delay: float = 0.0
    chunk: int = 1
    kv_block_size: int = 16
    kv_blocks_total: int = 4096
    model_name: str = "fake-qwen"
    backend: str = "cpu"
    n_vocab: int = 0x110004
    running: int = 0
    kv_blocks_used: int = 0
    cancelled: int = 0
    finished: int = 0
    requests: list[tuple[list[int], dict[str, Any]]] = field(default_factory=list)
    #: under tool_choice "required": (trigger, name) the fake would write after the pre-fill,
    #: offered or not (a small model naming a tool after a word of the prompt)
    forced_names: list[tuple[str, str]] = field(default_factory=lambda: [("haiku", "autumn")])
    #: under a named tool_choice: (trigger, text after `"arguments":`)
    forced_arguments: list[tuple[str, str]] = field(default_factory=lambda: [
        ("a number please", " 1}\n</tool_call>"), ("no city", ' {"town": "Oslo"}}\n</tool_call>')])
    #: under a named tool_choice in the XML form: (trigger, text after `<function=F>\n`)
    forced_xml_arguments: list[tuple[str, str]] = field(default_factory=lambda: [
        ("no city", "<parameter=town>\nOslo\n</parameter>\n</function>\n</tool_call>"),
        ("a number please", "1\n</function>\n</tool_call>")])
    #: whether ``prefix_choices`` hold (False: a fake of an engine that ignores them)
    honor_choices: bool = True
    #: a ``fak.chat.ChatTemplate`` rendering the prompts instead of the built-in Qwen2.5 layout
    #: (the gateway reads its ``source`` to tell the model's tool-call form)
    chat_template: Any = None

    # -- tokenizer

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        ids: list[int] = []
        i = 0
        while i < len(text):
            if parse_special and text[i] == "<":
                for name, tid in SPECIALS.items():
                    if text.startswith(name, i):
                        ids.append(tid)
                        i += len(name)
                        break
                else:
                    ids.append(ord(text[i]))
                    i += 1
            else:
                ids.append(ord(text[i]))
                i += 1
        return ids

    def detokenize(self, ids: list[int]) -> str:
        return "".join(SPECIAL_TEXT.get(i, chr(i) if i < 0x110000 else "") for i in ids)

    def token_bytes(self, token_id: int) -> bytes:
        return (SPECIAL_TEXT.get(token_id) or chr(token_id)).encode("utf-8", "surrogatepass")

    # -- chat template (Qwen2.5 layout)

    def apply_chat_template(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                            add_generation_prompt: bool = True, **kwargs: Any) -> str:
        if self.chat_template is not None:
            return self.chat_template.render(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                             **kwargs)
        out = []
        msgs = list(messages)
        if tools:
            system = msgs.pop(0)["content"] if msgs and msgs[0]["role"] == "system" else "You are a helpful assistant."
            block = "\n".join(json.dumps(t, sort_keys=True) for t in tools)
            out.append(f"<|im_start|>system\n{system}\n\n# Tools\n\n<tools>\n{block}\n</tools>\n\n"
                       "For each function call, return a json object with function name and arguments within "
                       "<tool_call></tool_call> XML tags<|im_end|>\n")
        for m in msgs:
            if m["role"] == "tool":
                out.append(f"<|im_start|>user\n<tool_response>\n{m['content']}\n</tool_response><|im_end|>\n")
            elif m["role"] == "assistant" and m.get("tool_calls"):
                calls = "".join(
                    "\n<tool_call>\n" + json.dumps({"name": c["function"]["name"],
                                                    "arguments": c["function"]["arguments"]}) + "\n</tool_call>"
                    for c in m["tool_calls"])
                out.append(f"<|im_start|>assistant\n{m['content']}{calls}<|im_end|>\n")
            else:
                if m["role"] not in ("system", "user", "assistant"):
                    raise ValueError(f"unknown role {m['role']}")
                out.append(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n")
        if add_generation_prompt:
            out.append("<|im_start|>assistant\n")
        return "".join(out)

    # -- generation

    def _xml_reply(self, prompt_text: str) -> str | None:
        """The completion of the XML form's forced pre-fill, or ``None`` for another prompt."""
        named = re.search(r"<tool_call>\n<function=([^>\n]*)>\n$", prompt_text)
        if named is not None:
            for trigger, reply in self.forced_xml_arguments:
                if trigger in prompt_text:
                    return reply
            required = _offered_xml_tools(prompt_text).get(named.group(1), [])
            return _forced_xml_params(required) + "</function>\n</tool_call>"
        if prompt_text.endswith("<|im_start|>assistant\n<tool_call>\n"):
            for trigger, name in self.forced_names:
                if trigger in prompt_text:
                    return f"<function={name}>\n</function>\n</tool_call>"
            tools = _offered_xml_tools(prompt_text)
            name = next(iter(tools), "unknown")
            return f"<function={name}>\n" + _forced_xml_params(tools.get(name, [])) + "</function>\n</tool_call>"
        return None

    def reply_for(self, prompt_text: str) -> str:
        """The full reply this engine gives to ``prompt_text`` (before stop strings/max_tokens)."""
        if (xml := self._xml_reply(prompt_text)) is not None:
            return xml
        if prompt_text.endswith('<tool_call>\n{"name": "'):
            for trigger, name in self.forced_names:
                if trigger in prompt_text:
                    return name + '", "arguments": {}}\n</tool_call>'
            tools = _offered_tools(prompt_text)
            name = next(iter(tools), "unknown")
            return name + '", "arguments": ' + _forced_args(tools.get(name)) + '}\n</tool_call>'
        if prompt_text.endswith('"arguments":'):
            for trigger, reply in self.forced_arguments:
                if trigger in prompt_text:
                    return reply
            name = prompt_text[prompt_text.rfind('{"name": "') + 10:].split('"', 1)[0]
            return " " + _forced_args(_offered_tools(prompt_text).get(name)) + "}\n</tool_call>"
        best, best_pos = None, -1
        for trigger, reply in self.script:
            pos = prompt_text.rfind(trigger)
            if pos > best_pos:
                best, best_pos = reply, pos
        if best is not None:
            return best
        digest = hashlib.sha256(prompt_text.encode()).digest()
        n = 6 + digest[0] % 10
        return " ".join(WORDS[b % len(WORDS)] for b in digest[1:1 + n]).capitalize() + "."

    def _check(self, ids: list[int], sampling: dict[str, Any]) -> None:
        """``fak.Engine``'s checks, with its typed errors: the sampling keywords
        (``SamplingParams``: kinds, ranges, stop strings), then the core's rules (token ids, the
        context window: ``fak._native.RequestLimits``, as ``fak.Engine._prepare``)."""
        params = SamplingParams.from_kwargs(**{k: v for k, v in sampling.items() if k not in ("resident_prefix", "conversation")})
        limits = _native.RequestLimits(self.n_ctx, self.n_vocab, self.kv_blocks_total, self.kv_block_size)
        limits.check(ids, {**params.to_native(), "max_tokens": params.max_tokens})

    @staticmethod
    def _constrained(text: str, choices: list[str]) -> str:
        """What a model held to ``prefix_choices`` writes: its own reply when that begins with a
        choice; else the first choice opening empty arguments (``{}``), then closing the call."""
        if any(text.startswith(c) for c in choices):
            return text
        empty = next((c for c in choices if c.endswith(("{}", "</function>"))), choices[0])
        return empty + ("\n</tool_call>" if empty.endswith("</function>") else "}\n</tool_call>")

    def _blocks(self, n_tokens: int) -> int:
        return math.ceil(n_tokens / self.kv_block_size)

    async def astream(self, prompt: str | list[int], **sampling: Any) -> AsyncIterator[Delta]:
        """Stream the reply; ``aclose()`` before the end cancels (frees KV blocks)."""
        ids = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        self._check(ids, sampling)
        cached = self._cached(ids)
        self.requests.append((ids, dict(sampling)))
        max_tokens = int(sampling.get("max_tokens") or (self.n_ctx - len(ids)))
        text = self.reply_for(self.detokenize(ids))
        if sampling.get("prefix_choices") and self.honor_choices:
            text = self._constrained(text, [self.detokenize(c) for c in sampling["prefix_choices"]])
        finish = "stop"
        stop_reason = None
        stops = sampling.get("stop") or []
        for s in [stops] if isinstance(stops, str) else stops:
            cut = text.find(s)
            if cut >= 0:
                text, stop_reason = text[:cut], s
        if len(text) > max_tokens:
            text, finish, stop_reason = text[:max_tokens], "length", None
        n_lp = sampling.get("logprobs")
        blocks = self._blocks(len(ids) + 1)
        if self.kv_blocks_used + blocks > self.kv_blocks_total:
            raise KVCacheFullError(f"need {blocks} blocks, {self.kv_blocks_total - self.kv_blocks_used} free")
        self.running += 1
        self.kv_blocks_used += blocks
        done = False
        try:
            await asyncio.sleep(self.delay)
            pos = 0
            while pos < len(text) or not done:
                piece = text[pos: pos + self.chunk]
                pos += len(piece)
                grow = self._blocks(len(ids) + pos + 1) - blocks
                if grow > 0:
                    self.kv_blocks_used += grow
                    blocks += grow
                last = pos >= len(text)
                token_ids = [ord(c) for c in piece]
                lps = None
                if n_lp is not None:
                    lps = [(t, -0.25, [(t, -0.25), (ord("x"), -2.0)][: max(n_lp, 0)]) for t in token_ids]
                done = last
                yield Delta(piece, token_ids, finish if last else None, lps, stop_reason if last else None,
                            cached if pos == len(piece) else None)
                if not last:
                    await asyncio.sleep(self.delay)
            self.finished += 1
        finally:
            if not done:
                self.cancelled += 1
            self.running -= 1
            self.kv_blocks_used -= blocks

    def _cached(self, ids: list[int]) -> int:
        """A prefix cache of whole ``kv_block_size`` blocks: the longest prefix shared with an
        earlier prompt, in whole blocks, leaving one token to compute (as the engine's)."""
        best = 0
        for earlier, _ in self.requests:
            n = 0
            for a, b in zip(earlier, ids):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        best = min(best, len(ids) - 1)
        return best - best % self.kv_block_size

    def stats(self) -> dict[str, Any]:
        return {"running": self.running, "waiting": 0, "kv_blocks_used": self.kv_blocks_used,
                "kv_blocks_total": self.kv_blocks_total}


#: Qwen3's chat template as fak's synthetic qwen3 models carry it (thinking, Hermes JSON calls).
QWEN3_TEMPLATE = Path(__file__).resolve().parents[2] / "python" / "fak" / "synth" / "templates" / "qwen3.jinja"

THINK_SCRIPT = [
    ("weather", "<think>\nThe user wants the weather.\nI will call the tool.\n</think>\n\n"
                '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
    ("<tool_response>", "<think>\nThe tool answered.\n</think>\n\nIt is sunny in Paris."),
    ("haiku", "<think>\nA haiku has three lines.\n</think>\n\nLeaves fall.\nRed and gold.\nAutumn."),
    ("cut", "<think>\nThis goes on and on"),
]


def thinking_engine(**kwargs: Any) -> FakeEngine:
    """A ``FakeEngine`` whose chat template is Qwen3's (it has thinking), answering
    ``THINK_SCRIPT`` (``<think>`` reasoning, then the answer or a call)."""
    from fak.chat import ChatTemplate

    kwargs.setdefault("script", list(THINK_SCRIPT))
    return FakeEngine(chat_template=ChatTemplate(QWEN3_TEMPLATE.read_text(encoding="utf-8")), **kwargs)


def xml_engine(**kwargs: Any) -> FakeEngine:
    """A ``FakeEngine`` speaking Qwen3-Coder's XML form (see the module doc); ``kwargs`` as
    ``FakeEngine`` takes them (``script`` defaults to ``XML_SCRIPT``)."""
    from fak.chat import ChatTemplate

    kwargs.setdefault("script", list(XML_SCRIPT))
    return FakeEngine(chat_template=ChatTemplate(XML_TEMPLATE.read_text(encoding="utf-8")), **kwargs)


# ------------------------------------------------------------------------------------- policy


@dataclass(frozen=True)
class FakeVerdict:
    """``fak.policy.Verdict`` shape."""

    allowed: bool
    reason: str
    rule: str | None


@dataclass
class FakePolicy:
    """A minimal policy with ``fak.policy.Policy.decide``'s signature.

    Denies: any tool named in ``deny_tools``; ``bash`` commands containing any of ``deny_words``;
    calls beyond ``budget`` per conversation. Records every ``(tool, arguments, conversation,
    workspace_root)`` it was asked about.
    """

    deny_tools: tuple[str, ...] = ("delete_file",)
    deny_words: tuple[str, ...] = ("rm -rf", "sudo")
    budget: int | None = None
    calls: list[tuple[str, Any, str, str | None]] = field(default_factory=list)

    def decide(self, tool: str, arguments: Any, *, conversation: str = "",
               workspace_root: str | None = None) -> FakeVerdict:
        self.calls.append((tool, arguments, conversation, workspace_root))
        if tool in self.deny_tools:
            return FakeVerdict(False, f"tool {tool} is not allowed", f"tools.{tool}")
        if tool == "bash":
            args = json.loads(arguments) if isinstance(arguments, str) else arguments
            command = str(args.get("command", ""))
            for word in self.deny_words:
                if word in command:
                    return FakeVerdict(False, f"command matches deny pattern {word!r}", "bash.command.deny")
        if self.budget is not None:
            used = sum(1 for c in self.calls if c[2] == conversation)
            if used > self.budget:
                return FakeVerdict(False, f"call budget of {self.budget} exhausted", "budget")
        return FakeVerdict(True, "allowed", None)


@dataclass
class FakeAudit:
    """``fak.policy.AuditLog.record`` writing JSON lines to ``path``."""

    path: Any

    def record(self, *, conversation: str, tool: str, arguments: Any, verdict: Any) -> None:
        line = {"conversation": conversation, "tool": tool,
                "arguments_sha256": hashlib.sha256(
                    (arguments if isinstance(arguments, str) else json.dumps(arguments, sort_keys=True)).encode()
                ).hexdigest(),
                "allowed": verdict.allowed, "reason": verdict.reason, "rule": verdict.rule}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")


# ------------------------------------------------------------------------------------ upstream


@dataclass
class UpstreamReply:
    """What the fake upstream answers: content and ``(name, arguments)`` tool calls."""

    content: str | None = None
    tool_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


@dataclass
class FakeUpstream:
    """An OpenAI-compatible server emitting scripted content and tool calls (vLLM's stream style).

    ``script`` maps a trigger found in the last message to a reply. Streams send content in
    3-character deltas, each tool call as a header delta (index, id, type, name, ``""``) then
    4-character argument pieces, then a finish chunk, an optional usage chunk and ``[DONE]``.
    ``omit_index`` drops ``index`` from tool-call deltas (some servers do). ``seen`` records
    ``(path, headers, body)`` of every request.
    """

    script: dict[str, UpstreamReply] = field(default_factory=dict)
    omit_index: bool = False
    delay: float = 0.0
    seen: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)
    disconnects: int = 0

    def reply(self, body: dict[str, Any]) -> UpstreamReply:
        last = body["messages"][-1]["content"] if "messages" in body else body.get("prompt", "")
        for trigger, reply in self.script.items():
            if trigger in str(last):
                return reply
        return UpstreamReply(content="Upstream says hi.")

    def app(self) -> Any:
        fake = self

        @get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": "up-model", "object": "model", "created": 0, "owned_by": "up"}]}

        @get("/v1/models/{model_id:str}")
        async def model(request: Request) -> Response[Any]:
            if request.path_params["model_id"] != "up-model":
                return Response({"error": {"message": "no such model", "type": "invalid_request_error",
                                           "param": "model", "code": "model_not_found"}}, status_code=404)
            return Response({"id": "up-model", "object": "model", "created": 0, "owned_by": "up"})

        @post("/v1/chat/completions", status_code=200)
        async def chat(request: Request) -> Response[Any]:
            raw = await request.body()
            fake.seen.append(("/v1/chat/completions", dict(request.headers), raw))
            body = json.loads(raw)
            if body["model"] == "garbage" and body.get("stream"):
                async def garbage() -> Any:
                    yield b'data: {"choices": [{"index": "x", "delta": {"tool_calls": [5, {"index": "a"}]}}]}\n\n'
                    yield b"data: not json\n\n"
                    yield b'data: {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1", '
                    yield b'"function": {"name": "bash", "arguments": "{\\"command\\": \\"ls\\"}"}}]}}]}\n\n'
                    yield b'data: {"choices": "nope"}\n\n'
                    yield b'data: {"choices": [{"index": {}, "delta": {}, "finish_reason": "tool_calls"}]}\n\n'
                    yield b"data: [DONE]\n\n"
                return Stream(garbage(), media_type="text/event-stream")
            if body["model"] == "garbage":
                return Response({"choices": [{"index": 0, "message": {"role": "assistant", "tool_calls": "nope"}},
                                             7, {"message": None}]})
            if body["model"] == "missing":
                return Response({"error": {"message": "no such model", "type": "invalid_request_error",
                                           "param": "model", "code": "model_not_found"}}, status_code=404)
            rep = fake.reply(body)
            calls = [{"id": f"call_up{i}", "type": "function",
                      "function": {"name": n, "arguments": json.dumps(a)}} for i, (n, a) in enumerate(rep.tool_calls)]
            finish = "tool_calls" if calls else "stop"
            if not body.get("stream"):
                msg: dict[str, Any] = {"role": "assistant", "content": rep.content}
                if calls:
                    msg["tool_calls"] = calls
                return Response({"id": "chatcmpl-up", "object": "chat.completion", "created": 1, "model": "up-model",
                                 "choices": [{"index": 0, "message": msg, "logprobs": None, "finish_reason": finish}],
                                 "usage": {"prompt_tokens": 7, "completion_tokens": 9, "total_tokens": 16}})
            usage = bool((body.get("stream_options") or {}).get("include_usage"))

            def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
                c: dict[str, Any] = {"id": "chatcmpl-up", "object": "chat.completion.chunk", "created": 1,
                                     "model": "up-model", "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                                       "finish_reason": finish_reason}]}
                if usage:
                    c["usage"] = None
                return b"data: " + json.dumps(c).encode() + b"\n\n"

            async def events() -> Any:
                try:
                    yield chunk({"role": "assistant", "content": ""})
                    text = rep.content or ""
                    for i in range(0, len(text), 3):
                        await asyncio.sleep(fake.delay)
                        yield chunk({"content": text[i:i + 3]})
                    for i, call in enumerate(calls):
                        head: dict[str, Any] = {"index": i, "id": call["id"], "type": "function",
                                                "function": {"name": call["function"]["name"], "arguments": ""}}
                        if fake.omit_index:
                            head.pop("index")
                        yield chunk({"tool_calls": [head]})
                        args = call["function"]["arguments"]
                        for j in range(0, len(args), 4):
                            await asyncio.sleep(fake.delay)
                            piece: dict[str, Any] = {"index": i, "function": {"arguments": args[j:j + 4]}}
                            if fake.omit_index:
                                piece.pop("index")
                            yield chunk({"tool_calls": [piece]})
                    yield chunk({}, finish)
                    if usage:
                        yield b"data: " + json.dumps({"id": "chatcmpl-up", "object": "chat.completion.chunk",
                                                      "created": 1, "model": "up-model", "choices": [],
                                                      "usage": {"prompt_tokens": 7, "completion_tokens": 9,
                                                                "total_tokens": 16}}).encode() + b"\n\n"
                    yield b"data: [DONE]\n\n"
                except BaseException:
                    fake.disconnects += 1
                    raise

            return Stream(events(), media_type="text/event-stream")

        @post("/v1/completions", status_code=200)
        async def completions(request: Request) -> Response[Any]:
            raw = await request.body()
            fake.seen.append(("/v1/completions", dict(request.headers), raw))
            body = json.loads(raw)
            rep = fake.reply(body)
            return Response({"id": "cmpl-up", "object": "text_completion", "created": 1, "model": "up-model",
                             "choices": [{"index": 0, "text": rep.content, "logprobs": None, "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}})

        return Litestar([models, model, chat, completions])
