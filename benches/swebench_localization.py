"""Where the staged pipeline loses the gold location (issue 31: "localization that a 1.5B can
do"): an OFFLINE analysis of a run's recorded artifacts against the gold patches — never part of
a run (nothing in ``fak swebench run`` reads a gold patch; this reads them afterwards, as
``eval`` does).

Per instance, the gold patch's files (test files left out: ``fak.agent.search.path_kind``) and the line ranges its hunks
replace in them (``@@ -a,b``), then, stage by stage:

- ``locate`` (no model): the rank of the first gold file among its scored files (hit@1/@3/@8);
- ``choose`` (the model's file vote): whether the most-voted file is a gold file, whether a gold
  file is among the voted ones at all;
- ``locations`` (the function vote; what ``repair`` is shown): whether one is in a gold file, and
  whether one's line range overlaps a gold hunk (a function-level hit);
- ``repair``: the share of candidates that change a gold file, and whether any candidate's hunks
  overlap a gold hunk;
- ``rank``: whether the chosen candidate changes a gold file.

Usage::

    python benches/swebench_localization.py --artifacts RUN/pipeline --dataset rows.jsonl [--json out.json]

(``RUN/pipeline`` holds ``ID/locate.jsonl``, ``choose.jsonl``, ``repair.jsonl``, ``rank.jsonl``;
the committed run of 2026-12-02 is ``benches/results/swebench-gpu-2026-12-02/pipeline-artifacts.tar.xz``.)
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from fak.agent.search import path_kind

_FILE = re.compile(r"^\+\+\+ b/(.+)$", re.MULTILINE)
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@", re.MULTILINE)


def hunks(diff: str) -> dict[str, list[tuple[int, int]]]:
    """``{path: [(first, last) old line of each hunk]}`` of a unified diff (a pure insertion
    counts as the line it follows)."""
    out: dict[str, list[tuple[int, int]]] = {}
    sections = re.split(r"^diff --git ", diff, flags=re.MULTILINE)
    for sec in sections:
        m = _FILE.search(sec)
        if not m:
            continue
        path = m.group(1).strip()
        for h in _HUNK.finditer(sec):
            start, n = int(h.group(1)), int(h.group(2) or 1)
            out.setdefault(path, []).append((start, start + max(n, 1) - 1))
    return out


def _records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()[1:] if line.strip()]


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def analyse(inst_dir: Path, row: dict) -> dict:
    gold = {p: r for p, r in hunks(row["patch"]).items() if path_kind(p) != "test"}
    out: dict = {"instance_id": row["instance_id"], "gold_files": sorted(gold)}
    files = [r for r in _records(inst_dir / "locate.jsonl") if r.get("kind") == "file"]
    ranks = [r.get("rank", i) for i, r in enumerate(files) if r.get("path") in gold]
    out["locate_rank"] = min(ranks) if ranks else None
    out["locate_files"] = len(files)
    choose = _records(inst_dir / "choose.jsonl")
    votes = next((r.get("votes") or {} for r in choose if r.get("kind") == "file_votes"), {})
    top = max(votes.items(), key=lambda kv: kv[1])[0] if votes else None
    out["vote_top_is_gold"] = top in gold if top else None
    out["vote_has_gold"] = any(p in gold for p in votes) if votes else None
    locs = [r for r in choose if r.get("kind") == "location"]
    out["locations"] = len(locs)
    out["location_in_gold_file"] = any(r.get("path") in gold for r in locs)
    out["location_on_gold_hunk"] = any(
        r.get("path") in gold and r.get("start") is not None
        and any(_overlaps((r["start"], r.get("end") or r["start"]), g) for g in gold[r["path"]]) for r in locs)
    cands = [r for r in _records(inst_dir / "repair.jsonl") if r.get("kind") == "candidate"]
    ch = [hunks(c.get("diff") or "") for c in cands]
    out["candidates"] = len(cands)
    out["candidates_in_gold_file"] = sum(1 for h in ch if any(p in gold for p in h))
    out["candidate_on_gold_hunk"] = any(
        any(_overlaps(x, g) for p, xs in h.items() if p in gold for x in xs for g in gold[p]) for h in ch)
    chosen = next((r for r in _records(inst_dir / "rank.jsonl") if r.get("kind") == "chosen"), None)
    diff = (chosen or {}).get("diff") or ""
    if not diff and chosen and chosen.get("id"):
        diff = next((c.get("diff") or "" for c in cands if c.get("id") == chosen["id"]), "")
    out["chosen_in_gold_file"] = any(p in gold for p in hunks(diff)) if diff else None
    return out


def summary(rows: list[dict]) -> dict:
    n = len(rows)

    def count(pred) -> int:
        return sum(1 for r in rows if pred(r))

    return {
        "instances": n,
        "locate_hit@1": count(lambda r: r["locate_rank"] == 0),
        "locate_hit@3": count(lambda r: r["locate_rank"] is not None and r["locate_rank"] < 3),
        "locate_hit@8": count(lambda r: r["locate_rank"] is not None and r["locate_rank"] < 8),
        "vote_top_is_gold": count(lambda r: r["vote_top_is_gold"]),
        "vote_has_gold": count(lambda r: r["vote_has_gold"]),
        "location_in_gold_file": count(lambda r: r["location_in_gold_file"]),
        "location_on_gold_hunk": count(lambda r: r["location_on_gold_hunk"]),
        "any_candidate_in_gold_file": count(lambda r: r["candidates_in_gold_file"] > 0),
        "any_candidate_on_gold_hunk": count(lambda r: r["candidate_on_gold_hunk"]),
        "chosen_in_gold_file": count(lambda r: r["chosen_in_gold_file"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--artifacts", type=Path, required=True, help="RUN/pipeline (one folder per instance)")
    ap.add_argument("--dataset", type=Path, required=True, help="the rows' jsonl (with their gold patch)")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    rows = {r["instance_id"]: r for r in map(json.loads, a.dataset.read_text().splitlines()) if r}
    out = [analyse(d, rows[d.name]) for d in sorted(a.artifacts.iterdir()) if d.is_dir() and d.name in rows]
    s = summary(out)
    print("| instance | gold files | locate rank | vote top gold | voted gold | loc. in gold file | loc. on gold hunk | candidates in gold file | cand. on gold hunk | chosen in gold file |")
    print("|---|---|---:|---|---|---|---|---:|---|---|")
    yn = {True: "yes", False: "no", None: "–"}
    for r in out:
        print(f"| {r['instance_id']} | {', '.join(r['gold_files'])} | {'–' if r['locate_rank'] is None else r['locate_rank'] + 1} "
              f"| {yn[r['vote_top_is_gold']]} | {yn[r['vote_has_gold']]} | {yn[r['location_in_gold_file']]} "
              f"| {yn[r['location_on_gold_hunk']]} | {r['candidates_in_gold_file']}/{r['candidates']} "
              f"| {yn[r['candidate_on_gold_hunk']]} | {yn[r['chosen_in_gold_file']]} |")
    print(json.dumps(s))
    if a.json:
        a.json.write_text(json.dumps({"summary": s, "instances": out}, indent=1))


if __name__ == "__main__":
    main()
