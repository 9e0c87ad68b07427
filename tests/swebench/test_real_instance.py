"""``eval --local`` on real SWE-bench Verified instances from ``../shared/swebench``: the gold patch
resolves, a patch that does not fix the bug does not.

The repositories come from a local mirror cache (``$FAK_REPOS_CACHE`` or ``~/.cache/fak/repos``,
laid out ``OWNER/NAME``), cloned from GitHub on first use. Where GitHub is unreachable and no
mirror is there, the test is skipped with the command that makes the mirror. The env is built
from PyPI with the spec of ``swebench`` 4.1.0 (Python 3.9 from pyenv) and cached in
``~/.cache/fak/swebench-envs``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tiny import run_fak

from fak.swebench.repos import DEFAULT_CACHE, RepoError, ensure_mirror

_REPO = Path(__file__).resolve().parents[2]
# shared/ sits beside the checkout in CI; worktrees here see it at /work/shared
SHARED = next((p for p in (Path(os.environ.get("FAK_SHARED", _REPO.parent / "shared")) / "swebench",
                           Path("/work/shared/swebench")) if p.is_dir()),
              _REPO.parent / "shared" / "swebench")
SMOKE = SHARED / "verified-smoke.jsonl"
META = SHARED / "verified-smoke.meta.jsonl"


def _row(iid: str) -> dict:
    if not SMOKE.exists():
        pytest.fail(f"the shared SWE-bench rows are missing: {SMOKE}")
    return next(json.loads(ln) for ln in SMOKE.read_text().splitlines() if iid in ln)


def _mirror(row: dict) -> Path:
    try:
        return ensure_mirror(row["repo"], None, commit=row["base_commit"])
    except RepoError as e:
        pytest.skip(f"no mirror of {row['repo']} in {DEFAULT_CACHE} and GitHub unreachable ({e}); "
                    f"make one: git clone --mirror https://github.com/{row['repo']} "
                    f"{DEFAULT_CACHE}/{row['repo']}")


@pytest.mark.slow
@pytest.mark.parametrize("iid", ["pytest-dev__pytest-7236", "psf__requests-2931"])
def test_real_instance_gold_resolves_and_noop_does_not(iid, tmp_path):
    row = _row(iid)
    meta = next(json.loads(ln) for ln in META.read_text().splitlines() if iid in ln)
    _mirror(row)
    # a patch that applies but does not fix anything: a new file
    noop = ("diff --git a/fak_noop.txt b/fak_noop.txt\nnew file mode 100644\n--- /dev/null\n"
            "+++ b/fak_noop.txt\n@@ -0,0 +1 @@\n+no fix here\n")
    preds = tmp_path / "preds.json"
    preds.write_text(json.dumps([{"instance_id": iid, "model_name_or_path": "gold",
                                  "model_patch": row["patch"]}]))
    out = tmp_path / "eval"
    proc = run_fak("swebench", "eval", "--local", "--predictions", str(preds), "--dataset", str(SMOKE),
                   "--repos", str(DEFAULT_CACHE), "--output", str(out), "--run-id", "gold",
                   timeout=1200)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "report.json").read_text())
    detail = report["instances"][iid]
    assert report["resolved_ids"] == [iid], detail
    assert report["sandbox"]["method"] in ("bwrap", "unshare")  # installs and tests sandboxed
    ts = detail["tests_status"]
    assert len(ts["FAIL_TO_PASS"]["success"]) == meta["n_F2P"]
    assert len(ts["PASS_TO_PASS"]["success"]) == meta["n_P2P"]
    assert detail["env"] == f"{row['repo'].replace('/', '__')}__{row['version']}"

    preds.write_text(json.dumps([{"instance_id": iid, "model_name_or_path": "noop",
                                  "model_patch": noop}]))
    proc = run_fak("swebench", "eval", "--local", "--predictions", str(preds), "--dataset", str(SMOKE),
                   "--repos", str(DEFAULT_CACHE), "--output", str(tmp_path / "eval2"),
                   "--run-id", "noop", timeout=1200)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "eval2" / "report.json").read_text())
    assert report["unresolved_ids"] == [iid]
    ts = report["instances"][iid]["tests_status"]
    assert len(ts["FAIL_TO_PASS"]["failure"]) == meta["n_F2P"]
    assert len(ts["PASS_TO_PASS"]["success"]) == meta["n_P2P"]
