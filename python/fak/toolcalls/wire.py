"""The wire form of tool calls and of the policy's verdicts about them: what every endpoint of
the gateway sends and reads, what the agent offers and checks, and the one digest of a call's
arguments.

- ``Tool`` / ``FunctionDefinition``: an offered tool, OpenAI's ``{"type": "function", "function":
  {"name", "description", "parameters"}}`` (``parameters`` a JSON Schema);
- ``ToolCall`` / ``FunctionCall``: a call, ``{"id", "type": "function", "function": {"name",
  "arguments"}}`` with the arguments as a JSON string, in a returned message and in the earlier
  assistant turns a client sends back (OpenAI Chat Completions API);
- ``PolicyVerdictInfo`` / ``FakPolicyInfo``: the ``fak_policy`` extension object, one verdict per
  adjudicated call, found by its ``call_ref`` (``fak.toolcalls.verdict_for``);
- ``arguments_digest``: ``"sha256:"`` and the hex SHA-256 of a call's arguments in canonical JSON,
  the digest a verdict, the audit log (``fak.policy.audit``), the inline reads and the agent's
  repeated-call rule share.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

__all__ = [
    "FakPolicyInfo",
    "FunctionCall",
    "FunctionDefinition",
    "PolicyVerdictInfo",
    "Tool",
    "ToolCall",
    "arguments_digest",
]


def arguments_digest(arguments: str | bytes | dict[str, Any] | Any) -> str:
    """``"sha256:<hex>"`` of the canonical JSON of ``arguments`` (a JSON string, bytes or a
    decoded value): ``json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``
    encoded as UTF-8. Text that does not decode (invalid, or nested too deeply for Python's
    ``json``) is hashed as its raw UTF-8 bytes, and a value that cannot be encoded as JSON as the
    text ``<unencodable: TYPE>``. Never raises."""
    obj: Any = arguments
    if isinstance(arguments, (str, bytes, bytearray)):
        try:
            obj = json.loads(arguments)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raw = arguments.encode("utf-8", "surrogatepass") if isinstance(arguments, str) \
                else bytes(arguments)
            return "sha256:" + hashlib.sha256(raw).hexdigest()
    try:
        canonical = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                               default=str)
    except (ValueError, TypeError, RecursionError):
        canonical = f"<unencodable: {type(obj).__name__}>"
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


class FunctionDefinition(msgspec.Struct, omit_defaults=True):
    """A callable function: name (``[a-zA-Z0-9_-]{1,64}``), description, JSON Schema of its
    parameters. Fields left unset are not encoded."""

    name: Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(msgspec.Struct, kw_only=True):
    """A tool the model may call (only ``type: "function"`` exists)."""

    type: Literal["function"] = "function"
    function: FunctionDefinition


class FunctionCall(msgspec.Struct):
    """``function`` of a tool call: the name and the arguments as a JSON string (as OpenAI
    returns them)."""

    name: str
    arguments: str


class ToolCall(msgspec.Struct):
    """A tool call of an assistant message: returned in a response, or sent back by the client
    in an earlier assistant turn."""

    id: str
    function: FunctionCall
    type: Literal["function"] = "function"


class PolicyVerdictInfo(msgspec.Struct):
    """One policy decision on a proposed tool call (fak extension).

    ``call_ref`` names the call the verdict is about (the contract of ``fak.toolcalls``): the
    call's ``tool_call_id`` (for a denied call, removed from the response, the id it would have
    had), or ``block:N`` for the ``N``-th shell block of the reply (``X-Fak-Text-Tools``), with
    ``span`` = ``[start, end)``, the block's place in the message content as sent (or the place
    of the note that replaced a denied block), in characters (Unicode code points).
    ``tool_call_id`` is the id of the call when it was kept (``None`` for denied calls and for
    shell blocks). ``arguments_digest`` is :func:`arguments_digest` of the call's arguments.
    """

    tool: str
    allowed: bool
    reason: str
    rule: str | None = None
    tool_call_id: str | None = None
    arguments_digest: str | None = None
    call_ref: str | None = None
    span: list[int] | None = None


class FakPolicyInfo(msgspec.Struct):
    """The ``fak_policy`` extension object: the verdicts of this response's tool calls."""

    verdicts: list[PolicyVerdictInfo]
