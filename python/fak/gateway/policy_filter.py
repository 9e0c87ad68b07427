"""Adjudicate every tool call before a response leaves the gateway.

``PolicyGate`` asks the policy (``fak.policy.Policy.decide``) about one proposed call, appends the
decision to the audit log and counts it in the metrics. A denied call is never sent: the client
gets a note in the message content instead (``denial_note``), and the ``fak_policy`` extension
object lists every verdict of the response. A policy that raises fails closed (deny).

``AssistantOutputFilter`` is the engine-mode pipeline from generated text to what the client
sees: ``<tool_call>`` blocks in the model's form (Qwen2.5's JSON or Qwen3-Coder's XML,
``toolcalls.ToolCallFormat``) → tool calls (``toolcalls``), fenced ```bash blocks →
``bash`` calls for text-protocol agents (``text_tools``), each adjudicated by the gate. Proxy mode
(``proxy``) uses the gate and the text-tool parser on the upstream's structured output.

Conversation and workspace (request headers, see ``docs/gateway.md``):
``X-Fak-Conversation`` (else the request's ``user``, else a hash of the first messages) keys the
policy's per-conversation call budgets; ``X-Fak-Workspace`` (an absolute path) is the root for
path scopes, else the policy file's own.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from fak.gateway.errors import bad_request
from fak.toolcalls import (
    Qwen3XmlParser,
    BashBlockParser,
    Block,
    CallProblem,
    ParsedToolCall,
    RejectedCall,
    Text,
    ToolCallFormat,
    ToolCallParser,
    ToolSet,
    bash_command,
    block_ref,
)
from fak.toolcalls.wire import PolicyVerdictInfo, arguments_digest

log = logging.getLogger("fak.gateway.policy")

__all__ = [
    "CONVERSATION_HEADER",
    "TEXT_TOOLS_HEADER",
    "WORKSPACE_HEADER",
    "AssistantOutputFilter",
    "AuditLike",
    "ContentOut",
    "PolicyGate",
    "PolicyLike",
    "RequestContext",
    "ToolCallOut",
    "denial_note",
    "merge_content",
    "parse_text_tools_header",
    "request_context",
]

CONVERSATION_HEADER = "x-fak-conversation"
WORKSPACE_HEADER = "x-fak-workspace"
TEXT_TOOLS_HEADER = "x-fak-text-tools"
SUPPORTED_TEXT_TOOLS = frozenset({"bash"})


def parse_text_tools_header(value: str | None) -> frozenset[str]:
    """The tools named by ``X-Fak-Text-Tools`` (comma-separated; only ``bash`` exists).

    Raises:
        APIError: 400 for an unknown tool name.
    """
    if value is None:
        return frozenset()
    names = frozenset(part.strip().lower() for part in value.split(",") if part.strip())
    unknown = names - SUPPORTED_TEXT_TOOLS
    if unknown:
        raise bad_request(f"X-Fak-Text-Tools names unknown text tool(s) {sorted(unknown)}; "
                          f"supported: {sorted(SUPPORTED_TEXT_TOOLS)}", param="X-Fak-Text-Tools")
    return names


class PolicyLike(Protocol):
    """What the gateway needs of ``fak.policy.Policy``."""

    def decide(self, tool: str, arguments: Any, *, conversation: str = "",
               workspace_root: str | None = None) -> Any: ...


class AuditLike(Protocol):
    """What the gateway needs of ``fak.policy.AuditLog``."""

    def record(self, *, conversation: str, tool: str, arguments: Any, verdict: Any) -> Any: ...


@dataclass(frozen=True, slots=True)
class RequestContext:
    """Per-request policy context: conversation key, workspace root, text tools enabled."""

    conversation: str
    workspace_root: str | None = None
    text_tools: frozenset[str] = frozenset()


def _conversation_hash(first_messages: list[Any]) -> str:
    blob = json.dumps(first_messages, sort_keys=True, ensure_ascii=False, default=str)
    return "h-" + hashlib.sha256(blob.encode()).hexdigest()[:16]


def request_context(headers: Mapping[str, str], *, user: str | None,
                    first_messages: list[Any]) -> RequestContext:
    """Build the policy context of a request from its headers, ``user`` and first messages.

    Args:
        headers: request headers (case-insensitive mapping).
        user: the request's ``user`` field.
        first_messages: JSON-able form of the first one or two messages (system + first user),
            hashed into the conversation key when neither header nor ``user`` is given.

    Raises:
        APIError: 400 for a relative ``X-Fak-Workspace`` or an unknown ``X-Fak-Text-Tools`` value.
    """
    conversation = headers.get(CONVERSATION_HEADER) or user or _conversation_hash(first_messages)
    workspace = headers.get(WORKSPACE_HEADER)
    if workspace is not None:
        if not os.path.isabs(workspace):
            raise bad_request(f"X-Fak-Workspace must be an absolute path, got {workspace!r}",
                              param="X-Fak-Workspace")
    text_tools = parse_text_tools_header(headers.get(TEXT_TOOLS_HEADER))
    return RequestContext(conversation=conversation, workspace_root=workspace, text_tools=text_tools)


def denial_note(tool: str, reason: str, rule: str | None) -> str:
    """The text a client sees in place of a denied call: which tool, why, which rule."""
    where = f" (rule: {rule})" if rule else ""
    return f"[fak policy] Tool call `{tool}` was denied: {reason}{where}."


class PolicyGate:
    """Adjudicates the tool calls of one response.

    Args:
        policy: a ``fak.policy.Policy`` (or ``None``: every call allowed, nothing recorded).
        audit: a ``fak.policy.AuditLog`` or ``None``.
        ctx: the request's ``RequestContext``.
        on_verdict: ``callback(tool, allowed)`` for metrics.

    ``verdicts`` collects a ``PolicyVerdictInfo`` per decision, in order.
    """

    def __init__(self, policy: PolicyLike | None, audit: AuditLike | None, ctx: RequestContext,
                 on_verdict: Any = None) -> None:
        self.policy = policy
        self.audit = audit
        self.ctx = ctx
        self.on_verdict = on_verdict
        self.verdicts: list[PolicyVerdictInfo] = []

    @property
    def active(self) -> bool:
        """Whether a policy is configured."""
        return self.policy is not None

    def decide(self, tool: str, arguments: str | dict[str, Any], *, tool_call_id: str | None = None,
               call_ref: str | None = None, span: list[int] | None = None) -> PolicyVerdictInfo | None:
        """Decide one call; ``None`` when no policy is configured (allowed, not recorded).

        ``tool_call_id``: the structured call's id (also its ``call_ref``); ``call_ref``/``span``:
        a shell block's ``block:N`` and its place in the content. A policy that raises is a deny
        (fail closed) with the error as the reason.
        """
        if self.policy is None:
            return None
        try:
            verdict = self.policy.decide(tool, arguments, conversation=self.ctx.conversation,
                                         workspace_root=self.ctx.workspace_root)
            allowed, reason, rule = bool(verdict.allowed), str(verdict.reason), verdict.rule
        except Exception as exc:
            log.exception("policy failed on tool %r; denying", tool)
            verdict = None
            allowed, reason, rule = False, f"policy error ({type(exc).__name__}: {exc})", "policy-error"
        if self.audit is not None:
            try:
                self.audit.record(conversation=self.ctx.conversation, tool=tool, arguments=arguments,
                                  verdict=verdict if verdict is not None else _FailClosed(reason, rule))
            except Exception:
                log.exception("audit log write failed")
        if self.on_verdict is not None:
            self.on_verdict(tool, allowed)
        info = PolicyVerdictInfo(tool=tool, allowed=allowed, reason=reason,
                                 rule=None if rule is None else str(rule),
                                 tool_call_id=tool_call_id if allowed else None,
                                 arguments_digest=arguments_digest(arguments),
                                 call_ref=call_ref if call_ref is not None else tool_call_id, span=span)
        self.verdicts.append(info)
        return info


@dataclass(frozen=True, slots=True)
class _FailClosed:
    """Verdict recorded when the policy itself failed."""

    reason: str
    rule: str | None
    allowed: bool = False


@dataclass(slots=True)
class ContentOut:
    """Text for the message content (may be a denial note). ``verdict`` set for notes and bash
    blocks. An event with ``rejected`` set (and empty ``text``) follows the text of a tool-call
    block that is not a call of an offered tool (``RejectedCall``: bad JSON, unknown name,
    arguments failing the schema) and says why."""

    text: str
    verdict: PolicyVerdictInfo | None = None
    rejected: CallProblem | None = None


@dataclass(slots=True)
class ToolCallOut:
    """An allowed tool call, ready to send. ``index`` counts sent calls from 0."""

    call: ParsedToolCall
    index: int
    verdict: PolicyVerdictInfo | None = None


@dataclass
class AssistantOutputFilter:
    """Generated text → content and tool calls the client may see (engine mode).

    Args:
        gate: the request's ``PolicyGate``.
        parse_tools: parse ``<tool_call>`` blocks (the request has tools and ``tool_choice``
            is not ``"none"``).
        tool_format: the form the model writes its calls in (``ToolCallFormat``: the Hermes
            JSON form, or Qwen3-Coder's XML form), from its chat template.
        prefix: assistant text already in the prompt (forced tool-call opening); never sent.
        tools: the offered tools (``ToolSet``): a call naming another tool, or whose arguments
            fail its schema, is returned as content (``ContentOut.rejected`` says why); bare-JSON
            calls of offered tools are accepted.
        parallel_tool_calls: ``False`` keeps only the first sent call.
        content_offset: characters of the message content before this output (a completion's
            ``echo``), for the spans of shell-block verdicts.
        on_reject: ``callback(CallProblem)`` for metrics.

    ``feed``/``finish`` return ``ContentOut``/``ToolCallOut`` events in order. Whitespace that
    only separates tool calls is dropped (as OpenAI returns ``content: null`` beside calls).
    ``rejected`` lists every ``CallProblem`` met.
    """

    gate: PolicyGate
    parse_tools: bool = False
    prefix: str = ""
    parallel_tool_calls: bool = True
    tools: ToolSet | None = None
    content_offset: int = 0
    on_reject: Any = None
    tool_format: ToolCallFormat = ToolCallFormat.HERMES
    rejected: list[CallProblem] = field(default_factory=list, init=False)
    #: with a forced ``prefix``: why the forced call is not a call (``None``: it is, or undecided)
    forced_error: CallProblem | None = field(default=None, init=False)
    _forced_seen: bool = field(default=False, init=False)
    _tools: ToolCallParser | Qwen3XmlParser | None = field(default=None, init=False)
    _bash: BashBlockParser | None = field(default=None, init=False)
    _held_ws: str = field(default="", init=False)
    _n_calls: int = field(default=0, init=False)
    _n_blocks: int = field(default=0, init=False)
    _content_tail: str = field(default="", init=False)
    _any_content: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if self.parse_tools:
            self._tools = ToolCallFormat(self.tool_format).parser(self.prefix, self.tools)
        if "bash" in self.gate.ctx.text_tools:
            self._bash = BashBlockParser()

    @property
    def n_tool_calls(self) -> int:
        """Tool calls sent so far."""
        return self._n_calls

    @property
    def complete(self) -> bool:
        """The forced call was decided before its block closed (whole calls, then junk the
        parser drops): nothing the model writes from here reaches the client, so the generation
        may stop (``ToolCallParser.complete``)."""
        return bool(getattr(self._tools, "complete", False))

    def feed(self, text: str) -> list[ContentOut | ToolCallOut]:
        """Consume one generated text delta."""
        if self._tools is None:
            return self._text(text)
        return self._pieces(self._tools.feed(text))

    def finish(self) -> list[ContentOut | ToolCallOut]:
        """End of generation: flush held text, adjudicate unterminated blocks."""
        out: list[ContentOut | ToolCallOut] = []
        if self._tools is not None:
            out += self._pieces(self._tools.finish())
        if self._held_ws and self._n_calls == 0:
            out += self._text(self._held_ws)
        self._held_ws = ""
        out += self._flush_bash()
        return out

    # -- internals

    def _pieces(self, pieces: list[Text | ParsedToolCall]) -> list[ContentOut | ToolCallOut]:
        out: list[ContentOut | ToolCallOut] = []
        for piece in pieces:
            if isinstance(piece, (RejectedCall, ParsedToolCall)) and self.prefix and not self._forced_seen:
                self._forced_seen = True  # the first block is the forced one
                if isinstance(piece, RejectedCall):
                    self.forced_error = piece.problem
            if isinstance(piece, RejectedCall):
                self.rejected.append(piece.problem)
                if self.on_reject is not None:
                    self.on_reject(piece.problem)
                text, self._held_ws = self._held_ws + piece.text, ""
                out += self._text(text)
                out.append(ContentOut("", rejected=piece.problem))
            elif isinstance(piece, Text):
                if not piece.text.strip():
                    self._held_ws += piece.text
                    continue
                text, self._held_ws = self._held_ws + piece.text, ""
                out += self._text(text)
            else:
                self._held_ws = ""
                out += self._flush_bash()
                out += self._call(piece)
        return out

    def _call(self, call: ParsedToolCall) -> list[ContentOut | ToolCallOut]:
        if not self.parallel_tool_calls and self._n_calls >= 1:
            return []
        verdict = self.gate.decide(call.name, call.arguments, tool_call_id=call.id)
        if verdict is None or verdict.allowed:
            event = ToolCallOut(call, self._n_calls, verdict)
            self._n_calls += 1
            return [event]
        return [self._note(verdict)]

    def _note(self, verdict: PolicyVerdictInfo) -> ContentOut:
        text = denial_note(verdict.tool, verdict.reason, verdict.rule)
        if self._any_content and not self._content_tail.endswith("\n"):
            text = "\n" + text
        if verdict.span is not None:  # a denied shell block: the span is the note's
            verdict.span = [self.content_offset, self.content_offset + len(text)]
        return self._content(text, verdict)

    def _content(self, text: str, verdict: PolicyVerdictInfo | None = None) -> ContentOut:
        if text:
            self._any_content = True
            self._content_tail = text[-1:]
            self.content_offset += len(text)
        return ContentOut(text, verdict)

    def _text(self, text: str) -> list[ContentOut | ToolCallOut]:
        if self._bash is None:
            return [self._content(text)] if text else []
        return self._bash_pieces(self._bash.feed(text))

    def _flush_bash(self) -> list[ContentOut | ToolCallOut]:
        if self._bash is None:
            return []
        out = self._bash_pieces(self._bash.finish())
        self._bash = BashBlockParser()
        return out

    def _bash_pieces(self, pieces: list[Text | Block]) -> list[ContentOut | ToolCallOut]:
        out: list[ContentOut | ToolCallOut] = []
        for piece in pieces:
            if isinstance(piece, Text):
                out.append(self._content(piece.text))
                continue
            ref, self._n_blocks = block_ref(self._n_blocks), self._n_blocks + 1
            span = [self.content_offset, self.content_offset + len(piece.raw)]
            verdict = self.gate.decide("bash", {"command": bash_command(piece)}, call_ref=ref, span=span)
            if verdict is None or verdict.allowed:
                out.append(self._content(piece.raw, verdict))
            else:
                out.append(self._note(verdict))
        return out


def merge_content(events: list[ContentOut | ToolCallOut]) -> list[ContentOut | ToolCallOut]:
    """Join adjacent plain ``ContentOut`` events (no verdict) into one, keeping the order.

    Streams send one chunk per merged event: when several deltas are ready at once (a client or a
    busy server that fell behind), they leave as one chunk instead of one per token.
    """
    out: list[ContentOut | ToolCallOut] = []
    for ev in events:
        if (isinstance(ev, ContentOut) and ev.verdict is None and ev.rejected is None and out
                and isinstance(out[-1], ContentOut) and out[-1].verdict is None and out[-1].rejected is None):
            out[-1] = ContentOut(out[-1].text + ev.text)
        else:
            out.append(ev)
    return out
