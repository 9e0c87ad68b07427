"""Qwen3-Coder XML tool calls (``fak.toolcalls.qwen3xml``) and the choice of form
(``fak.toolcalls.formats``).

Replies have the shape Qwen3-Coder's chat template asks for (and the reference parser, vLLM's
``qwen3coder_tool_parser.py``, reads). Every text is also fed one character at a time and split
at every position, since a marker may arrive across any delta boundary. To add a case, append
``(text, expected_content, expected_calls)`` to ``CASES`` (``expected_content`` is the content
with whitespace stripped when there are calls), a ``(block, kind)`` row to ``REJECTED``, or a
``(value, schema, expected)`` row to ``CONVERSIONS``; a property test feeds random markup in
random deltas.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fak.toolcalls import (
    ParsedToolCall,
    Qwen3XmlParser,
    RejectedCall,
    Text,
    ToolCallFormat,
    ToolSet,
    convert_parameter,
    detect_tool_call_format,
    extract_xml_tool_calls,
    format_of_text,
)
from fak.toolcalls.qwen3xml import parameter_kinds, scan_functions
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

DATA = Path(__file__).resolve().parents[1] / "data"
SYNTH_TEMPLATES = Path(__file__).resolve().parents[2] / "python" / "fak" / "synth" / "templates"

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
        "lat": {"type": "number"}, "options": {"type": "object"}, "tags": {"type": "array"},
        "note": {"type": ["string", "null"]}},
    "required": ["city"]}}}
BASH = {"type": "function", "function": {"name": "bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
EDIT = {"type": "function", "function": {"name": "edit", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}},
    "required": ["path", "old", "new"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}
TOOLS = ToolSet.from_openai([WEATHER, BASH, EDIT, TIME])


def call(name: str, **params: str) -> str:
    """A call as Qwen3-Coder's template writes it."""
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


