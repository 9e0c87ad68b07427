"""The shared tool-call contract (``fak.toolcalls``): calls checked against the offered tools,
rejected blocks without the server's pre-fill, shell blocks with the spans of their verdicts,
and ``verdict_for``. To add a case, feed a reply to the parser and assert on the pieces."""

from __future__ import annotations

import json

import pytest
from fak.toolcalls import (
    ParsedToolCall,
    RejectedCall,
    SchemaError,
    Text,
    ToolCallParser,
    ToolSet,
    fence_language,
    shell_blocks,
    verdict_for,
)

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}
TOOLS = ToolSet.from_openai([WEATHER, TIME])


def _pieces(text: str, prefix: str = "", tools: ToolSet | None = TOOLS) -> list:
    out = []
    for parts in ([text], list(text)):  # whole, and one character at a time
        parser = ToolCallParser(prefix, tools)
        pieces = []
        for part in parts:
            pieces += parser.feed(part)
        out.append(pieces + parser.finish())
    assert _shape(out[0]) == _shape(out[1])  # the split changes nothing
    return out[0]


def _shape(pieces: list) -> list:
    """Pieces without ids, adjacent plain text joined."""
    out: list = []
    for p in pieces:
        if isinstance(p, ParsedToolCall):
            out.append(("call", p.name, p.arguments))
        elif isinstance(p, RejectedCall):
            out.append(("rejected", p.text, p.problem.kind))
        elif out and out[-1][0] == "text":
            out[-1] = ("text", out[-1][1] + p.text)
        else:
            out.append(("text", p.text))
    return out


@pytest.mark.parametrize("block,kind", [
    ('{"name": "autumn", "arguments": {}}', "unknown_tool"),
    ('{"name": "get_weather", "arguments": {"town": "Oslo"}}', "schema"),
    ('{"name": "get_weather", "arguments": {"city": 5}}', "schema"),
    ('{"name": "get_weather", "arguments": 1}', "invalid_json"),
    ('{"name": "get_weather", "arguments": {"city": ', "invalid_json"),
])
def test_calls_that_do_not_fit_are_rejected_with_the_reason(block: str, kind: str) -> None:
    raw = "<tool_call>\n" + block + "\n</tool_call>"
    pieces = _pieces("Sure. " + raw)
    rejected = [p for p in pieces if isinstance(p, RejectedCall)]
    assert len(rejected) == 1 and rejected[0].problem.kind == kind and rejected[0].text == raw
    assert not any(isinstance(p, ParsedToolCall) for p in pieces)
    assert "".join(p.text for p in pieces if isinstance(p, Text)) == "Sure. " + raw  # content, unchanged


def test_fitting_calls_pass() -> None:
    pieces = _pieces('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
                     '<tool_call>{"name": "get_time", "arguments": {"anything": [1]}}</tool_call>')
    assert [(p.name, json.loads(p.arguments)) for p in pieces if isinstance(p, ParsedToolCall)] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {"anything": [1]})]


def test_a_rejected_forced_block_is_never_a_fragment() -> None:
    """Neither the server's pre-fill nor the model's part of a forced block that is not a call
    comes back as text: the rejection has empty text (the gateway retries, or answers cleanly)."""
    prefix = '<tool_call>\n{"name": "get_weather", "arguments":'
    pieces = _pieces(" 1}\n</tool_call>", prefix=prefix)
    assert pieces == [RejectedCall("", pieces[0].problem, "get_weather")]
    pieces = _pieces(' {"city": "Rome"}}\n</tool_call>', prefix=prefix)
    assert [(p.name, json.loads(p.arguments)) for p in pieces] == [("get_weather", {"city": "Rome"})]
    assert _pieces("", prefix=prefix) == [RejectedCall("", _pieces("", prefix=prefix)[0].problem, None)]
    required = '<tool_call>\n{"name": "'
    for reply in ('autumn", "arguments": {}}\n</tool_call>', 'get_weather", "arguments": {"town": 1}}\n</tool_call>',
                  'get_weather", "arguments": {"city": "Ro', 'get_weather", "argu'):
        pieces = _pieces(reply, prefix=required)
        assert len(pieces) == 1 and isinstance(pieces[0], RejectedCall) and pieces[0].text == "", reply


@pytest.mark.parametrize("reply,calls,rest", [
    # a whole call, then junk inside the block: the call is taken, the junk (and the rest) dropped
    ('get_time", "arguments": {}}}}\n</tool_call>\nmore text', [("get_time", {})], ""),
    ('get_weather", "arguments": {"city": "Rome"}} and now I explain the call', [("get_weather", {"city": "Rome"})], ""),
    ('get_weather", "arguments": {"city": "Rome"}}\n{"name": "get_time", "arguments": {}} junk',
     [("get_weather", {"city": "Rome"}), ("get_time", {})], ""),
    ('get_weather", "arguments": {"city": "Rome"}}, {"name": "get_time", "arguments": {}}\n</tool_call>',
     [("get_weather", {"city": "Rome"}), ("get_time", {})], ""),
    # a whole call that closes its block normally: the text after it stays
    ('get_time", "arguments": {}}\n</tool_call>\nDone.', [("get_time", {})], "\nDone."),
    # junk after a call that does not fit is no rescue
    ('get_weather", "arguments": {"town": "Rome"}} junk', [], None),
])
def test_a_forced_call_followed_by_junk_is_the_call(reply: str, calls: list, rest: str | None) -> None:
    pieces = _pieces(reply, prefix='<tool_call>\n{"name": "')
    assert [(p.name, json.loads(p.arguments)) for p in pieces if isinstance(p, ParsedToolCall)] == calls
    if rest is None:
        assert len(pieces) == 1 and isinstance(pieces[0], RejectedCall) and pieces[0].text == ""
    else:
        assert "".join(p.text for p in pieces if isinstance(p, Text)) == rest


