"""Qwen2.5 tool-call parsing and the streaming block segmenter.

Every text is also fed split at every position (and one character at a time), since a marker may
arrive across any delta boundary. To add a case, append ``(text, expected_content, expected_calls)``
to ``CASES``.
"""

from __future__ import annotations

import json

import pytest
from fak.toolcalls.hermes import (
    ParsedToolCall,
    ToolCallParser,
    extract_tool_calls,
    parse_tool_call_json,
    parse_tool_call_objects,
)
from fak.toolcalls.segmenter import Block, BlockSegmenter, Text

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'

CASES = [
    ("plain text only", "plain text only", []),
    (CALL, None, [("get_weather", {"city": "Paris"})]),
    ("Sure.\n" + CALL, "Sure.", [("get_weather", {"city": "Paris"})]),
    (CALL + "\n" + CALL.replace("Paris", "Rome"), None,
     [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]),
    # arguments given as a JSON string, and the "parameters" alias
    ('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>', None, [("f", {"a": 1})]),
    ('<tool_call>{"name": "f", "parameters": {"a": 2}}</tool_call>', None, [("f", {"a": 2})]),
    ('<tool_call>{"name": "f"}</tool_call>', None, [("f", {})]),
    # malformed: stays content, markers included
    ('<tool_call>{"name": "f", "arguments": {</tool_call>', '<tool_call>{"name": "f", "arguments": {</tool_call>', []),
    ('<tool_call>["f"]</tool_call>', '<tool_call>["f"]</tool_call>', []),
    ('<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"arguments": {}}</tool_call>', []),
    ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', '<tool_call>{"name": "f", "arguments": [1]}</tool_call>', []),
    # an unterminated block whose JSON is whole is a call; otherwise text
    ('<tool_call>\n{"name": "f", "arguments": {"x": 1}}', None, [("f", {"x": 1})]),
    ('<tool_call>\n{"name": "f", "argu', '<tool_call>\n{"name": "f", "argu', []),
    # marker look-alikes are text
    ("a < b and <tool_ca", "a < b and <tool_ca", []),
    ("<tool_callx>", "<tool_callx>", []),
]


def _splits(text: str) -> list[list[str]]:
    out = [[text], list(text)]
    out += [[text[:i], text[i:]] for i in range(1, len(text))]
    return out


def _run(parts: list[str]) -> list[Text | ParsedToolCall]:
    parser = ToolCallParser()
    pieces: list[Text | ParsedToolCall] = []
    for part in parts:
        pieces += parser.feed(part)
    return pieces + parser.finish()


@pytest.mark.parametrize("text,content,calls", CASES)
def test_tool_calls_any_split(text: str, content: str | None, calls: list[tuple[str, dict]]) -> None:
    for parts in _splits(text):
        pieces = _run(parts)
        got_calls = [(p.name, json.loads(p.arguments)) for p in pieces if isinstance(p, ParsedToolCall)]
        assert got_calls == calls, parts
        got_text = "".join(p.text for p in pieces if isinstance(p, Text))
        if calls:
            assert (got_text.strip() or None) == content, parts
        else:
            assert got_text == content, parts
        # nothing is lost: text + raw calls rebuild the input
        assert "".join(p.text if isinstance(p, Text) else p.raw for p in pieces) == text


def test_extract_tool_calls_whole_text() -> None:
    content, calls = extract_tool_calls("Let me see.\n" + CALL)
    assert content == "Let me see."
    assert [c.name for c in calls] == ["get_weather"]
    assert calls[0].id.startswith("call_") and len(calls[0].id) == 29
    assert json.loads(calls[0].arguments) == {"city": "Paris"}


def test_prefix_is_parsed_as_model_output() -> None:
    parser = ToolCallParser(prefix='<tool_call>\n{"name": "f", "arguments": ')
    pieces = parser.feed('{"a": 1}}\n</tool_call>') + parser.finish()
    assert [(p.name, json.loads(p.arguments)) for p in pieces if isinstance(p, ParsedToolCall)] == [("f", {"a": 1})]


def test_parse_tool_call_json_rejects_non_objects() -> None:
    assert parse_tool_call_json('{"name": "f", "arguments": {"a": 1}}') == ("f", '{"a": 1}')
    for bad in ("", "null", "1", '"s"', '{"name": 3}', '{"name": ""}', '{"name": "f", "arguments": "[1]"}'):
        assert parse_tool_call_json(bad) is None, bad


