"""The policy corpus: every tool call in ``tests/data/policy_corpus.jsonl`` gets its expected
verdict, and the rule that decided it is the expected one.

Each line is one call::

    {"id": ..., "policy": "swebench" | "strict", "tool": ..., "arguments": {...} | "<json>",
     "expected": "allow" | "deny", "rule": "tools.bash.deny[0]" (optional),
     "workspace": "what the call relies on in the layout" (optional),
     "workspace_root": false (optional: decide without a workspace root), "why": ...}

``swebench`` is ``examples/swebench-coding-agent-policy.json``; ``strict`` is
``tests/data/policy_strict.json``. ``{ws}`` and ``{outside}`` in string arguments become the
real workspace and outside folders. The workspace is built on disk for each test module run
(:func:`workspace`), real symlinks included:

    tmp/ws/          the workspace root: src/pkg/{__init__,mod}.py, tests/test_x.py, file.py,
                     script.py, setup.py, README.md, requirements.txt, list.txt, build/lib/x.o,
                     escape -> ../outside, secret_link -> ../outside/secret.txt,
                     inner_link -> src, dangling -> ../outside/missing/new.txt, etc_link -> /etc
    tmp/outside/     secret.txt (what must never be reached)

To add a case: append a line to the JSONL with its expected verdict and, for a denial, the rule
id you expect; run this file.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from fak.policy import Policy

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "data" / "policy_corpus.jsonl"
POLICIES = {
    "swebench": REPO / "examples" / "swebench-coding-agent-policy.json",
    "strict": REPO / "tests" / "data" / "policy_strict.json",
}


def load_corpus() -> list[dict]:
    """The corpus entries, in file order."""
    with open(CORPUS, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


ENTRIES = load_corpus()


def build_workspace(base: Path) -> tuple[Path, Path]:
    """Create the corpus layout under ``base``; returns ``(workspace, outside)``."""
    ws = base / "ws"
    outside = base / "outside"
    for d in ("src/pkg", "tests", "build/lib"):
        (ws / d).mkdir(parents=True, exist_ok=True)
    outside.mkdir(exist_ok=True)
    for f in ("src/pkg/__init__.py", "src/pkg/mod.py", "tests/test_x.py", "file.py", "script.py",
              "setup.py", "README.md", "requirements.txt", "list.txt", "build/lib/x.o"):
        (ws / f).write_text("x = 1\n")
    (outside / "secret.txt").write_text("secret\n")
    os.symlink("../outside", ws / "escape")
    os.symlink("../outside/secret.txt", ws / "secret_link")
    os.symlink("src", ws / "inner_link")
    os.symlink("../outside/missing/new.txt", ws / "dangling")
    os.symlink("/etc", ws / "etc_link")
    return ws, outside


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return build_workspace(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def policies() -> dict[str, Policy]:
    return {name: Policy.load(path) for name, path in POLICIES.items()}


def substitute(arguments, ws: Path, outside: Path):
    """Replace ``{ws}``/``{outside}`` in the string values (or the JSON string) of arguments."""
    def sub(s: str) -> str:
        return s.replace("{ws}", str(ws)).replace("{outside}", str(outside))
    if isinstance(arguments, str):
        return sub(arguments)
    return {k: sub(v) if isinstance(v, str) else v for k, v in arguments.items()}


def test_corpus_size_and_coverage() -> None:
    assert len(ENTRIES) >= 80
    ids = [e["id"] for e in ENTRIES]
    assert len(ids) == len(set(ids)), "corpus ids must be unique"
    verdicts = Counter(e["expected"] for e in ENTRIES)
    assert verdicts["allow"] >= 40 and verdicts["deny"] >= 80
    for e in ENTRIES:
        assert e["expected"] in ("allow", "deny"), e["id"]
        assert e.get("why"), f"{e['id']}: say why"
        assert e.get("policy", "swebench") in POLICIES, e["id"]
        if e["expected"] == "deny":
            assert e.get("rule"), f"{e['id']}: a denial names the rule expected to decide it"


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["id"] for e in ENTRIES])
def test_corpus_entry(entry: dict, workspace: tuple[Path, Path],
                      policies: dict[str, Policy]) -> None:
    ws, outside = workspace
    policy = policies[entry.get("policy", "swebench")]
    args = substitute(entry["arguments"], ws, outside)
    root = ws if entry.get("workspace_root", True) else None
    conversation = f"corpus-{entry['id']}"
    v = policy.decide(entry["tool"], args, conversation=conversation, workspace_root=root)
    policy.reset_conversation(conversation)
    want = entry["expected"] == "allow"
    assert v.allowed is want, (f"{entry['id']}: expected {entry['expected']} ({entry['why']}), "
                               f"got {v}")
    assert v.reason
    if "rule" in entry:
        assert v.rule == entry["rule"], f"{entry['id']}: decided by {v.rule}: {v.reason}"
    if want:
        assert v.rule.startswith(f"tools.{entry['tool']}") or v.rule == "default"


def test_corpus_outside_untouched(workspace: tuple[Path, Path]) -> None:
    """Deciding never touches the file system beyond reading it."""
    _, outside = workspace
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
