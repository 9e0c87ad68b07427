"""The evasion corpus: every call in ``tests/data/policy_evasions.jsonl`` gets its expected verdict
from the coding-agent policy (``examples/swebench-coding-agent-policy.json``).

Each line is one ``bash`` call, a known way around a deny-list over shell text or a benign
look-alike that must stay allowed::

    {"id": ..., "family": "nul-ansi" | "heredoc-expansion" | ..., "tool": "bash",
     "arguments": {"command": ...}, "expected": "allow" | "deny", "why": ...,
     "workspace": "what the call relies on in the layout" (optional)}

The corpus is data: it is read by Python here and executed only inside the sandbox (the sandbox's
canary tests run every case there). Never paste one of its commands into a shell.

The calls are decided against the layout of ``tests/test_policy_corpus.py`` plus ``tools/del``
(a copy of the system's ``rm`` binary) and ``tools/lrm`` (a symlink to it), so that running a
renamed program by path is decided on real files. A table of denied/allowed per family is
printed at the end of the run.

To add a case: append a line with its family, expected verdict and why; run this file.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from pathlib import Path

import pytest

from fak.policy import Policy

from test_policy_corpus import build_workspace

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "data" / "policy_evasions.jsonl"
POLICY = REPO / "examples" / "swebench-coding-agent-policy.json"
FAMILIES = {"nul-ansi", "heredoc-expansion", "stdin-program", "renamed-binary", "inline-code",
            "find-delete", "kill-forkbomb", "git-exec", "write-outside", "wrapper", "env-dump",
            "credentials"}


def load_evasions() -> list[dict]:
    """The corpus entries, in file order."""
    with open(CORPUS, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


ENTRIES = load_evasions()


def build_evasion_workspace(base: Path) -> Path:
    """The corpus layout of ``test_policy_corpus`` plus ``tools/del`` (a copy of ``rm``) and
    ``tools/lrm`` (a symlink to it); returns the workspace root."""
    ws, _ = build_workspace(base)
    rm = os.path.realpath(shutil.which("rm") or "/bin/rm")
    (ws / "tools").mkdir()
    shutil.copy(rm, ws / "tools" / "del")
    os.symlink(rm, ws / "tools" / "lrm")
    return ws


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_evasion_workspace(tmp_path_factory.mktemp("evasions"))


@pytest.fixture(scope="module")
def policy() -> Policy:
    return Policy.load(POLICY)


def test_corpus_shape() -> None:
    assert len(ENTRIES) >= 150
    ids = [e["id"] for e in ENTRIES]
    assert len(ids) == len(set(ids)), "corpus ids must be unique"
    for e in ENTRIES:
        assert set(e) <= {"id", "family", "tool", "arguments", "expected", "why", "workspace"}, e
        assert e["family"] in FAMILIES, e["id"]
        assert e["tool"] == "bash" and isinstance(e["arguments"]["command"], str), e["id"]
        assert e["expected"] in ("allow", "deny"), e["id"]
        assert e.get("why"), f"{e['id']}: say why"
    per_family = Counter((e["family"], e["expected"]) for e in ENTRIES)
    for family in FAMILIES:
        assert per_family[(family, "deny")] >= 10, family
        assert per_family[(family, "allow")] >= 3, family


def decide_all(policy: Policy, ws: Path) -> list[tuple[dict, object]]:
    """Every corpus call decided once (budgets reset between calls)."""
    out = []
    for e in ENTRIES:
        v = policy.decide("bash", e["arguments"], conversation="evasions", workspace_root=ws)
        policy.reset_conversation("evasions")
        out.append((e, v))
    return out


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["id"] for e in ENTRIES])
def test_evasion(entry: dict, workspace: Path, policy: Policy) -> None:
    v = policy.decide("bash", entry["arguments"], conversation=f"ev-{entry['id']}",
                      workspace_root=workspace)
    want = entry["expected"] == "allow"
    assert v.allowed is want, (f"{entry['id']}: expected {entry['expected']} ({entry['why']}), "
                               f"got {v}")
    assert v.reason
    if not want:
        # a denial comes from a rule that understood the command, not from a parse failure
        assert v.rule.startswith("tools.bash.deny["), f"{entry['id']}: {v}"


def test_summary_by_family(workspace: Path, policy: Policy, capsys: pytest.CaptureFixture) -> None:
    """Print denied/allowed per family; every verdict must be the expected one."""
    got: Counter = Counter()
    wrong = []
    for e, v in decide_all(policy, workspace):
        verdict = "allow" if v.allowed else "deny"
        got[(e["family"], e["expected"], verdict)] += 1
        if verdict != e["expected"]:
            wrong.append(e["id"])
    rows = ["family               attacks denied/allowed   look-alikes allowed/denied"]
    for family in sorted(FAMILIES):
        dd, da = got[(family, "deny", "deny")], got[(family, "deny", "allow")]
        aa, ad = got[(family, "allow", "allow")], got[(family, "allow", "deny")]
        rows.append(f"{family:20} {dd:7}/{da:<7}          {aa:7}/{ad}")
    with capsys.disabled():
        print("\npolicy_evasions.jsonl with the coding-agent policy:\n" + "\n".join(rows))
    assert not wrong, wrong
