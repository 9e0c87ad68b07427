"""``Policy.decide`` never raises, whatever it is given: arbitrary JSON values and text
(hypothesis), arguments nested 1,000 deep, megabytes of text, odd types, commands far beyond the
analyzer's limits; and the audit log records every such verdict.

To add a case: add an input to ``ODD_INPUTS`` (it must give a Verdict) or a strategy to the
fuzz tests.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fak.policy import AuditLog, Policy, Verdict
from fak.policy.decide import MAX_ARGUMENTS_CHARS, MAX_ARGUMENTS_DEPTH
from fak.toolcalls.wire import arguments_digest

POLICY = Path(__file__).resolve().parents[1] / "examples" / "swebench-coding-agent-policy.json"
_POLICY = Policy.load(POLICY)


def deep_text(n: int) -> str:
    return '{"command": ' + "[" * n + "]" * n + "}"


def deep_dict(n: int) -> dict:
    d: dict = {"command": []}
    x = d["command"]
    for _ in range(n):
        y: list = []
        x.append(y)
        x = y
    return d


def nested_bash_c(levels: int, size: int) -> str:
    src = "ls " + "a" * size
    for _ in range(levels):
        src = "bash -c " + json.dumps(src)
    return src


ODD_INPUTS = [
    ("bash", deep_text(1000)), ("bash", deep_text(1000).encode()), ("bash", deep_dict(1000)),
    ("bash", "x" * (MAX_ARGUMENTS_CHARS + 1)), ("bash", b"\xff\xfe"), ("bash", 5), ("bash", None),
    ("bash", ["command"]), ("bash", '{"command": 5}'), ("bash", {"command": ["ls"]}),
    ("bash", bytearray(b'{"command": "ls"}')), ("bash", memoryview(b'{"command": "ls"}')),
    (None, "{}"), (["x"], "{}"), ("read", {"path": {"a": 1}}), ("read", '{"path": "\\u0000"}'),
    ("bash", {"command": nested_bash_c(10, 10000)}), ("bash", {"command": "\0" * 100}),
    ("bash", {"command": "$(" * 20000}), ("bash", '{"command": "' + "\\\\" * 50000 + '"}'),
    ("bash", {"command": "x" * 3_000_000}),
]


@pytest.mark.parametrize("tool, arguments", ODD_INPUTS,
                         ids=[f"odd{i}" for i in range(len(ODD_INPUTS))])
def test_odd_inputs_get_a_verdict(tool, arguments, tmp_path: Path) -> None:
    def alarm(*_):
        raise TimeoutError("decide did not finish")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(20)
    try:
        v = _POLICY.decide(tool, arguments, conversation="odd", workspace_root=str(tmp_path))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    _POLICY.reset_conversation("odd")
    assert isinstance(v, Verdict) and v.reason and v.rule
    with AuditLog(tmp_path / "audit.jsonl") as log:
        entry = log.record(conversation="odd", tool=str(tool), arguments=arguments
                           if isinstance(arguments, (str, bytes, dict)) else str(arguments),
                           verdict=v)
    assert entry["arguments_digest"].startswith("sha256:")


def test_deep_and_large_arguments_are_denied_with_a_reason() -> None:
    for args in (deep_text(1000), deep_dict(1000), deep_text(MAX_ARGUMENTS_DEPTH + 1)):
        v = _POLICY.decide("bash", args, workspace_root="/tmp")
        assert not v.allowed and v.rule == "arguments" and "nested deeper" in v.reason
    assert len(deep_text(1000)) < 5000
    v = _POLICY.decide("bash", '{"command": "' + "x" * MAX_ARGUMENTS_CHARS + '"}')
    assert not v.allowed and v.rule == "arguments" and "longer than" in v.reason
    ok = _POLICY.decide("bash", deep_text(MAX_ARGUMENTS_DEPTH - 1), workspace_root="/tmp")
    assert ok.rule != "arguments" or "nested" not in ok.reason
    # brackets inside strings are text, not nesting
    v = _POLICY.decide("bash", json.dumps({"command": "echo " + "[" * 5000}), workspace_root="/tmp")
    assert "nested deeper" not in v.reason


def test_long_nested_shell_is_denied_as_unparseable() -> None:
    v = _POLICY.decide("bash", {"command": nested_bash_c(10, 10000)}, workspace_root="/tmp")
    assert not v.allowed and v.rule == "tools.bash.on_unparseable"


def test_digest_never_raises() -> None:
    assert arguments_digest(deep_text(5000)).startswith("sha256:")
    assert arguments_digest(deep_dict(5000)).startswith("sha256:")
    assert arguments_digest({"a": 1}) == arguments_digest('{"a": 1}')


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=40),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8),
                                                                      children, max_size=4),
    max_leaves=30)
TOOLS = st.sampled_from(["bash", "read", "list", "search", "edit", "write", "submit", "nope", ""])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TOOLS, st.dictionaries(st.sampled_from(["command", "path", "content", "x"]), json_values,
                              max_size=3))
def test_fuzz_dict_arguments(tool: str, args: dict) -> None:
    v = _POLICY.decide(tool, args, conversation="fz", workspace_root="/nonexistent-ws")
    _POLICY.reset_conversation("fz")
    assert isinstance(v, Verdict) and v.reason


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TOOLS, json_values | st.text(max_size=80) | st.binary(max_size=80))
def test_fuzz_text_arguments(tool: str, value) -> None:
    text = value if isinstance(value, (str, bytes)) else json.dumps(value)
    v = _POLICY.decide(tool, text, conversation="fz", workspace_root="/nonexistent-ws")
    _POLICY.reset_conversation("fz")
    assert isinstance(v, Verdict) and v.reason
    assert arguments_digest(text).startswith("sha256:")


SHELL_ALPHABET = "ab $(){}[]'\"\\`|&;<>#~*?=-/.\n\t01\0rmgitpushkilfnd:!%^,@+"


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=SHELL_ALPHABET, max_size=120))
def test_fuzz_shell_commands(command: str) -> None:
    v = _POLICY.decide("bash", {"command": command}, conversation="fz",
                       workspace_root="/nonexistent-ws")
    _POLICY.reset_conversation("fz")
    assert isinstance(v, Verdict) and v.reason and v.rule != "internal", v
