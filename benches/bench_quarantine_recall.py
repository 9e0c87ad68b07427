"""Injection-quarantine recall and false positives (issue 26), before and after a change, in one run.

What is measured, each with the detectors of the working tree ("after") and of ``--baseline-rev``
("before": ``python/fak/quarantine/detectors.py`` at that revision, loaded from ``git show``; it is
a self-contained module at the revisions before issue 26):

- Catch rate per family of ``tests/data/quarantine_injected.jsonl`` (the tuning corpus: the older
  six families and issue 26's seven) and of ``tests/data/quarantine_heldout.jsonl`` (70 injections
  written and committed before any tuning, never tuned on).
- Pass rate of ``tests/data/quarantine_benign.jsonl`` and ``tests/data/quarantine_hard_negatives.jsonl``.
- False positives per file on real repositories: every ``.py``, ``.md``, ``.rst``, ``.txt`` blob at
  the mirror's ``HEAD`` of each ``--repo GIT_DIR`` (read with ``git cat-file``, repository
  configuration neutralised; ``scripts/quarantine-fp-scan`` does the same for one detector set).
- False positives per file on every ``.py``, ``.md``, ``.rst``, ``.txt`` file of the virtual
  environment's ``site-packages`` (``--site-packages``; third-party code, docs and fixtures).

Nothing read is executed. Run (the mirrors come from the session's ``fetch`` tool or any bare clone):

    PYTHONPATH=python python benches/bench_quarantine_recall.py --baseline-rev 8702368 \\
        --repo /work/.mirror/psf+requests/repo --repo /work/.mirror/pytest-dev+pytest/repo \\
        --repo /work/.mirror/sphinx-doc+sphinx/repo --repo /work/.mirror/sympy+sympy/repo \\
        --heldout-repo /work/.mirror/Aider-AI+aider/repo ... --site-packages \\
        --out benches/results/quarantine-recall.md

Writes a markdown report (provenance MEASURED, date, machine, commits) to ``--out`` and prints it.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import platform
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

from fak.quarantine import scan  # noqa: E402

DATA = REPO / "tests" / "data"
EXTS = (".py", ".md", ".rst", ".txt")
_ENV = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0"}
Scan = Callable[[str], bool]


def _git(git_dir: str | Path, *args: str) -> list[str]:
    return ["git", "--git-dir", str(git_dir), "-c", "core.fsmonitor=false", "-c", "core.hooksPath=" + os.devnull,
            *args]


def _rows(name: str) -> list[dict]:
    return [json.loads(x) for x in (DATA / name).read_text(encoding="utf-8").splitlines() if x.strip()]


def baseline_scanner(rev: str) -> Scan:
    """``scan`` of ``python/fak/quarantine/detectors.py`` at git revision ``rev`` (the module must only
    import the standard library, as it did before issue 26)."""
    src = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:python/fak/quarantine/detectors.py"], check=True,
                         capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "fak_detectors_baseline.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("fak_detectors_baseline", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return lambda text: bool(mod.scan(text).fired)


def repo_texts(git_dir: str) -> tuple[str, Iterator[tuple[str, str]]]:
    """The ``HEAD`` commit of ``git_dir`` and its ``.py/.md/.rst/.txt`` UTF-8 text blobs up to 4 MiB."""
    commit = subprocess.run(_git(git_dir, "rev-parse", "HEAD"), check=True, capture_output=True, text=True,
                            env=_ENV).stdout.strip()
    out = subprocess.run(_git(git_dir, "ls-tree", "-r", "-l", "-z", commit), check=True, capture_output=True,
                         env=_ENV).stdout.decode("utf-8", "surrogateescape")
    rows = []
    for entry in out.split("\0"):
        if entry:
            meta, path = entry.split("\t", 1)
            _mode, kind, sha, size = meta.split()
            if kind == "blob" and size.isdigit() and int(size) <= 4 << 20 and path.endswith(EXTS):
                rows.append((path, sha))

    def gen() -> Iterator[tuple[str, str]]:
        cat = subprocess.Popen(_git(git_dir, "cat-file", "--batch"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               env=_ENV)
        assert cat.stdin is not None and cat.stdout is not None
        for path, sha in rows:
            cat.stdin.write(sha.encode() + b"\n")
            cat.stdin.flush()
            header = cat.stdout.readline().split()
            data = cat.stdout.read(int(header[2]))
            cat.stdout.read(1)
            if b"\0" in data[:8192]:
                continue
            try:
                yield path, data.decode("utf-8")
            except UnicodeDecodeError:
                continue
        cat.stdin.close()
        cat.wait()

    return commit, gen()


def site_texts(root: Path) -> Iterator[tuple[str, str]]:
    """Every ``.py/.md/.rst/.txt`` UTF-8 file up to 4 MiB under ``root`` (sorted)."""
    for p in sorted(root.rglob("*")):
        if p.suffix in EXTS and p.is_file() and p.stat().st_size <= 4 << 20:
            try:
                yield str(p.relative_to(root)), p.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue


def fp_count(texts: Iterator[tuple[str, str]], scanners: dict[str, Scan]) -> dict:
    """Files, bytes, and the withheld paths per scanner."""
    n, nbytes, hits, secs = 0, 0, {k: [] for k in scanners}, {k: 0.0 for k in scanners}
    for path, text in texts:
        n += 1
        nbytes += len(text.encode("utf-8", "surrogatepass"))
        for k, fn in scanners.items():
            t0 = time.perf_counter()
            if fn(text):
                hits[k].append(path)
            secs[k] += time.perf_counter() - t0
    return {"files": n, "bytes": nbytes, "hits": hits, "seconds": secs}


def families(rows: list[dict], scanners: dict[str, Scan]) -> tuple[dict, dict]:
    """Per family: count, and caught per scanner; and the ids each scanner missed."""
    table: dict[str, dict[str, int]] = collections.defaultdict(lambda: collections.Counter())
    missed: dict[str, list[str]] = {k: [] for k in scanners}
    for r in rows:
        table[r["family"]]["n"] += 1
        for k, fn in scanners.items():
            if fn(r["content"]):
                table[r["family"]][k] += 1
            else:
                missed[k].append(r["id"])
    return dict(table), missed


def _cpu() -> str:
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _pct(k: int, n: int) -> str:
    return f"{100 * k / max(n, 1):.2f}%"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline-rev", help="git revision whose detectors are the 'before' column")
    ap.add_argument("--repo", action="append", default=[], help="bare git dir: the task repositories (measured)")
    ap.add_argument("--heldout-repo", action="append", default=[],
                    help="bare git dir: held-out benign repositories (never tuned on)")
    ap.add_argument("--site-packages", action="store_true", help="also every file of this venv's site-packages")
    ap.add_argument("--out", default=str(REPO / "benches/results/quarantine-recall.md"))
    args = ap.parse_args()

    scanners: dict[str, Scan] = {}
    if args.baseline_rev:
        scanners["before"] = baseline_scanner(args.baseline_rev)
    scanners["after"] = lambda text: bool(scan(text).fired)
    cols = list(scanners)
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "python/fak/quarantine"],
                                capture_output=True, text=True).stdout.strip())
    lines = ["# Injection quarantine: catch rate per family and false positives on real files (issue 26)", "",
             f"## {date.today().isoformat()} — MEASURED", "",
             f"Machine: {_cpu()}, {os.cpu_count()} cores, Python {platform.python_version()}. Detectors: "
             f"\"after\" = working tree at `{head}`{' (with uncommitted changes in python/fak/quarantine)' if dirty else ''}"
             + (f", \"before\" = `python/fak/quarantine/detectors.py` at `{args.baseline_rev}`" if args.baseline_rev
                else "") + ".", "",
             "Command: `PYTHONPATH=python python benches/bench_quarantine_recall.py " + " ".join(
                 ([f"--baseline-rev {args.baseline_rev}"] if args.baseline_rev else [])
                 + [f"--repo {r}" for r in args.repo] + [f"--heldout-repo {r}" for r in args.heldout_repo]
                 + (["--site-packages"] if args.site_packages else [])) + "`", ""]

    for title, name in (("Tuning corpus (`tests/data/quarantine_injected.jsonl`)", "quarantine_injected.jsonl"),
                        ("Held-out injections (`tests/data/quarantine_heldout.jsonl`, written and committed before "
                         "tuning, never tuned on)", "quarantine_heldout.jsonl")):
        table, missed = families(_rows(name), scanners)
        lines += [f"### {title}", "", "| family | n | " + " | ".join(f"caught {c}" for c in cols) + " |",
                  "|---|---:|" + "---:|" * len(cols)]
        tot = collections.Counter()
        for fam, c in table.items():
            tot["n"] += c["n"]
            for k in cols:
                tot[k] += c[k]
            lines.append(f"| {fam} | {c['n']} | " + " | ".join(f"{c[k]}/{c['n']}" for k in cols) + " |")
        lines.append(f"| **all** | {tot['n']} | " + " | ".join(f"**{tot[k]}/{tot['n']}** ({_pct(tot[k], tot['n'])})"
                                                                for k in cols) + " |")
        lines += ["", f"Missed (after): {', '.join(missed['after']) or 'none'}.", ""]
        print("\n".join(lines[-len(table) - 6:]), flush=True)

    lines += ["### Benign corpora", "", "| file | n | " + " | ".join(f"withheld {c}" for c in cols) + " |",
              "|---|---:|" + "---:|" * len(cols)]
    for name in ("quarantine_benign.jsonl", "quarantine_hard_negatives.jsonl"):
        rows = _rows(name)
        fp = {k: [r["id"] for r in rows if fn(r["content"])] for k, fn in scanners.items()}
        lines.append(f"| `{name}` | {len(rows)} | " + " | ".join(
            f"{len(fp[k])}" + (f" ({', '.join(fp[k][:6])})" if fp[k] else "") for k in cols) + " |")
    lines.append("")

    for title, repos in (("Task repositories: every .py/.md/.rst/.txt at one commit", args.repo),
                         ("Held-out benign repositories (declared before tuning, scanned once tuning was done)",
                          args.heldout_repo)):
        if not repos:
            continue
        lines += [f"### {title}", "", "| repository | commit | files | MB | " + " | ".join(
            f"withheld {c}" for c in cols) + " | " + " | ".join(f"scan s {c}" for c in cols) + " |",
            "|---|---|---:|---:|" + "---:|" * (2 * len(cols))]
        tot = collections.Counter()
        withheld: list[str] = []
        for g in repos:
            commit, texts = repo_texts(g)
            r = fp_count(texts, scanners)
            name = Path(g).parent.name.replace("+", "/") if Path(g).name == "repo" else Path(g).name
            tot["files"] += r["files"]
            for k in cols:
                tot[k] += len(r["hits"][k])
            withheld += [f"{name}: `{p}`" for p in r["hits"]["after"]]
            lines.append(f"| {name} | `{commit}` | {r['files']} | {r['bytes'] / 1e6:.1f} | " + " | ".join(
                f"{len(r['hits'][k])} ({_pct(len(r['hits'][k]), r['files'])})" for k in cols)
                + " | " + " | ".join(f"{r['seconds'][k]:.1f}" for k in cols) + " |")
            print(lines[-1], flush=True)
        lines.append(f"| **all** | | {tot['files']} | | " + " | ".join(
            f"**{tot[k]} ({_pct(tot[k], tot['files'])})**" for k in cols) + " |" + " |" * len(cols))
        lines += ["", "Withheld (after): " + ("; ".join(withheld) if withheld else "none") + ".", ""]

    if args.site_packages:
        root = Path(sysconfig.get_paths()["purelib"])
        r = fp_count(site_texts(root), scanners)
        lines += ["### This virtual environment's site-packages (every .py/.md/.rst/.txt)", "",
                  f"{r['files']} files, {r['bytes'] / 1e6:.1f} MB: " + ", ".join(
                      f"withheld {k} {len(r['hits'][k])} ({_pct(len(r['hits'][k]), r['files'])})" for k in cols) + ".",
                  "", "Withheld (after): " + ("; ".join(f"`{p}`" for p in r["hits"]["after"]) or "none") + ".", ""]
        print(lines[-4], flush=True)

    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
