"""The wire form of tool calls and verdicts (python/fak/toolcalls/wire.py): the one arguments
digest, and tool definitions and calls encoded as OpenAI sends them. To add a case, encode a
struct and compare with the JSON a client sends or receives."""

from __future__ import annotations

import json

import msgspec
from fak.toolcalls.wire import FunctionCall, FunctionDefinition, Tool, ToolCall, arguments_digest


def test_arguments_digest_is_canonical() -> None:
    a = arguments_digest('{"b": [1, 2], "a": {"y": 1, "x": "ü"}}')
    b = arguments_digest('{ "a" : {"x":"ü","y":1}, "b":[1,2] }')
    c = arguments_digest({"a": {"x": "ü", "y": 1}, "b": [1, 2]})
    assert a == b == c
    assert a != arguments_digest({"a": {"x": "ü", "y": 2}, "b": [1, 2]})


def test_tool_and_call_encode_as_openai_sends_them() -> None:
    tool = Tool(function=FunctionDefinition("read", "Read a file.", {"type": "object"}))
    assert json.loads(msgspec.json.encode(tool)) == {
        "type": "function", "function": {"name": "read", "description": "Read a file.", "parameters": {"type": "object"}}}
    assert list(msgspec.to_builtins(tool)) == ["type", "function"], "the order a chat template's tojson keeps"
    assert msgspec.to_builtins(Tool(function=FunctionDefinition("submit"))) == {"type": "function", "function": {"name": "submit"}}
    call = msgspec.json.decode(b'{"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}',
                               type=ToolCall)
    assert call == ToolCall("c1", FunctionCall("read", "{}"))