def test_a_forced_call_is_decided_as_soon_as_junk_follows_it() -> None:
    """Fed token by token, the parser takes the call when the first junk character arrives and
    says so (``complete``): the gateway stops the generation there."""
    parser = ToolCallParser('<tool_call>\n{"name": "', TOOLS)
    got: list = []
    for ch in 'get_time", "arguments": {}}':
        got += parser.feed(ch)
    assert not got and not parser.complete  # the object closed: another may follow, or </tool_call>
    got += parser.feed("\n")
    assert not got and not parser.complete
    got += parser.feed("}")
    assert [p.name for p in got] == ["get_time"] and parser.complete
    assert parser.feed("</tool_call> more") == [] and parser.finish() == []
    # without a prefix (tool_choice auto) nothing is salvaged: a block with junk is content
    pieces = _pieces('<tool_call>\n{"name": "get_time", "arguments": {}}}\n</tool_call>')
    assert isinstance(pieces[0], RejectedCall) and pieces[0].text.startswith("<tool_call>")


def test_bare_calls_must_fit_too() -> None:
    assert [p.name for p in _pieces('{"name": "get_weather", "arguments": {"city": "Lima"}}')] == ["get_weather"]
    pieces = _pieces('{"name": "get_weather", "arguments": {}}')
    assert pieces == [Text('{"name": "get_weather", "arguments": {}}')]


EXEC = ToolSet.from_openai([{"type": "function", "function": {"name": "exec_command", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["cmd"], "properties": {
        "cmd": {"type": "string"},
        "sandbox_permissions": {"type": "string", "enum": ["use_default", "require_escalated"]},
        "prefix_rule": {"type": "array", "items": {"type": "string"}},
        "note": {"type": ["string", "null"]}}}}}])


def test_null_for_an_optional_parameter_means_omitted() -> None:
    """Codex's ``exec_command`` as Qwen2.5-Coder-1.5B wrote it (``null`` for an optional enum):
    the null is dropped, the call fits; a null the schema allows stays; a null for a required
    parameter still fails."""
    reply = '```json\n{"name": "exec_command", "arguments": {"cmd": "ls", "sandbox_permissions": null, "prefix_rule": [], "note": null}}\n```'
    calls = [p for p in _pieces(reply, tools=EXEC) if isinstance(p, ParsedToolCall)]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("exec_command", {"cmd": "ls", "prefix_rule": [], "note": None})]
    marked = '<tool_call>{"name": "exec_command", "arguments": {"cmd": "pwd", "sandbox_permissions": null}}</tool_call>'
    calls = [p for p in _pieces(marked, tools=EXEC) if isinstance(p, ParsedToolCall)]
    assert [json.loads(c.arguments) for c in calls] == [{"cmd": "pwd"}]
    assert EXEC.fit("exec_command", '{"cmd": null}') == '{"cmd": null}'
    assert EXEC.check("exec_command", EXEC.fit("exec_command", '{"cmd": null}')) is not None
    assert EXEC.fit("other", '{"x": null}') == '{"x": null}'


def test_toolset_schemas() -> None:
    with pytest.raises(SchemaError, match=r"tools\[1\]"):
        ToolSet.from_openai([TIME, {"function": {"name": "f", "parameters": {"type": "nope"}}}])
    with pytest.raises(SchemaError, match="not fetched"):
        ToolSet.from_openai([{"function": {"name": "f", "parameters": {"$ref": "file:///etc/passwd"}}}])
    local = ToolSet.from_openai([{"function": {"name": "f", "parameters": {
        "$defs": {"p": {"type": "string"}}, "type": "object", "properties": {"p": {"$ref": "#/$defs/p"}}}}}])
    assert local.check("f", {"p": "x"}) is None and local.check("f", {"p": 1}).kind == "schema"
    assert TOOLS.ordered == ("get_weather", "get_time") and TOOLS.check("get_time", "{}") is None


def test_shell_blocks_and_their_spans() -> None:
    text = "Run:\n```bash\nls\n```\nor ```ZSH pwd``` and ```console\n$ x"
    blocks = shell_blocks(text)
    assert [(b.index, text[b.start:b.end]) for b in blocks] == [
        (0, "```bash\nls\n```"), (1, "```ZSH pwd```"), (2, "```console\n$ x")]
    assert [fence_language(b.block) for b in blocks] == ["bash", "zsh", "console"]
    assert [b.block.closed for b in blocks] == [True, True, False]


def test_verdict_for() -> None:
    verdicts = [{"call_ref": "call_a", "allowed": True}, {"call_ref": "block:0", "span": [5, 19], "allowed": False}]
    assert verdict_for(verdicts, call_ref="call_a") is verdicts[0]
    assert verdict_for(verdicts, span=(5, 19)) is verdicts[1]
    assert verdict_for(verdicts, span=(5, 18)) is None and verdict_for(verdicts, call_ref="call_b") is None
