"""Repeated read-only tool calls served inline (``fak serve --serve-inline-reads``).

When the model proposes a call that is read-only and identical (same name, same canonical
arguments) to one already answered in the same conversation, and no call since could have
changed its result, the gateway answers it itself with the earlier result and lets the model
continue: the client gets only the first new call. The pairs served inline are listed in the
response's ``fak`` extension object, ``{"inline_reads": [{"assistant": {...}, "tool": {...},
"served_from": <earlier tool_call_id>, "arguments_digest", "content_digest"}]}``, as the two
messages (assistant tool call, tool result) the client appends to its history before the
returned assistant message, so that its next request is the prompt the model actually saw (the
prefix cache then reuses all of it).

What counts:

- *conversation*: the ``X-Fak-Conversation`` header (required: without it nothing is served).
  The gateway keeps the full text of each tool result the first time a request carries it,
  per conversation (LRU): clients may shorten old observations later, and a later copy that is
  the fleet agent's middle cut of the kept text (``fak.agent.tools.truncate_middle``) is served
  in full. Any other change of a result replaces the kept text, so the model is never served
  something the client no longer sends (a quarantine's replacement included).
- *read-only*: as the policy judges a call of the request's tools
  (:class:`fak.policy.readonly.ReadTools`, from the offered tools' names and schemas): a tool that
  only reads (``read``, ``list``, ``search``; ``Read``, ``Grep``, ``Glob``, ``LS``; ``read_file``,
  ``list_directory``, ...), or a shell tool (``bash``, ``Bash``, ``run_shell_command``, Codex's
  ``shell``/``exec_command``) whose command only reads (:func:`fak.policy.readonly.command_reads_only`:
  ``cat``, ``grep``, ``ls``, ``find`` without ``-delete``, ``sed``/``awk`` programs that write
  and run nothing, ``git diff``/``status``/``log``/``show``/..., no redirection that writes, no
  command known only at run time).
- *nothing since could have changed it*: every call after the earlier one (answered or not) is
  read-only; any other call (``edit``, ``write``, ``submit``, a non-read-only ``bash``, an unknown
  tool) means the read is run again by the client.
- *not a loop*: a call identical to the model's previous call (the result is the last thing it
  saw), or one whose result the conversation already holds twice since the last call that may
  have changed it, is not served: it goes to the client, whose own repeat handling (the fleet
  agent's ``--on-repeat``) answers loops, and the response's ``fak`` object says
  ``"inline_stopped": "repeat"``. Serving such calls fed greedy decoding's loops: on the GPU
  fleet run of 2026-12-06 the 1.5B re-asked for the read it had just been served until its
  context was full (880 reads served inline, 12 of 14 agents out of context;
  ``benches/results/fleet.md``).
- the call is still adjudicated by the policy (its verdict is in the pair's ``verdict``) and a
  denied call is never served; at most ``max_inline`` pairs per response (then the call goes to
  the client as usual); non-streamed chat completions only.
- *it fits*: a result is served only when the conversation with it still leaves the completion
  its room by the request's own rule (``max_tokens`` / ``max_completion_tokens``, else the rest of
  the window). Otherwise the call goes to the client, which runs it and can cut its output to fit
  (the response's ``fak`` object then says ``"inline_stopped": "context_length"``), instead of the
  whole request failing with a context-length error.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from fak.gateway.errors import APIError
from fak.policy.readonly import ReadTools
from fak.quarantine.screen import content_digest
from fak.toolcalls.wire import arguments_digest

__all__ = ["InlineReads"]

def _tool_calls(messages: Iterable[dict[str, Any]]) -> Iterable[tuple[Any, str, str]]:
    """``(id, name, arguments as JSON text)`` of every assistant tool call in ``messages``, in
    order (template dicts: arguments may be decoded objects)."""
    for m in messages:
        for tc in m.get("tool_calls") or () if m.get("role") == "assistant" else ():
            fn = tc.get("function") or {}
            args = fn.get("arguments", "")
            text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            yield tc.get("id"), str(fn.get("name", "")), text


#: the line ``fak.agent.tools.truncate_middle`` puts where it cut the middle of a text
_CUT = re.compile(r"\n\.\.\. \[(\d+) characters cut\] \.\.\.\n")


def _is_cut_of(text: str, full: str) -> bool:
    """Whether ``text`` is ``full`` with its middle cut by ``truncate_middle``."""
    m = _CUT.search(text)
    if m is None:
        return False
    head, tail = text[: m.start()], text[m.end():]
    return (full.startswith(head) and full.endswith(tail)
            and len(full) - len(head) - len(tail) == int(m.group(1)))


@dataclass
class _Conversation:
    results: dict[str, str] = field(default_factory=dict)
    n_bytes: int = 0


class InlineReads:
    """The inline-read server of one gateway.

    Args:
        max_inline: most pairs served in one response.
        conversations: conversations whose tool results are kept (LRU).
        max_bytes: most bytes of results kept per conversation (older ones are then not kept:
            those calls are not served inline).
    """

    def __init__(self, *, max_inline: int = 3, conversations: int = 256, max_bytes: int = 8 << 20) -> None:
        self.max_inline = max_inline
        self.max_bytes = max_bytes
        self.conversations = conversations
        self._store: OrderedDict[str, _Conversation] = OrderedDict()
        self._lock = threading.Lock()
        self.served = 0
        #: Calls not served because the result would not fit the context window with the
        #: completion's room (they went to the client).
        self.refused_context = 0
        #: Calls not served because they repeat the previous call, or a result the conversation
        #: already holds twice (:meth:`is_loop`; they went to the client).
        self.refused_repeat = 0

    def remember(self, conversation: str, messages: Iterable[dict[str, Any]]) -> None:
        """Keep the text of each tool result the first time the conversation carries it; a
        changed copy that is not a middle cut of the kept text replaces it."""
        with self._lock:
            conv = self._store.get(conversation)
            if conv is None:
                conv = self._store[conversation] = _Conversation()
            self._store.move_to_end(conversation)
            while len(self._store) > self.conversations:
                self._store.popitem(last=False)
            for m in messages:
                tid = m.get("tool_call_id")
                content = m.get("content")
                if m.get("role") != "tool" or not tid or not isinstance(content, str):
                    continue
                kept = conv.results.get(tid)
                if kept is not None:
                    if content == kept or _is_cut_of(content, kept):
                        continue
                    del conv.results[tid]  # the client's copy changed: keep the new one
                    conv.n_bytes -= len(kept)
                if conv.n_bytes + len(content) <= self.max_bytes:
                    conv.results[tid] = content
                    conv.n_bytes += len(content)

    def find(self, conversation: str, messages: list[dict[str, Any]], name: str,
             arguments: str, tools: ReadTools | None = None) -> tuple[str, str] | None:
        """``(earlier tool_call_id, its result)`` when the call ``name(arguments)`` can be served
        from ``messages`` (the conversation so far, template dicts), else ``None``. ``tools``:
        the request's tools (``None``: calls are judged by their names and arguments alone)."""
        reads = tools or ReadTools()
        if not reads.reads_only(name, arguments):
            return None
        want = arguments_digest(arguments)
        answers = {m.get("tool_call_id"): m.get("content") for m in messages if m.get("role") == "tool"}
        found: str | None = None
        for cid, cname, cargs in _tool_calls(messages):
            if not reads.reads_only(cname, cargs):
                found = None  # a call that may have changed the workspace: earlier reads are stale
            elif cname == name and arguments_digest(cargs) == want and cid in answers:
                found = cid
        if found is None:
            return None
        with self._lock:
            conv = self._store.get(conversation)
            full = conv.results.get(found) if conv is not None else None
        content = full if full is not None else answers.get(found)
        return (found, content) if isinstance(content, str) else None

    @staticmethod
    def is_loop(messages: list[dict[str, Any]], name: str, arguments: str, tools: ReadTools | None = None) -> bool:
        """Whether the call ``name(arguments)`` repeats the conversation's last call, or a read
        answered at least twice since the last call that may have changed the workspace: serving
        it would feed a loop rather than save a round trip. ``tools`` as in :meth:`find`."""
        reads = tools or ReadTools()
        want = (name, arguments_digest(arguments))
        last: tuple[str, str] | None = None
        same = 0
        for _, cname, cargs in _tool_calls(messages):
            last = (cname, arguments_digest(cargs))
            if not reads.reads_only(cname, cargs):
                same = 0
            elif last == want:
                same += 1
        return last == want or same >= 2

    async def serve(self, serving: Any, body: bytes, *, req: Any, conversation: str | None,
                    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, prefix: str, gate: Any,
                    n_verdicts_before: int, start_run: Any) -> bytes:
        """Continue a finished non-streamed response while its first call can be served inline.

        ``body``: the encoded ``ChatCompletion``; ``start_run(messages)``: an async callable that
        renders, starts and completes a new generation for ``messages`` and returns its encoded
        body. Returns the body for the client (``fak.inline_reads`` added when anything was served).
        """
        if not conversation:
            return body
        self.remember(conversation, messages)
        reads = ReadTools.from_openai(tools)
        pairs: list[dict[str, Any]] = []
        convo = list(messages)
        usage = [0, 0]
        first_verdict = n_verdicts_before
        stopped: str | None = None
        while len(pairs) < self.max_inline:
            data = json.loads(body)
            choice = (data.get("choices") or [{}])[0]
            msg = choice.get("message") or {}
            calls = msg.get("tool_calls") or []
            if not calls:
                break
            call = calls[0]
            fn = call["function"]
            hit = self.find(conversation, convo, fn["name"], fn["arguments"], reads)
            if hit is None:
                break
            earlier, content = hit
            verdict = next((v for v in gate.verdicts[first_verdict:]
                            if v.tool_call_id == call["id"]), None) if gate.active else None
            if gate.active and (verdict is None or not verdict.allowed):
                break
            if self.is_loop(convo, fn["name"], fn["arguments"], reads):
                with self._lock:
                    self.refused_repeat += 1
                stopped = "repeat"
                break
            assistant = {"role": "assistant", "content": msg.get("content"),
                         "tool_calls": [{"id": call["id"], "type": "function",
                                         "function": {"name": fn["name"], "arguments": fn["arguments"]}}]}
            tool = {"role": "tool", "tool_call_id": call["id"], "content": content}
            pairs.append({"assistant": assistant, "tool": tool, "served_from": earlier,
                          "arguments_digest": arguments_digest(fn["arguments"]),
                          "content_digest": content_digest(content),
                          "verdict": msgspec.to_builtins(verdict) if verdict is not None else None})
            u = data.get("usage") or {}
            usage[0] += int(u.get("prompt_tokens") or 0)
            usage[1] += int(u.get("completion_tokens") or 0)
            # what the chat template gets (``template_messages``'s form): text content, decoded arguments
            try:
                targs: Any = json.loads(fn["arguments"])
            except (ValueError, RecursionError):
                targs = fn["arguments"]
            convo += [{"role": "assistant", "content": msg.get("content") or "",
                       "tool_calls": [{"id": call["id"], "type": "function",
                                       "function": {"name": fn["name"], "arguments": targs}}]},
                      {"role": "tool", "tool_call_id": call["id"], "content": content}]
            with self._lock:
                self.served += 1
            before = (body, list(usage), first_verdict)
            first_verdict = len(gate.verdicts)
            try:
                body = await start_run(convo)
            except APIError as err:
                if err.code != "context_length_exceeded":
                    raise
                # The served result would not leave the completion its room in the context
                # window (the request's own max_tokens rule): the client gets the call instead
                # and runs it itself (its agent can cut the output to fit); nothing was served.
                pairs.pop()
                body, usage, first_verdict = before
                with self._lock:
                    self.served -= 1
                    self.refused_context += 1
                stopped = "context_length"
                break
        if not pairs:
            if stopped is None:
                return body
            data = json.loads(body)
            data["fak"] = {"inline_reads": [], "inline_stopped": stopped, "served_at": round(time.time(), 3)}
            return json.dumps(data, ensure_ascii=False).encode()
        data = json.loads(body)
        msg = data["choices"][0]["message"]
        if msg.get("tool_calls"):
            msg["tool_calls"] = msg["tool_calls"][:1]  # only the first new call goes to the client
        u = data.get("usage") or {}
        data["usage"] = {"prompt_tokens": usage[0] + int(u.get("prompt_tokens") or 0),
                         "completion_tokens": usage[1] + int(u.get("completion_tokens") or 0),
                         "total_tokens": usage[0] + usage[1] + int(u.get("total_tokens") or 0)}
        if gate.active and isinstance(data.get("fak_policy"), dict):
            data["fak_policy"]["verdicts"] = [msgspec.to_builtins(v) for v in gate.verdicts[first_verdict:]]
        data["fak"] = {"inline_reads": pairs, "served_at": round(time.time(), 3)}
        if stopped is not None:
            data["fak"]["inline_stopped"] = stopped
        return json.dumps(data, ensure_ascii=False).encode()
