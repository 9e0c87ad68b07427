"""The policy engine: file validation (every error, with its location), compilation, decisions,
budgets (per conversation, thread-safe), the audit log and the ``--policy-check`` entry point.

The shell analyzer has its own file (``test_policy_shell.py``); the corpus of tool calls with
expected verdicts is ``test_policy_corpus.py``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path

import pytest

import fak
from fak_subprocess import fak_env
from fak.policy import AuditLog, Policy, PolicyError, Verdict, check_file, check_main

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "swebench-coding-agent-policy.json"


def minimal(**tools) -> dict:
    return {"version": 1, "default": {"verdict": "deny", "reason": "unknown tool"},
            "tools": tools}


def write_json(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj, indent=2))
    return path


# ------------------------------------------------------------------------------ validation


def test_example_policy_is_valid() -> None:
    assert check_file(EXAMPLE) == []
    p = Policy.load(EXAMPLE)
    assert set(p.file.tools) == {"read", "list", "search", "edit", "write", "bash", "submit"}
    assert p.file.default.verdict == "deny"


def test_every_error_is_listed_with_its_location(tmp_path: Path) -> None:
    doc = {
        "version": 1,
        "default": {"verdict": "maybe", "reason": "x"},
        "colour": "blue",
        "budgets": {"total": {"max_calls": -1, "reason": "r"}},
        "tools": {
            "bash": {
                "deny": [
                    {"argument": "command", "regex": "sudo", "reason": "r"},
                    {"argument": "command", "check": "no_such_check", "reason": "r"},
                    {"argument": "command", "regex": "(unclosed", "reason": "r"},
                    {"argument": "command", "regex": "x", "check": "git_push", "reason": "r"},
                    {"argument": "command", "check": "git_push", "match": "raw", "reason": "r"},
                    {"argument": "command", "regex": "x", "reason": ""},
                    {"argument": "command", "regex": "x", "reason": "r", "flags": "i"},
                ],
                "paths": [{"argument": "path", "reason": "r", "extra_roots": ["relative/dir"]}],
                "allowed": "yes",
            },
            "edit": {"allowed": False},
            "read": {"paths": [{"reason": "no argument"}]},
        },
    }
    errors = check_file(write_json(tmp_path / "bad.json", doc))
    text = "\n".join(errors)
    expected = [
        "default.verdict:",
        "colour: unknown field",
        "budgets.total.max_calls: Expected `int` >= 0",
        "tools.bash.deny[1].check: unknown check 'no_such_check'",
        "tools.bash.deny[2].regex: invalid regular expression",
        "tools.bash.deny[3]: give exactly one of `regex` or `check`",
        "tools.bash.deny[4].match: only regex rules have `match`",
        "tools.bash.deny[5].reason:",
        "tools.bash.deny[6].flags: unknown field",
        "tools.bash.paths[0].extra_roots[0]: must be an absolute path",
        "tools.bash.allowed: Expected `bool`",
        "tools.edit.reason: a tool that is not allowed needs a reason",
        "tools.read.paths[0].argument: missing required field",
    ]
    for e in expected:
        assert any(line.startswith(e) for line in errors), f"missing {e!r} in:\n{text}"
    assert not any(line.startswith("tools.bash.deny[0]") for line in errors)
    with pytest.raises(PolicyError) as info:
        Policy.from_dict(doc)
    assert info.value.errors == errors
    assert isinstance(info.value, fak.FakError) and isinstance(info.value, ValueError)
    assert "tools.bash.deny[2].regex" in str(info.value)


def test_json_syntax_error_has_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text('{\n  "version": 1,\n  "default": {"verdict": "deny" "reason": "x"}\n}\n')
    errors = check_file(path)
    assert len(errors) == 1
    assert "line 3 column" in errors[0] and "invalid JSON" in errors[0]


def test_duplicate_keys_are_errors(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text('{"version": 1, "default": {"verdict": "deny", "reason": "x"},'
                    ' "tools": {"bash": {}, "bash": {"allowed": false, "reason": "r"}}}')
    assert check_file(path) == ['tools.bash: given more than once']


def test_version_and_missing_fields() -> None:
    with pytest.raises(PolicyError) as info:
        Policy.from_dict({"version": 2, "default": {"verdict": "deny", "reason": "x"}})
    assert info.value.errors[0].startswith("version: unsupported policy version 2")
    with pytest.raises(PolicyError) as info:
        Policy.from_dict({"tools": {}})
    assert "version: missing required field" in info.value.errors
    assert "default: missing required field" in info.value.errors
    with pytest.raises(PolicyError) as info:
        Policy.from_dict([1, 2])
    assert info.value.errors == ["(document): expected an object, got an array"]


def test_unreadable_file() -> None:
    errors = check_file("/nonexistent/policy.json")
    assert len(errors) == 1 and errors[0].startswith("(file): cannot read")


def test_check_main_prints_ok_or_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert check_main(EXAMPLE) == 0
    assert capsys.readouterr().out == "OK\n"
    bad = write_json(tmp_path / "bad.json", minimal(bash={"deny": [{"argument": "command",
                                                                    "regex": "(", "reason": "r"}]}))
    assert check_main(bad) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"{bad}: tools.bash.deny[0].regex: invalid regular expression")


def test_check_module_entry_point(tmp_path: Path) -> None:
    env = fak_env()
    ok = subprocess.run([sys.executable, "-m", "fak.policy.check", str(EXAMPLE)],
                        capture_output=True, text=True, env=env)
    assert (ok.returncode, ok.stdout) == (0, "OK\n")
    bad = write_json(tmp_path / "bad.json", {"version": 1})
    res = subprocess.run([sys.executable, "-m", "fak.policy.check", str(bad)],
                         capture_output=True, text=True, env=env)
    assert res.returncode == 1 and "default: missing required field" in res.stderr


# ------------------------------------------------------------------------------ decisions


def test_verdict_shape_and_rule_ids(tmp_path: Path) -> None:
    p = Policy.load(EXAMPLE)
    v = p.decide("bash", {"command": "git status"}, workspace_root=tmp_path)
    assert v == Verdict(True, "allowed by tools.bash", "tools.bash")
    v = p.decide("bash", '{"command": "sudo id"}', workspace_root=tmp_path)
    assert isinstance(v, Verdict) and v.allowed is False
    assert v.rule == "tools.bash.deny[2]" and v.reason.startswith("privilege escalation")
    assert "`sudo id`" in v.reason
    assert p.decide("frobnicate", {}).rule == "default"


@pytest.mark.parametrize("arguments, fragment", [
    ("{not json", "not valid JSON"),
    ('{"command": "ls"', "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('"ls"', "must be a JSON object"),
    ("", "not valid JSON"),
    (b"\xff\xfe", "not valid JSON"),
])
def test_arguments_that_are_not_a_json_object(arguments, fragment: str) -> None:
    v = Policy.load(EXAMPLE).decide("bash", arguments, workspace_root="/tmp")
    assert (v.allowed, v.rule) == (False, "arguments")
    assert fragment in v.reason


def test_string_and_dict_arguments_agree(tmp_path: Path) -> None:
    p = Policy.load(EXAMPLE)
    for command in ("ls", "rm -rf /", "curl x | sh", "git push"):
        a = p.decide("bash", {"command": command}, workspace_root=tmp_path)
        b = p.decide("bash", json.dumps({"command": command}), workspace_root=tmp_path)
        assert a == b


def test_default_allow_and_disallowed_tool() -> None:
    doc = minimal(shell={"allowed": False, "reason": "no shell here"}, read={})
    doc["default"] = {"verdict": "allow", "reason": "anything else goes"}
    p = Policy.from_dict(doc)
    assert p.decide("whatever", {}) == Verdict(True, "anything else goes", "default")
    assert p.decide("shell", {"cmd": "ls"}) == Verdict(False, "no shell here", "tools.shell.allowed")
    assert p.decide("read", {"path": "/etc/passwd"}) == Verdict(True, "allowed by tools.read",
                                                                 "tools.read")


def test_path_scopes(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (tmp_path / "data").mkdir()
    os.symlink(tmp_path / "data", ws / "data_link")
    doc = minimal(read={"paths": [{"argument": "path", "reason": "stay in",
                                   "extra_roots": [str(tmp_path / "data")]}]},
                  list={"paths": [{"argument": "path", "reason": "stay in", "optional": True}]})
    p = Policy.from_dict(doc)
    assert p.decide("read", {"path": "src/x.py"}, workspace_root=ws).allowed
    assert p.decide("read", {"path": str(tmp_path / "data" / "f")}, workspace_root=ws).allowed
    assert p.decide("read", {"path": "data_link/f"}, workspace_root=ws).allowed
    v = p.decide("read", {"path": "../other"}, workspace_root=ws)
    assert (v.allowed, v.rule) == (False, "tools.read.paths[0]")
    assert "outside the workspace" in v.reason and str(tmp_path / "other") in v.reason
    assert p.decide("list", {}, workspace_root=ws).allowed
    assert not p.decide("list", {"path": "/"}, workspace_root=ws).allowed
    v = p.decide("read", {"path": "src/x.py"})
    assert not v.allowed and "no workspace root is known" in v.reason
    # the workspace root given as a path object, or fixed in the file
    doc["workspace_root"] = str(ws)
    p2 = Policy.from_dict(doc)
    assert p2.decide("read", {"path": "src/x.py"}).allowed
    assert not p2.decide("read", {"path": "../x"}).allowed
    assert not p2.decide("read", {"path": "src/x.py"}, workspace_root=tmp_path / "elsewhere"
                         ).allowed is False  # the caller's root wins over the file's


def test_workspace_root_symlink_is_resolved(tmp_path: Path) -> None:
    real = tmp_path / "real_ws"
    (real / "src").mkdir(parents=True)
    os.symlink(real, tmp_path / "ws_link")
    p = Policy.from_dict(minimal(read={"paths": [{"argument": "path", "reason": "r"}]}))
    assert p.decide("read", {"path": str(real / "src" / "a.py")},
                    workspace_root=tmp_path / "ws_link").allowed
    assert p.decide("read", {"path": "src/a.py"}, workspace_root=tmp_path / "ws_link").allowed


def test_rule_order_first_match_wins(tmp_path: Path) -> None:
    doc = minimal(bash={"deny": [
        {"argument": "command", "match": "normalized", "regex": "^git ", "reason": "no git"},
        {"argument": "command", "check": "git_push", "reason": "no push"},
        {"argument": "command", "regex": "push", "reason": "the word push"},
    ]})
    p = Policy.from_dict(doc)
    assert p.decide("bash", {"command": "git push"}).rule == "tools.bash.deny[0]"
    assert p.decide("bash", {"command": "echo push"}).rule == "tools.bash.deny[2]"
    doc["tools"]["bash"]["deny"].reverse()
    p = Policy.from_dict(doc)
    assert p.decide("bash", {"command": "git push"}).rule == "tools.bash.deny[0]"
    assert p.decide("bash", {"command": "git -C . push"}).rule == "tools.bash.deny[0]"
    assert p.decide("bash", {"command": "git status"}).rule == "tools.bash.deny[2]"


def test_rules_on_several_arguments() -> None:
    doc = minimal(search={"deny": [
        {"argument": "path", "regex": "^/proc", "reason": "no procfs"},
        {"argument": "pattern", "regex": "(?i)password", "reason": "no password hunting"},
    ]})
    p = Policy.from_dict(doc)
    assert p.decide("search", {"pattern": "x", "path": "/proc/1"}).rule == "tools.search.deny[0]"
    assert p.decide("search", {"pattern": "PassWord"}).rule == "tools.search.deny[1]"
    assert p.decide("search", {"pattern": "PassWord", "path": "/proc"}).rule == \
        "tools.search.deny[0]"
    assert p.decide("search", {"pattern": "def main"}).allowed
    v = p.decide("search", {"pattern": ["x"]})
    assert (v.allowed, v.rule) == (False, "tools.search.deny[1]")
    assert "must be a string" in v.reason


def test_allow_list() -> None:
    doc = minimal(bash={
        "deny": [{"argument": "command", "check": "git_push", "reason": "no push"}],
        "allow": {"reason": "only tests, git and grep", "rules": [
            {"argument": "command", "match": "normalized", "regex": r"^(python -m pytest|pytest)( |$)",
             "reason": "tests"},
            {"argument": "command", "match": "normalized", "regex": r"^(git|grep|head|tail)( |$)",
             "reason": "read-only tools"},
            {"argument": "command", "regex": r"^echo hello$", "reason": "the greeting"},
        ]}})
    p = Policy.from_dict(doc)
    assert p.decide("bash", {"command": "python -m pytest -x"}).rule == "tools.bash.allow.rules[0]"
    v = p.decide("bash", {"command": "git log | head -5"})
    assert v.allowed and v.rule == "tools.bash.allow.rules[0]"
    assert p.decide("bash", {"command": "echo hello"}).rule == "tools.bash.allow.rules[2]"
    v = p.decide("bash", {"command": "git log; make install"})
    assert (v.allowed, v.rule, v.reason) == (False, "tools.bash.allow", "only tests, git and grep")
    assert not p.decide("bash", {"command": "echo hello; rm x"}).allowed
    assert p.decide("bash", {"command": "git push"}).rule == "tools.bash.deny[0]"
    assert not p.decide("bash", {"command": "pytest 'x"}).allowed
    with pytest.raises(PolicyError) as info:
        Policy.from_dict(minimal(bash={"allow": {"reason": "r", "rules": [
            {"argument": "command", "check": "git_push", "reason": "r"}]}}))
    assert info.value.errors == ["tools.bash.allow.rules[0].check: allow rules are regexes; "
                                 "named checks only deny"]
    with pytest.raises(PolicyError) as info:
        Policy.from_dict(minimal(bash={"allow": {"reason": "r", "rules": []}}))
    assert info.value.errors[0].startswith("tools.bash.allow.rules:")


def test_unparseable_shell_fails_closed_unless_told(tmp_path: Path) -> None:
    rules = [{"argument": "command", "check": "rm_recursive_force", "reason": "no rm -rf"},
             {"argument": "command", "match": "normalized", "regex": "^sudo", "reason": "no sudo"}]
    strict = Policy.from_dict(minimal(bash={"deny": rules}))
    v = strict.decide("bash", {"command": "echo 'oops"})
    assert (v.allowed, v.rule) == (False, "tools.bash.on_unparseable")
    assert "unterminated single quote" in v.reason
    lenient = Policy.from_dict(minimal(bash={
        "deny": rules, "on_unparseable": {"verdict": "allow", "reason": "best effort"}}))
    assert lenient.decide("bash", {"command": "echo 'oops"}).allowed
    # normalized regexes still see the raw text when the shell cannot be parsed
    v = lenient.decide("bash", {"command": "sudo echo 'oops"})
    assert (v.allowed, v.rule) == (False, "tools.bash.deny[1]")


def test_raw_regex_screens_agree_with_single_rules() -> None:
    """The merged screen regex must never hide a rule: every rule alone and together agree."""
    pats = [r"/dev/(tcp|udp)/", r"(?i:secret)", r"\bpasswd\b", r"x{3,}"]
    together = Policy.from_dict(minimal(t={"deny": [
        {"argument": "a", "regex": p, "reason": f"r{i}"} for i, p in enumerate(pats)]}))
    for text in ["cat /dev/tcp/x/1", "SECRET", "the passwd file", "xxxx", "fine", "passwd xxx"]:
        want = None
        for i, pat in enumerate(pats):
            alone = Policy.from_dict(minimal(t={"deny": [{"argument": "a", "regex": pat,
                                                           "reason": "r"}]}))
            if not alone.decide("t", {"a": text}).allowed:
                want = f"tools.t.deny[{i}]"
                break
        v = together.decide("t", {"a": text})
        assert (None if v.allowed else v.rule) == want, text


def test_inline_global_flags_cannot_be_merged_but_still_work() -> None:
    p = Policy.from_dict(minimal(t={"deny": [
        {"argument": "a", "regex": "(?i)secret", "reason": "r0"},
        {"argument": "a", "regex": "(?s)a.b", "reason": "r1"}]}))
    assert p.decide("t", {"a": "SeCrEt"}).rule == "tools.t.deny[0]"
    assert p.decide("t", {"a": "a\nb"}).rule == "tools.t.deny[1]"
    assert p.decide("t", {"a": "ok"}).allowed


# ------------------------------------------------------------------------------ budgets


def budget_policy(tool_max: int = 3, total_max: int = 5) -> Policy:
    doc = minimal(bash={"budget": {"max_calls": tool_max, "reason": "bash budget spent"}},
                  read={}, submit={"budget": {"max_calls": 1, "reason": "already submitted"}})
    doc["budgets"] = {"total": {"max_calls": total_max, "reason": "budget spent"}}
    return Policy.from_dict(doc)


def test_budgets_per_tool_and_total() -> None:
    p = budget_policy()
    assert [p.decide("bash", {"command": "ls"}, conversation="a").allowed for _ in range(4)] == \
        [True, True, True, False]
    v = p.decide("bash", {"command": "ls"}, conversation="a")
    assert (v.rule, v.reason) == ("tools.bash.budget",
                                  "bash budget spent (at most 3 calls of `bash` per conversation)")
    assert p.decide("read", {}, conversation="a").allowed
    assert p.decide("read", {}, conversation="a").allowed
    v = p.decide("read", {}, conversation="a")
    assert (v.allowed, v.rule) == (False, "budgets.total")
    assert p.usage("a") == {"bash": 3, "read": 2, "*": 5}


def test_budgets_are_per_conversation_and_resettable() -> None:
    p = budget_policy()
    for conv in ("a", "b"):
        assert p.decide("submit", {}, conversation=conv).allowed
        assert p.decide("submit", {}, conversation=conv).rule == "tools.submit.budget"
    assert p.usage("a") == p.usage("b") == {"submit": 1, "*": 1}
    p.reset_conversation("a")
    assert p.usage("a") == {}
    assert p.decide("submit", {}, conversation="a").allowed
    assert not p.decide("submit", {}, conversation="b").allowed


def test_denied_calls_do_not_spend_budget(tmp_path: Path) -> None:
    doc = minimal(bash={"budget": {"max_calls": 2, "reason": "spent"},
                        "deny": [{"argument": "command", "check": "git_push", "reason": "no"}]})
    p = Policy.from_dict(doc)
    for _ in range(5):
        assert not p.decide("bash", {"command": "git push"}, conversation="c").allowed
    assert p.usage("c") == {}
    assert p.decide("bash", {"command": "ls"}, conversation="c").allowed
    assert p.decide("bash", {"command": "ls"}, conversation="c").allowed
    assert p.decide("bash", {"command": "ls"}, conversation="c").rule == "tools.bash.budget"


def test_budgets_are_thread_safe() -> None:
    """32 threads race on one conversation: exactly the budget is allowed, never more."""
    p = budget_policy(tool_max=1000, total_max=1500)
    allowed = []
    lock = threading.Lock()
    barrier = threading.Barrier(32)

    def worker(k: int) -> None:
        barrier.wait()
        n = 0
        for i in range(100):
            tool = "bash" if (k + i) % 2 == 0 else "read"
            args = {"command": "ls"} if tool == "bash" else {}
            if p.decide(tool, args, conversation="shared").allowed:
                n += 1
            p.decide("bash", {"command": "ls"}, conversation=f"own-{k}")
        with lock:
            allowed.append(n)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(allowed) == 1500
    usage = p.usage("shared")
    assert usage["*"] == 1500 and usage["bash"] <= 1000 and usage["bash"] + usage["read"] == 1500
    assert all(p.usage(f"own-{k}") == {"bash": 100, "*": 100} for k in range(32))


def test_example_budgets() -> None:
    p = Policy.load(EXAMPLE)
    assert p.decide("submit", {}, conversation="x").allowed
    assert p.decide("submit", {}, conversation="x").rule == "tools.submit.budget"
    assert all(p.decide("list", {}, conversation="y", workspace_root="/tmp").allowed
               for _ in range(200))
    assert p.decide("list", {}, conversation="y", workspace_root="/tmp").rule == "budgets.total"


# ------------------------------------------------------------------------------ audit log


def canonical_digest(obj) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def test_audit_log_lines(tmp_path: Path) -> None:
    p = Policy.load(EXAMPLE)
    path = tmp_path / "logs" / "audit.jsonl"
    calls = [("bash", '{"command": "git push", "x": "é s3cr3t"}'), ("bash", {"command": "ls"}),
             ("read", {"path": "../x"}), ("nope", "{bad json")]
    with AuditLog(path) as audit:
        for tool, args in calls:
            v = p.decide(tool, args, conversation="conv-1", workspace_root=tmp_path)
            entry = audit.record(conversation="conv-1", tool=tool, arguments=args, verdict=v)
            assert entry["verdict"] == ("allow" if v.allowed else "deny")
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 4
    entries = [json.loads(line) for line in lines]
    for e, (tool, args) in zip(entries, calls):
        assert list(e) == ["time", "conversation", "tool", "arguments_digest", "verdict",
                           "reason", "rule"]
        t = datetime.fromisoformat(e["time"].replace("Z", "+00:00"))
        assert t.tzinfo is not None and t.utcoffset().total_seconds() == 0
        assert abs((datetime.now(timezone.utc) - t).total_seconds()) < 60
        assert e["conversation"] == "conv-1" and e["tool"] == tool
    assert [e["verdict"] for e in entries] == ["deny", "allow", "deny", "deny"]
    assert [e["rule"] for e in entries] == ["tools.bash.deny[6]", "tools.bash",
                                           "tools.read.paths[0]", "arguments"]
    assert entries[0]["arguments_digest"] == canonical_digest({"x": "é s3cr3t",
                                                               "command": "git push"})
    assert entries[1]["arguments_digest"] == canonical_digest({"command": "ls"})
    assert entries[3]["arguments_digest"] == \
        "sha256:" + hashlib.sha256(b"{bad json").hexdigest()
    # arguments are hashed, never stored; a denial's reason quotes only what matched
    assert "s3cr3t" not in path.read_text()
    assert "(git push)" in entries[0]["reason"]


def test_audit_log_is_thread_safe_and_appends(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_text('{"earlier": true}\n')
    v = Verdict(False, "r" * 500, "tools.bash.deny[0]")
    with AuditLog(path) as audit:
        def worker(k: int) -> None:
            for i in range(200):
                audit.record(conversation=f"c{k}", tool="bash",
                             arguments={"command": "x" * (i % 50), "i": i}, verdict=v)
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    lines = path.read_text().splitlines()
    assert lines[0] == '{"earlier": true}'
    entries = [json.loads(line) for line in lines[1:]]
    assert len(entries) == 1600
    assert {e["conversation"] for e in entries} == {f"c{k}" for k in range(8)}
    with pytest.raises(ValueError):
        audit.record(conversation="c", tool="t", arguments={}, verdict=v)


def test_policy_is_not_mutated_by_deciding(tmp_path: Path) -> None:
    doc = json.loads(EXAMPLE.read_text())
    before = copy.deepcopy(doc)
    p = Policy.from_dict(doc)
    p.decide("bash", {"command": "rm -rf /"}, workspace_root=tmp_path)
    assert doc == before
    assert p.file == Policy.from_dict(before).file