PARIS = call("get_weather", city="Paris")
CASES = [
    ("plain text only", "plain text only", []),
    (PARIS, None, [("get_weather", {"city": "Paris"})]),
    # text before the call, two calls in one answer
    ("I'll check both cities.\n\n" + PARIS + "\n" + call("get_weather", city="Rome", days="3"),
     "I'll check both cities.", [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome", "days": 3})]),
    # two functions in one block
    ("<tool_call>\n<function=get_time>\n</function>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
     "</function>\n</tool_call>", None, [("get_time", {}), ("get_weather", {"city": "Oslo"})]),
    # typed values: integer, boolean (any case), number, object, array, null
    (call("get_weather", city="Lima", days="7", metric="True", lat="-12.05", options='{"units": "si", "n": 2}',
          tags="['a', 'b']", note="null"), None,
     [("get_weather", {"city": "Lima", "days": 7, "metric": True, "lat": -12.05, "options": {"units": "si", "n": 2},
                       "tags": ["a", "b"], "note": None})]),
    # a value spanning lines keeps its inner newlines and indentation; only the template's first
    # and last newline go
    (call("edit", path="a.py", old="def f():\n    return 1\n", new="def f():\n    return 2"), None,
     [("edit", {"path": "a.py", "old": "def f():\n    return 1\n", "new": "def f():\n    return 2"})]),
    # values holding `<`, XML-like text, tags inside a line, unicode
    (call("bash", command="test 1 < 2 && echo '<div class=\"x\">ok</div>' > out.html"), None,
     [("bash", {"command": "test 1 < 2 && echo '<div class=\"x\">ok</div>' > out.html"})]),
    (call("edit", path="t.py", old="s = '<parameter=x>y</parameter=x>'\n  </function>",
          new="<tool_call> é 漢字 🙂"), None,
     [("edit", {"path": "t.py", "old": "s = '<parameter=x>y</parameter=x>'\n  </function>",
                "new": "<tool_call> é 漢字 🙂"})]),
    # a value that is an XML file with a `</function>` line (its own </parameter> follows)
    (call("edit", path="f.xml", old="<function>\n<name>f</name>\n</function>", new=""), None,
     [("edit", {"path": "f.xml", "old": "<function>\n<name>f</name>\n</function>", "new": ""})]),
    # inline values (no newlines), blanks in tags
    ("<tool_call><function=get_weather><parameter=city>Kyiv</parameter></function></tool_call>", None,
     [("get_weather", {"city": "Kyiv"})]),
    # a missing </parameter>: the value ends at the next tag that opens a line
    ("<tool_call>\n<function=get_weather>\n<parameter=city>\nBern\n<parameter=days>\n2\n</function>\n</tool_call>",
     None, [("get_weather", {"city": "Bern", "days": 2})]),
    # a missing </function> inside a closed block, a missing </tool_call> after a whole call (the
    # engine stopped at the stop string </tool_call>)
    ("<tool_call>\n<function=get_weather>\n<parameter=city>\nBonn\n</parameter>\n</tool_call>", None,
     [("get_weather", {"city": "Bonn"})]),
    ("Here.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nGent\n</parameter>\n</function>\n", "Here.",
     [("get_weather", {"city": "Gent"})]),
    # a call written without <tool_call> around it
    ("Let me look.\n<function=get_time>\n</function>", "Let me look.", [("get_time", {})]),
    # the JSON form inside a block is read as such
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Ulm"}}\n</tool_call>', None,
     [("get_weather", {"city": "Ulm"})]),
    # marker look-alikes are text
    ("a < b and <tool_ca", "a < b and <tool_ca", []),
    ("<functional> <function programming", "<functional> <function programming", []),
]


def _splits(text: str) -> list[list[str]]:
    out = [[text], list(text)]
    out += [[text[:i], text[i:]] for i in range(1, len(text))]
    return out


def _run(parts: list[str], prefix: str = "", tools: ToolSet | None = TOOLS) -> list:
    parser = Qwen3XmlParser(prefix, tools)
    pieces: list = []
    for part in parts:
        pieces += parser.feed(part)
    return pieces + parser.finish()


def _calls(pieces: list) -> list[tuple[str, dict]]:
    return [(p.name, json.loads(p.arguments)) for p in pieces if isinstance(p, ParsedToolCall)]


@pytest.mark.parametrize("text,content,calls", CASES)
def test_tool_calls_any_split(text: str, content: str | None, calls: list[tuple[str, dict]]) -> None:
    for parts in _splits(text):
        pieces = _run(parts)
        assert _calls(pieces) == calls, parts
        got_text = "".join(p.text for p in pieces if isinstance(p, Text))
        if calls:
            assert (got_text.strip() or None) == content, parts
        else:
            assert got_text == content, parts
        # nothing is lost: text + raw calls rebuild the input (the calls of one block share its raw)
        rebuilt = [p.text if isinstance(p, Text) else p.raw for i, p in enumerate(pieces)
                   if isinstance(p, Text) or i == 0 or getattr(pieces[i - 1], "raw", None) is not p.raw]
        assert "".join(rebuilt) == text
        assert all(isinstance(p, (Text, ParsedToolCall)) for p in pieces)


def test_arguments_are_openai_json_strings() -> None:
    content, calls = extract_xml_tool_calls("Sure.\n" + call("get_weather", city="Zürich", days="2"), TOOLS)
    assert content == "Sure."
    assert calls[0].id.startswith("call_") and len(calls[0].id) == 29
    assert calls[0].arguments == '{"city": "Zürich", "days": 2}'  # as the JSON form's path writes them
    assert ToolCallFormat.QWEN3_XML.extract(PARIS, TOOLS)[1][0].arguments == '{"city": "Paris"}'


def test_streaming_never_leaks_partial_markup() -> None:
    """Text before a call streams as it comes; nothing of the markup is ever content."""
    text = "Checking the weather now.\n" + PARIS + "\n" + call("get_time")
    parser = Qwen3XmlParser(tools=TOOLS)
    streamed = ""
    calls = []
    for i, ch in enumerate(text):
        for p in parser.feed(ch):
            if isinstance(p, Text):
                streamed += p.text
                assert "<" not in p.text, (i, p)
            else:
                calls.append(p.name)
        if i == len("Checking the weather now.") - 1:
            assert streamed == "Checking the weather now."  # not held back
    for p in parser.finish():
        assert not isinstance(p, Text) or not p.text.strip()
    assert calls == ["get_weather", "get_time"]


REJECTED = [
    # broken markup: kind "malformed"
    ("<tool_call>\n<function=get_weather\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
     "malformed"),
    ("<tool_call>\n<function=>\n</function>\n</tool_call>", "malformed"),
    ("<tool_call>\n<function=get_weather>\n<parameter=city\nParis\n</parameter>\n</function>\n</tool_call>",
     "malformed"),
    ("<tool_call>\nget_weather(city='Paris')\n</tool_call>", "malformed"),
    ('<tool_call>\n{"name": "get_weather", "arguments": {</tool_call>', "malformed"),
    # cut off by the end of the generation: never a call, even when the name and a value are there
    ("<tool_call>\n<function=bash>\n<parameter=command>\nrm -rf /tmp/bu", "malformed"),
    ("<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n", "malformed"),
    ("<function=bash>\n<parameter=command>\nls\n</parameter>\n", "malformed"),
    # a name that was not offered; arguments that fail the schema (bad boolean stays text)
    (call("autumn", leaves="red"), "unknown_tool"),
    (call("get_weather", town="Oslo"), "schema"),
    (call("get_weather", city="Oslo", metric="maybe"), "schema"),
    (call("get_weather", city="Oslo", days="three"), "schema"),
]


@pytest.mark.parametrize("block,kind", REJECTED)
def test_blocks_that_are_not_calls_stay_text_with_the_reason(block: str, kind: str) -> None:
    for parts in ([block], list(block)):
        pieces = _run(["Sure. "] + parts)
        rejected = [p for p in pieces if isinstance(p, RejectedCall)]
        assert len(rejected) == 1 and rejected[0].problem.kind == kind, (block, pieces)
        assert rejected[0].text == block
        assert not _calls(pieces)
        assert "".join(p.text for p in pieces if isinstance(p, Text)) == "Sure. " + block  # content, unchanged
    if kind == "malformed":
        assert "<function=NAME>" in rejected[0].problem.message  # tells the model how to write a call


def test_rejected_calls_name_the_function() -> None:
    pieces = _run([call("get_weather", town="Oslo")])
    assert pieces[0].name == "get_weather"


def test_forced_prefix_is_parsed_and_never_returned() -> None:
    """The gateway's pre-fill (tool_choice named) is parsed as the model's; a block it opened that
    is not a call comes back as the model's part of it only."""
    prefix = ToolCallFormat.QWEN3_XML.forced_prefix("get_weather")
    assert prefix == "<tool_call>\n<function=get_weather>\n"
    for parts in _splits("<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>"):
        assert _calls(_run(parts, prefix)) == [("get_weather", {"city": "Rome"})]
    pieces = _run(["<parameter=town>\nRome\n</parameter>\n</function>\n</tool_call>"], prefix)
    assert pieces == [RejectedCall("", pieces[0].problem, "get_weather")]  # never a fragment
    assert _calls(_run(["<function=get_time>\n</function>\n</tool_call>"], "<tool_call>\n")) == [("get_time", {})]
    empty = _run([""], "<tool_call>\n")
    assert len(empty) == 1 and isinstance(empty[0], RejectedCall) and empty[0].text == ""


@pytest.mark.parametrize("reply,calls,rest", [
    # a whole call, then broken markup: the call is taken, the rest dropped
    ("<function=get_time>\n</function>\n<function=get_weather>\n<parameter=city", [("get_time", {})], ""),
    ("<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\nI called it.\n</tool_call>\nmore",
     [("get_weather", {"city": "Rome"})], ""),
    # a call that closes its block normally keeps the text after it
    ("<function=get_time>\n</function>\n</tool_call>\nDone.", [("get_time", {})], "\nDone."),
    # a </function> inside a value still open is never taken as the call's end: nothing is cut
    ("<function=get_weather>\n<parameter=city>\n<a>\n</function>\nb\n</parameter>\n</function>\n</tool_call>",
     [("get_weather", {"city": "<a>\n</function>\nb"})], ""),
    ("<function=autumn>\n</function>\njunk", [], None),
])
def test_a_forced_xml_call_followed_by_junk_is_the_call(reply: str, calls: list, rest: str | None) -> None:
    for parts in _splits(reply):
        pieces = _run(parts, "<tool_call>\n")
        assert _calls(pieces) == calls, parts
        if rest is None:
            assert len(pieces) == 1 and isinstance(pieces[0], RejectedCall) and pieces[0].text == "", parts
        else:
            assert "".join(p.text for p in pieces if isinstance(p, Text)) == rest, parts


def test_a_forced_xml_call_is_decided_as_soon_as_junk_follows_it() -> None:
    parser = Qwen3XmlParser("<tool_call>\n", TOOLS)
    got: list = []
    for ch in "<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n</tool":
        got += parser.feed(ch)
    assert not got and not parser.complete
    got += parser.feed("x")  # "</toolx": not the close marker
    assert _calls(got) == [("get_weather", {"city": "Rome"})] and parser.complete
    assert parser.feed("more") == [] and parser.finish() == []


def test_without_tools_any_name_and_every_value_text() -> None:
    pieces = _run([call("anything", n="5", flag="true")], tools=None)
    assert _calls(pieces) == [("anything", {"n": "5", "flag": "true"})]


def test_untrusted_values_never_crash() -> None:
    deep = "[" * 5000 + "]" * 5000
    huge = "9" * 10000
    for value, kind in ((deep, "array"), ("(" * 300 + ")" * 300, "object"), (huge, "integer"), (huge, "number"),
                        ("1e999", "number"), ("NaN", "number"), ('{"a": NaN}', "object"), ("{1: 2}", "object"),
                        ("{'a': {1, 2}}", "object"), ("__import__('os')", "object"), ("1+2j", "array")):
        got = convert_parameter(value, {"type": kind})
        json.dumps(got, allow_nan=False)  # always valid JSON
    assert convert_parameter(huge, {"type": "integer"}) == huge  # past Python's int-string limit: text


CONVERSIONS = [
    ("Paris", {"type": "string"}, "Paris"),
    ("  padded  ", {"type": "string"}, "  padded  "),
    ("null", {"type": "string"}, "null"),
    ("NULL", {"type": ["string", "null"]}, None),
    ("null", {"type": "integer"}, None),
    ("42", {"type": "integer"}, 42),
    (" -7 ", {"type": "int"}, -7),
    ("4.0", {"type": "integer"}, "4.0"),
    ("4.0", {"type": "number"}, 4),
    ("2.5e3", {"type": "number"}, 2500),
    ("0.25", {"type": "float"}, 0.25),
    ("12345678901234567890", {"type": "number"}, 12345678901234567890),
    ("TRUE", {"type": "boolean"}, True),
    ("false", {"type": "bool"}, False),
    ("yes", {"type": "boolean"}, "yes"),
    ('{"a": [1, true, null]}', {"type": "object"}, {"a": [1, True, None]}),
    ("{'a': [1, True, None]}", {"type": "object"}, {"a": [1, True, None]}),
    ("(1, 2)", {"type": "array"}, [1, 2]),
    ("[1, 2", {"type": "array"}, "[1, 2"),
    ("7", {"type": ["integer", "string"]}, 7),
    ("seven", {"type": ["integer", "string"]}, "seven"),
    ("3", {"anyOf": [{"type": "integer"}, {"type": "string"}]}, 3),
    ("2", {"enum": [1, 2, 3]}, 2),
    ("2", {"enum": ["1", "2"]}, "2"),
    ("5", {"description": "no type"}, "5"),
    ("5", None, "5"),
    ("[1]", {"type": "any"}, [1]),
    ("x", {"type": "any"}, "x"),
]


@pytest.mark.parametrize("value,schema,expected", CONVERSIONS)
def test_values_typed_as_the_reference_parser_types_them(value: str, schema: dict | None, expected: object) -> None:
    got = convert_parameter(value, schema)
    assert got == expected and type(got) is type(expected)


def test_parameter_kinds_and_refs() -> None:
    assert parameter_kinds({"type": ["null", "boolean"]}) == ("null", "boolean")
    assert parameter_kinds({"oneOf": [{"type": "object"}, {"type": "array"}]}) == ("json",)
    assert parameter_kinds({}) == ("string",)
    tools = ToolSet.from_openai([{"function": {"name": "f", "parameters": {
        "$defs": {"n": {"type": "integer"}}, "type": "object", "properties": {"n": {"$ref": "#/$defs/n"}}}}}])
    assert tools.parameter_schema("f", "n") == {"type": "integer"}
    assert tools.parameter_schema("f", "m") is None and tools.parameter_schema("g", "n") is None
    assert _calls(_run([call("f", n="3")], tools=tools)) == [("f", {"n": 3})]


def test_scan_functions() -> None:
    assert scan_functions("no function here", closed=True) is None
    got = scan_functions("\n<function=f>\n<parameter=a>\n\n1\n\n</parameter>\n</function>\n", closed=False)
    assert [(c.name, c.parameters) for c in got] == [("f", (("a", "\n1\n"),))]  # one newline each side goes


def test_detect_tool_call_format_from_the_template() -> None:
    assert detect_tool_call_format((DATA / "qwen3_coder_style.jinja").read_text()) is ToolCallFormat.QWEN3_XML
    # the templates fak synth writes into its tiny models (qwen3moe: Qwen3-Coder's)
    for name, form in (("qwen2", "hermes"), ("llama3", "hermes"), ("qwen3", "hermes"), ("qwen3-coder", "qwen3_xml")):
        path = SYNTH_TEMPLATES / f"{name}.jinja"
        if path.exists():
            assert detect_tool_call_format(path.read_text()) is ToolCallFormat(form), name
    assert detect_tool_call_format(None) is ToolCallFormat.HERMES
    assert detect_tool_call_format("") is ToolCallFormat.HERMES
    # Llama 3.1's custom-tool example mentions <function=...> with JSON, no <parameter=
    assert detect_tool_call_format('Reply as <function=NAME>{"a": 1}</function>') is ToolCallFormat.HERMES
    assert format_of_text(PARIS) is ToolCallFormat.QWEN3_XML and format_of_text("{}") is ToolCallFormat.HERMES


def test_forced_prefix_and_openings_of_each_form() -> None:
    xml, hermes = ToolCallFormat.QWEN3_XML, ToolCallFormat.HERMES
    assert xml.forced_prefix() == "<tool_call>\n"
    assert xml.forced_openings(["a", "b"]) == ["<function=a>\n<parameter=", "<function=a>\n</function>",
                                               "<function=b>\n<parameter=", "<function=b>\n</function>"]
    assert xml.forced_openings() == ["<parameter=", "</function>"]
    assert hermes.forced_prefix() == '<tool_call>\n{"name": "'
    assert hermes.forced_prefix("f") == '<tool_call>\n{"name": "f", "arguments":'
    assert hermes.forced_openings(["f"]) == ['f", "arguments": {"', 'f", "arguments": {}', 'f", "arguments": {\n']
    # every opening, after its prefix and with the rest of a call, is a call the form's parser reads
    endings = {"<parameter=": "x>\n1\n</parameter>\n</function>\n</tool_call>", "</function>": "\n</tool_call>",
               ' {"': 'x": 1}}\n</tool_call>', " {}": "}\n</tool_call>", " {\n": "}}\n</tool_call>"}
    for fmt in (xml, hermes):
        for opening in fmt.forced_openings(["get_time"]):
            text = opening + next(v for k, v in endings.items() if opening.endswith(k))
            parser = fmt.parser(fmt.forced_prefix(), None)
            pieces = parser.feed(text) + parser.finish()
            assert [p.name for p in pieces if isinstance(p, ParsedToolCall)] == ["get_time"], (fmt, text)


def test_the_agent_reads_xml_calls_in_text() -> None:
    """The fleet agent, behind an HTTP API, reads a reply's calls in the form they are written."""
    from fak.agent.exceptions import FormatError
    from fak.agent.protocols.tools import calls_in_text

    tools = ToolSet.from_openai([BASH, EDIT])
    actions = calls_in_text("Run it.\n" + call("bash", command="pytest -x -q"), tools)
    assert [(a.name, a.arguments) for a in actions] == [("bash", {"command": "pytest -x -q"})]
    with pytest.raises(FormatError, match="cut off"):
        calls_in_text("<tool_call>\n<function=bash>\n<parameter=command>\nrm -rf /tm", tools)


FRAGMENTS = ["<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>",
             "get_weather", "city", "days", ">", "\n", " ", "<", "=", "Paris", "3", "true", "{", "}", '"', "null",
             "é", "<tool_", "<func"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=40), st.integers(min_value=1, max_value=7))
def test_any_text_parses_the_same_in_any_deltas_and_never_raises(parts: list[str], step: int) -> None:
    text = "".join(parts)
    whole = _run([text])
    pieces = _run([text[i:i + step] for i in range(0, len(text), step)])

    def shape(ps: list) -> list:
        out: list = []
        for p in ps:
            if isinstance(p, ParsedToolCall):
                out.append(("call", p.name, p.arguments, p.raw))
            elif isinstance(p, RejectedCall):
                out.append(("rejected", p.text, p.problem.kind))
            elif out and out[-1][0] == "text":
                out[-1] = ("text", out[-1][1] + p.text)
            elif p.text:
                out.append(("text", p.text))
        return out

    assert shape(whole) == shape(pieces)
    for p in pieces:
        if isinstance(p, ParsedToolCall):
            assert isinstance(json.loads(p.arguments), dict)
