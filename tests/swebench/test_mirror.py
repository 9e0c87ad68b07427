"""``fak swebench mirror``: compact mirrors with only the needed commits, shallow, from a local
source mirror; a workspace clones from one as from a full mirror, and the pipeline and the fleet
run on it. On the real repositories of the smoke slice where their full mirrors are here
(``~/.cache/fak/repos``; skipped otherwise, as ``test_real_instance.py`` does).

To add a case: a dataset slice, the repositories and commits the mirror must hold (or not).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from fak.swebench.repos import DEFAULT_CACHE, ensure_mirror, find_mirror, make_workspace
from test_real_instance import SMOKE
from tiny import make_instances, run_fak


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=False)


def test_mirror_of_a_tiny_dataset_holds_only_its_commits(tmp_path):
    t = make_instances(tmp_path / "tiny")
    future = _git(t["src"], "rev-parse", "HEAD").stdout.strip()
    assert future != t["base_commit"]
    out = tmp_path / "compact"
    proc = run_fak("swebench", "mirror", "--dataset", str(t["dataset"]), "--out", str(out),
                   "--from", str(t["repos"]), timeout=120)
    assert proc.returncode == 0, proc.stderr
    dest = out / "fak-test" / "calc"
    assert (dest / "HEAD").is_file() and (dest / "shallow").is_file()
    assert _git(dest, "cat-file", "-e", f"{t['base_commit']}^{{commit}}").returncode == 0
    assert _git(dest, "cat-file", "-e", f"{future}^{{commit}}").returncode != 0  # the future is not there
    assert _git(dest, "rev-list", "--all").stdout.split() == [t["base_commit"]]
    manifest = json.loads((out / "mirror-manifest.json").read_text())
    entry = manifest["repos"]["fak-test/calc"]
    assert entry["base_commits"] == [t["base_commit"]] and entry["fetched"] == [t["base_commit"]]
    assert entry["bytes"] > 0 and manifest["total_bytes"] == entry["bytes"]
    # a second run fetches nothing
    proc = run_fak("swebench", "mirror", "--dataset", str(t["dataset"]), "--out", str(out),
                   "--from", str(t["repos"]), timeout=120)
    assert proc.returncode == 0 and "0 fetched" in proc.stdout
    # a workspace from it is the base commit's tree, and grading/diffing works as on a full mirror
    mirror = ensure_mirror("fak-test/calc", out, commit=t["base_commit"])
    ws = make_workspace(mirror, t["base_commit"], tmp_path / "ws")
    assert (ws.root / "calc.py").read_text().startswith("def add(a, b):\n    return a - b")
    assert not (ws.root / "CHANGES.md").exists()
    (ws.root / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    assert "+    return a + b" in ws.diff(t["base_commit"])
    # the fleet runs on it too (a scripted submit: the clone and the diff)
    from fak.agent.scripted import ScriptedServer

    with ScriptedServer({"*": []}) as server:
        proc = run_fak("swebench", "run", "--gateway", server.url.removeprefix("http://"),
                       "--model", "m", "--dataset", str(t["dataset"]), "--repos", str(out),
                       "--output", str(tmp_path / "fleet"), "--no-live", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads((tmp_path / "fleet" / "predictions.json").read_text())) == 2


def test_mirror_fails_clearly_for_a_commit_the_source_lacks(tmp_path):
    t = make_instances(tmp_path / "tiny")
    rows = [json.loads(ln) for ln in t["dataset"].read_text().splitlines()]
    rows[0]["base_commit"] = "0" * 40
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = run_fak("swebench", "mirror", "--dataset", str(bad), "--out", str(tmp_path / "c"),
                   "--from", str(t["repos"]), timeout=120)
    assert proc.returncode == 1 and "fak-test/calc: FAILED" in proc.stderr


@pytest.mark.parametrize("repo", ["psf/requests", "pytest-dev/pytest"])
def test_mirror_of_the_smoke_slice_is_small(repo, tmp_path):
    if find_mirror(DEFAULT_CACHE, repo) is None:
        pytest.skip(f"no mirror of {repo} in {DEFAULT_CACHE}; make one: git clone --mirror "
                    f"https://github.com/{repo} {DEFAULT_CACHE}/{repo}")
    rows = [json.loads(ln) for ln in SMOKE.read_text().splitlines()]
    ids = [r["instance_id"] for r in rows if r["repo"] == repo]
    out = tmp_path / "compact"
    proc = run_fak("swebench", "mirror", "--dataset", str(SMOKE), "--filter", ",".join(ids),
                   "--out", str(out), "--from", str(DEFAULT_CACHE), timeout=600)
    assert proc.returncode == 0, proc.stderr
    entry = json.loads((out / "mirror-manifest.json").read_text())["repos"][repo]
    assert entry["bytes"] < 3_000_000, entry["bytes"]  # the issue measured 0.9 / 1.3 MB
    assert entry["tags"]  # setuptools_scm finds a version in a clone
    row = next(r for r in rows if r["repo"] == repo)
    ws = make_workspace(ensure_mirror(repo, out, commit=row["base_commit"]), row["base_commit"],
                        tmp_path / "ws")
    full = _git(find_mirror(DEFAULT_CACHE, repo), "ls-tree", "-r", "--name-only", row["base_commit"])
    assert _git(ws.root, "ls-files").stdout == full.stdout
    assert _git(ws.root, "describe", "--tags").returncode == 0
