"""The shipped per-agent policies (``examples/policies/``): each agent's own tools under the
coding-agent policy's rules, with the same deny reasons and the same audit records.

- the files are what ``scripts/make-agent-policies`` writes from the coding-agent policy;
- every ``bash`` entry of ``tests/data/policy_corpus.jsonl`` gets the coding agent's verdict,
  reason and rule number through each agent's shell tool (Claude Code's ``Bash``, Codex's
  ``exec_command``, ``shell`` as command lines, Qwen Code's ``run_shell_command``), and the same
  verdict through Codex's argv form (``["bash", "-lc", COMMAND]``);
- ``tests/data/agent_tool_calls.jsonl``: file, network and agent-specific tools (hostile
  arguments are data there, never in code). To add a case, append a line with ``policy``,
  ``tool``, ``arguments`` (``{ws}``/``{outside}`` are replaced), ``expected`` and ``rule``.
"""

from __future__ import annotations

import json
import runpy
from pathlib import Path
from typing import Any

import pytest
from fak.policy import AuditLog, Policy
from test_policy_corpus import ENTRIES, build_workspace, substitute

REPO = Path(__file__).resolve().parents[1]
AGENTS = REPO / "examples" / "policies"
CALLS = [json.loads(line) for line in (REPO / "tests" / "data" / "agent_tool_calls.jsonl").read_text(
    encoding="utf-8").splitlines() if line.strip()]
BASH = [e for e in ENTRIES if e["tool"] == "bash" and e.get("policy", "swebench") == "swebench"
        and isinstance(e["arguments"], dict) and isinstance(e["arguments"].get("command"), str)]
#: (policy file, tool, argument builder) of every agent's shell tool
SHELLS = [
    ("claude-code", "Bash", lambda c: {"command": c, "description": "run"}),
    ("codex", "exec_command", lambda c: {"cmd": c}),
    ("codex", "shell", lambda c: {"commands": [c]}),
    ("qwen-code", "run_shell_command", lambda c: {"command": c}),
    ("mini-swe-agent", "bash", lambda c: {"command": c}),
    ("aider", "bash", lambda c: {"command": c}),
]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return build_workspace(tmp_path_factory.mktemp("agents"))


@pytest.fixture(scope="module")
def policies() -> dict[str, Policy]:
    out = {p.stem: Policy.load(p) for p in AGENTS.glob("*.json")}
    out["swebench"] = Policy.load(REPO / "examples" / "swebench-coding-agent-policy.json")
    return out


def test_files_are_generated() -> None:
    script = runpy.run_path(str(REPO / "scripts" / "make-agent-policies"))
    built = script["build"]()
    assert sorted(built) == sorted(p.name for p in AGENTS.glob("*.json"))
    for name, obj in built.items():
        assert (AGENTS / name).read_text(encoding="utf-8") == script["render"](obj), \
            f"{name} is out of date: run scripts/make-agent-policies"


N_BASH_RULES = len(json.loads((REPO / "examples" / "swebench-coding-agent-policy.json").read_text())["tools"]["bash"]["deny"])


def _rule(rule: str, prefix: str) -> str:
    """A rule id without its tool, deny numbers taken per argument (a tool with two command
    arguments, Codex's ``shell``, has the coding agent's rules once for each)."""
    rest = rule.removeprefix(prefix)
    if rest.startswith(".deny["):
        return f".deny[{int(rest[6:].split(']')[0]) % N_BASH_RULES}]"
    return rest


def _decide(policy: Policy, tool: str, args: Any, ws: Path, key: str) -> Any:
    v = policy.decide(tool, args, conversation=key, workspace_root=ws)
    policy.reset_conversation(key)
    return v


@pytest.mark.parametrize("agent,tool,build", SHELLS, ids=[f"{a}:{t}" for a, t, _ in SHELLS])
def test_shell_tools_have_the_coding_agents_verdicts(agent: str, tool: str, build: Any,
                                                     workspace: tuple[Path, Path],
                                                     policies: dict[str, Policy]) -> None:
    ws, outside = workspace
    base, mine = policies["swebench"], policies[agent]
    arg = next(iter(build("x")))  # reasons about an unparseable command name its argument
    for e in BASH:
        command = substitute(e["arguments"], ws, outside)["command"]
        want = _decide(base, "bash", {"command": command}, ws, "base")
        got = _decide(mine, tool, build(command), ws, "agent")
        assert got.allowed == want.allowed, (e["id"], got, want)
        if not want.allowed:
            assert got.reason == want.reason.replace("`command`", f"`{arg}`"), e["id"]
        assert _rule(got.rule, f"tools.{tool}") == _rule(want.rule, "tools.bash"), (e["id"], got, want)


def test_codex_argv_form(workspace: tuple[Path, Path], policies: dict[str, Policy]) -> None:
    """``shell`` with Codex's argv ``["bash", "-lc", COMMAND]``: joined as the shell quotes it and
    followed into ``bash -c``, the same verdict as the command itself."""
    ws, outside = workspace
    differ = []
    for e in BASH:
        command = substitute(e["arguments"], ws, outside)["command"]
        want = _decide(policies["swebench"], "bash", {"command": command}, ws, "base")
        got = _decide(policies["codex"], "shell", {"command": ["bash", "-lc", command]}, ws, "agent")
        if got.allowed != want.allowed:
            differ.append((e["id"], got.reason, want.reason))
    assert not differ, differ


@pytest.mark.parametrize("entry", CALLS, ids=[e["id"] for e in CALLS])
def test_agent_tool_call(entry: dict[str, Any], workspace: tuple[Path, Path], policies: dict[str, Policy]) -> None:
    ws, outside = workspace
    args = substitute(entry["arguments"], ws, outside)
    v = _decide(policies[entry["policy"]], entry["tool"], args, ws, entry["id"])
    assert v.allowed is (entry["expected"] == "allow"), (entry["id"], entry["why"], v)
    if "rule" in entry:
        assert v.rule == entry["rule"], (entry["id"], v)


def test_same_audit_records(tmp_path: Path, workspace: tuple[Path, Path], policies: dict[str, Policy]) -> None:
    """A Claude Code ``Bash`` denial is recorded as the coding agent's ``bash`` one: same verdict,
    reason and digest of the same arguments; only the tool name and the rule's tool differ."""
    ws, _ = workspace
    args = {"command": "git push origin main"}
    with AuditLog(tmp_path / "a.jsonl") as audit:
        for policy, tool in ((policies["swebench"], "bash"), (policies["claude-code"], "Bash")):
            audit.record(conversation="c", tool=tool, arguments=args,
                         verdict=_decide(policy, tool, args, ws, "audit"))
    a, b = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert list(a) == list(b)
    for key in ("conversation", "arguments_digest", "verdict", "reason"):
        assert a[key] == b[key], key
    assert (a["tool"], b["tool"]) == ("bash", "Bash") and a["rule"].replace("bash", "Bash") == b["rule"]