def test_several_objects_in_one_block_are_several_calls() -> None:
    """Qwen2.5-Coder-1.5B's plan in one unclosed block (seen on the coding agent's first turn)."""
    text = ('<tool_call>\n{"name": "search", "arguments": {"pattern": "def add"}}\n'
            '{"name": "edit", "arguments": {"path": "calc.py", "old": "a - b", "new": "a + b"}}\n')
    parser = ToolCallParser()
    pieces = parser.feed(text) + parser.finish()
    assert [(p.name, json.loads(p.arguments)) for p in pieces if isinstance(p, ParsedToolCall)] == [
        ("search", {"pattern": "def add"}), ("edit", {"path": "calc.py", "old": "a - b", "new": "a + b"})]
    assert parse_tool_call_objects('{"name": "f", "arguments": {}}, {"name": "g"}') == [("f", "{}"), ("g", "{}")]
    for bad in ('{"name": "f"} trailing', '{"name": "f"} {"name": 3}', '{"name": "f"} [1]'):
        assert parse_tool_call_objects(bad) is None, bad


def test_segmenter_holds_back_only_marker_prefixes() -> None:
    seg = BlockSegmenter("```bash", "```")
    assert seg.feed("hello `") == [Text("hello ")]
    assert seg.feed("`") == []
    assert seg.feed("`python") == [Text("```python")]
    assert seg.feed("\n```bash\nls\n") == [Text("\n")]
    assert seg.in_block
    assert seg.feed("``") == []
    assert seg.feed("`tail`") == [Block("\nls\n", "```bash\nls\n```", True), Text("tail")]
    assert seg.finish() == [Text("`")]


def test_segmenter_unclosed_block_on_finish() -> None:
    seg = BlockSegmenter("<a>", "</a>")
    assert seg.feed("x<a>open") == [Text("x")]
    assert seg.finish() == [Block("open", "<a>open", False)]
    assert seg.finish() == []


NAMES = frozenset({"get_weather", "bash"})
BARE_CASES = [
    ('{"name": "get_weather", "arguments": {"city": "Paris"}}', [("get_weather", {"city": "Paris"})], None),
    ('  \n{"name": "bash", "arguments": {"command": "ls"}}\n', [("bash", {"command": "ls"})], None),
    ('```json\n{"name": "bash", "arguments": {"command": "ls"}}\n```', [("bash", {"command": "ls"})], None),
    ('{"name": "bash", "arguments": {"command": "ls"}}\n{"name": "bash", "arguments": {"command": "pwd"}}',
     [("bash", {"command": "ls"}), ("bash", {"command": "pwd"})], None),
    ('[{"name": "bash", "arguments": {"command": "ls"}}]', [("bash", {"command": "ls"})], None),
    # the template's <tools> tags echoed around the call (Qwen2.5-Coder-1.5B answering Codex)
    ('<tools>\n{"name": "bash", "arguments": {"command": "ls", "tty": false}}\n</tools>',
     [("bash", {"command": "ls", "tty": False})], None),
    ('<tools>\n{"name": "rm_everything", "arguments": {}}\n</tools>', [],
     '<tools>\n{"name": "rm_everything", "arguments": {}}\n</tools>'),
    ('<tools>{"name": "bash", "arguments": {"command": "ls"}}', [], '<tools>{"name": "bash", "arguments": {"command": "ls"}}'),
    ('<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>', [("bash", {"command": "ls"})], ""),
    # not calls: unknown tool, extra text, other JSON, code fences of other languages
    ('{"name": "rm_everything", "arguments": {}}', [], '{"name": "rm_everything", "arguments": {}}'),
    ('{"name": "bash", "arguments": {"command": "ls"}} and more', [],
     '{"name": "bash", "arguments": {"command": "ls"}} and more'),
    ('{"answer": 4}', [], '{"answer": 4}'),
    ("```python\nprint(1)\n```", [], "```python\nprint(1)\n```"),
    ("Sure: {\"name\": \"bash\"}", [], "Sure: {\"name\": \"bash\"}"),
]


@pytest.mark.parametrize("text,calls,content", BARE_CASES)
def test_bare_json_calls_any_split(text: str, calls: list, content: str | None) -> None:
    for parts in _splits(text):
        parser = ToolCallParser(tools=NAMES)
        pieces: list = []
        for part in parts:
            pieces += parser.feed(part)
        pieces += parser.finish()
        got = [(p.name, json.loads(p.arguments)) for p in pieces if isinstance(p, ParsedToolCall)]
        assert got == calls, parts
        if content is not None:
            assert "".join(p.text for p in pieces if isinstance(p, Text)) == content, parts


def test_bare_json_needs_tool_names() -> None:
    parser = ToolCallParser()
    pieces = parser.feed('{"name": "bash", "arguments": {}}') + parser.finish()
    assert pieces == [Text('{"name": "bash", "arguments": {}}')]


def test_plain_answers_are_not_held_back() -> None:
    parser = ToolCallParser(tools=NAMES)
    assert parser.feed("Hel") == [Text("Hel")]
    assert parser.feed("lo") == [Text("lo")]
