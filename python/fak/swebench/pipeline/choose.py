"""Stage 2, ``choose``: the model picks the file, then the function, by sampled votes.

File vote: the issue and the ``locate`` files (``files`` at most) with their matching lines; each
of ``samples`` answers (the first greedy) votes for the listed path it names first. The
``max_files`` files with the most votes go on (ties: ``locate``'s order; no vote at all: the
best ``locate`` file). Function vote, per chosen file: the issue and the file's outline (at most
``outline_lines`` lines; definitions with ``locate`` hits marked ``*`` and always kept), each
answer voting for the outline name it names first. Locations are then taken round-robin over the
chosen files, most-voted function first, up to ``max_locations``.

A location's region (what ``repair`` shows, with line numbers) is the function's lines, or, for
a function or class longer than ``region_lines``, a window of that many lines around its best hit.
A file that is not Python (no outline) gets the window around its best hit.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from fak.swebench.pipeline.prompts import render
from fak.swebench.pipeline.sampler import Sampler, Usage
from fak.swebench.pipeline.source import Outline, Repo, Symbol


@dataclass
class ChooseConfig:
    """Budgets of the choose stage (see the module docstring); ``max_tokens`` per answer."""

    samples: int = 7
    temperature: float = 0.8
    files: int = 8
    hits_per_file: int = 4
    max_files: int = 2
    max_locations: int = 3
    outline_lines: int = 150
    region_lines: int = 120
    max_tokens: int = 48


def _args(header: str) -> str:
    i, j = header.find("("), header.rfind(")")
    return header[i:j + 1] if 0 <= i < j else ""


def render_outline(outline: Outline, hit_lines: set[int], max_lines: int = 150) -> str:
    """The outline as text: ``LINE* def|class Qualified.name(args)``, at most ``max_lines`` lines.

    Marked definitions (a hit inside, not inside a nested definition) are always kept, with their
    classes and neighbours; gaps are shown as ``...``."""
    syms = outline.symbols
    marked = set()
    for line in hit_lines:
        s = outline.enclosing(line)
        if s is not None:
            marked.add(s.name)
    rows = [f"{s.start:>6}{'*' if s.name in marked else ' '} {'    ' * s.depth}{s.kind} "
            f"{s.name}{_args(s.header)}" for s in syms]
    if len(rows) <= max_lines:
        return "\n".join(rows)
    keep: set[int] = set()
    for i, s in enumerate(syms):
        if s.name in marked:
            keep.update(range(max(0, i - 1), min(len(syms), i + 2)))
            parts = s.name.split(".")
            for k in range(1, len(parts)):
                parent = ".".join(parts[:k])
                keep.update(j for j, t in enumerate(syms) if t.name == parent)
    for i, s in enumerate(syms):  # then classes and top-level functions, then the rest
        if len(keep) >= max_lines:
            break
        if s.depth == 0:
            keep.add(i)
    for i in range(len(syms)):
        if len(keep) >= max_lines:
            break
        keep.add(i)
    out, gap = [], False
    for i, row in enumerate(rows):
        if i in keep:
            out.append(row)
            gap = False
        elif not gap:
            out.append("   ...")
            gap = True
    return "\n".join(out)


def _first_match(text: str, names: list[str]) -> str | None:
    best: tuple[int, int, str] | None = None
    for n in names:
        m = re.search(rf"(?<![\w.]){re.escape(n)}(?![\w])", text)
        if m and (best is None or (m.start(), -len(n)) < (best[0], best[1])):
            best = (m.start(), -len(n), n)
    return best[2] if best else None


def parse_path(reply: str, paths: list[str]) -> str | None:
    """The listed path an answer names first: the path itself, else a unique file name, else the
    list number it starts with."""
    hit = _first_match(reply, paths)
    if hit:
        return hit
    names: dict[str, list[str]] = {}
    for p in paths:
        names.setdefault(p.rsplit("/", 1)[-1], []).append(p)
    hit = _first_match(reply, [n for n, ps in names.items() if len(ps) == 1])
    if hit:
        return names[hit][0]
    m = re.match(r"\s*(\d+)[.)]?\s", reply + " ")
    if m and 1 <= int(m.group(1)) <= len(paths):
        return paths[int(m.group(1)) - 1]
    return None


def parse_symbol(reply: str, outline: Outline, preferred: list[str]) -> str | None:
    """The outline name an answer names first (qualified names; else a last part that is unique,
    or among several the one ``locate`` ranked first)."""
    names = [s.name for s in outline.symbols]
    hit = _first_match(reply, names)
    if hit:
        return hit
    tails: dict[str, list[str]] = {}
    for n in names:
        tails.setdefault(n.rsplit(".", 1)[-1], []).append(n)
    tail = _first_match(reply, list(tails))
    if tail is None:
        return None
    cands = tails[tail]
    for p in preferred:
        if p in cands:
            return p
    return cands[0]


def region_of(sym: Symbol | None, hit_lines: list[int], n_lines: int, region_lines: int) -> tuple[int, int]:
    """The lines shown for a location (see the module docstring)."""
    if sym is not None and sym.end - sym.start + 1 <= region_lines:
        return sym.start, sym.end
    lo, hi = (sym.start, sym.end) if sym is not None else (1, n_lines)
    inside = [h for h in hit_lines if lo <= h <= hi]
    center = inside[0] if inside else (lo + region_lines // 3 if sym is not None else 1)
    start = max(lo, center - region_lines // 3)
    end = min(hi, start + region_lines - 1)
    start = max(lo, min(start, end - region_lines + 1))
    return start, end


def choose(repo: Repo, issue: str, task: dict[str, Any], located: dict[str, Any],
           sampler: Sampler | None, cfg: ChooseConfig, usage: Usage, key: str) -> list[dict[str, Any]]:
    """The choose stage's records: ``file_sample``, ``file_votes``, ``function_sample``,
    ``function_votes`` and the ``location`` records (``rank``, ``path``, ``symbol``, ``start``,
    ``end``, ``votes``, ``file_votes``, ``how``)."""
    records: list[dict[str, Any]] = []
    files = located["files"][: cfg.files]
    if not files:
        return records
    system = render("system.j2", repo=task["repo"])
    paths = [f["path"] for f in files]
    file_votes: Counter[str] = Counter()
    if len(files) > 1 and sampler is not None:
        shown = [{"path": f["path"], "hits": f["hits"][: cfg.hits_per_file]} for f in files]
        prompt = render("choose_file.j2", issue=issue, repo=task["repo"], files=shown)
        samples = sampler.sample([{"role": "system", "content": system},
                                  {"role": "user", "content": prompt}], n=cfg.samples,
                                 key=f"{key}/file", temperature=cfg.temperature,
                                 max_tokens=cfg.max_tokens, stop=["\n\n"], usage=usage)
        for s in samples:
            vote = parse_path(s.text, paths)
            if vote:
                file_votes[vote] += 1
            records.append({"kind": "file_sample", **s.to_json(), "vote": vote})
    order = sorted(paths, key=lambda p: (-file_votes[p], paths.index(p)))
    n_files = max(1, min(cfg.max_files, cfg.max_locations))  # files that can give a location
    chosen = [p for p in order if file_votes[p] > 0][:n_files] or order[:1]
    records.append({"kind": "file_votes", "votes": dict(file_votes), "chosen": chosen})

    per_file: list[list[dict[str, Any]]] = []
    for path in chosen:
        f = files[paths.index(path)]
        hit_lines = [h["line"] for h in sorted(f["hits"], key=lambda h: -h["weight"])]
        outline = repo.outline(path)
        text = repo.text(path) or ""
        n_lines = len(text.splitlines())
        preferred = [s["name"] for s in f["symbols"]]
        votes: Counter[str] = Counter()
        how = "locate"
        if outline.symbols and sampler is not None:
            prompt = render("choose_function.j2", issue=issue, path=path,
                            outline=render_outline(outline, set(hit_lines), cfg.outline_lines))
            samples = sampler.sample([{"role": "system", "content": system},
                                      {"role": "user", "content": prompt}], n=cfg.samples,
                                     key=f"{key}/function/{path}", temperature=cfg.temperature,
                                     max_tokens=cfg.max_tokens, stop=["\n\n"], usage=usage)
            for s in samples:
                vote = parse_symbol(s.text, outline, preferred)
                if vote:
                    votes[vote] += 1
                records.append({"kind": "function_sample", "path": path, **s.to_json(), "vote": vote})
            how = "vote"
        names = sorted(votes, key=lambda n: (-votes[n], preferred.index(n) if n in preferred
                                             else len(preferred), n))
        if not names:
            names = [n for n in preferred if outline.find(n)][:1]
            how = "locate"
        records.append({"kind": "function_votes", "path": path, "votes": dict(votes)})
        locs = []
        for name in names or [None]:
            sym = outline.find(name) if name else None
            start, end = region_of(sym, hit_lines, n_lines, cfg.region_lines)
            locs.append({"path": path, "symbol": sym.name if sym else None, "start": start,
                         "end": end, "votes": votes.get(name, 0) if name else 0,
                         "file_votes": file_votes.get(path, 0), "how": how})
        per_file.append(locs)
    rank = 0
    for depth in range(max((len(x) for x in per_file), default=0)):
        for locs in per_file:
            if depth < len(locs) and rank < cfg.max_locations:
                records.append({"kind": "location", "rank": rank, **locs[depth]})
                rank += 1
    return records
