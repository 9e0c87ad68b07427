"""Stage 1, ``locate``: rank the files (and in them the functions) the issue points at, without a
model.

From the issue's ``Clues`` (``clues.py``): traceback frames and ``#L`` links are mapped to tracked
files by their longest path suffix; mentioned paths and dotted module names likewise; error
messages (and their literal fragments) and identifiers are searched with a fixed-string
``git grep`` over the non-test source at ``base_commit`` (``source.is_source_path``). Every hit is
mapped to its enclosing function/class with ``ast`` (``source.Outline``).

Score of a file (a sum; the weights are ``WEIGHTS``): a traceback frame or link in it; its path
mentioned; an error text found in it; and for each identifier found in it, the identifier's
strength in the issue (1-3, ``Clues.identifiers``) times its inverse document frequency
``log(1 + N / df)`` over the N source files (``df``: files containing it), doubled where the file
defines it (``def NAME`` / ``class NAME`` / ``NAME =``) or its path names it. Symbols are scored
the same way from the hits inside them.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from fak.swebench.pipeline.clues import Clues, extract
from fak.swebench.pipeline.source import Repo, is_source_path

WEIGHTS = {"frame": 8.0, "frame_last": 4.0, "link": 10.0, "path": 6.0, "module": 4.0,
           "error": 8.0, "error_fragment": 5.0}
#: identifier hits in a package's ``__init__.py`` (mostly re-exports) count this much
INIT_FACTOR = 0.5
#: pathspecs that keep git grep out of tests and docs (``is_source_path`` filters the rest)
SOURCE_PATHSPECS = [":(exclude,glob)**/tests/**", ":(exclude,glob)**/test/**",
                    ":(exclude,glob)**/testing/**", ":(exclude,glob)**/test_*.py",
                    ":(exclude,glob)**/doc/**", ":(exclude,glob)**/docs/**",
                    ":(exclude,glob)**/examples/**", ":(exclude,glob)**/benchmarks/**"]


@dataclass
class LocateConfig:
    """``max_files``: files kept in the artifact; ``max_hits``: hits kept per file;
    ``max_identifiers``: identifiers searched (strongest first); ``max_error_lines``: an error
    text found on more lines than this is too unspecific to count; ``max_df``: an identifier in
    more than this share of the source files (the package's own name) does not count."""

    max_files: int = 12
    max_hits: int = 8
    max_identifiers: int = 48
    max_error_lines: int = 20
    max_df: float = 0.3


@dataclass
class _File:
    score: float = 0.0
    reasons: list[str] = field(default_factory=list)
    hits: dict[int, dict[str, Any]] = field(default_factory=dict)

    def hit(self, line: int, text: str, why: str, weight: float) -> None:
        h = self.hits.setdefault(line, {"line": line, "text": text.strip()[:200], "why": [],
                                        "weight": 0.0})
        if why not in h["why"]:
            h["why"].append(why)
            h["weight"] += weight
        if not h["text"] and text:
            h["text"] = text.strip()[:200]


def resolve_path(mentioned: str, files: list[str], file_set: set[str]) -> str | None:
    """The tracked file a mentioned path means: the longest suffix of its parts that is a tracked
    path (``/usr/lib/python3.6/site-packages/sympy/core/evalf.py`` → ``sympy/core/evalf.py``); a
    bare file name only when it is unique; a module path also as ``.py`` or ``/__init__.py``."""
    p = mentioned.replace("\\", "/").strip().lstrip("~").strip("/")
    parts = [x for x in p.split("/") if x not in ("", ".", "..")]
    if not parts:
        return None
    for k in range(len(parts), 0, -1):
        cand = "/".join(parts[-k:])
        for c in (cand, f"{cand}.py", f"{cand}/__init__.py"):
            if k >= 2 and c in file_set:
                return c
            if k >= 2 and f"src/{c}" in file_set:
                return f"src/{c}"
        if k == 1 and "." in cand:
            same = [f for f in files if f == cand or f.endswith("/" + cand)]
            if len(same) == 1:
                return same[0]
    return None


def _defines(text: str, name: str) -> bool:
    s = text.lstrip()
    return (s.startswith((f"def {name}(", f"class {name}(", f"class {name}:", f"async def {name}("))
            or re.match(rf"^{re.escape(name)}\s*=", text) is not None)


def locate(repo: Repo, issue: str, config: LocateConfig | None = None) -> dict[str, Any]:
    """Rank files and symbols for ``issue`` in ``repo``.

    Returns ``{"clues": Clues.to_json(), "files": [{"path", "score", "reasons", "hits": [{"line",
    "text", "why", "weight", "symbol"}], "symbols": [{"name", "start", "end", "score"}]}]}``,
    best first; scores rounded to 3 decimals (deterministic for a given tree and issue).
    """
    cfg = config or LocateConfig()
    clues: Clues = extract(issue)
    files = repo.files
    file_set = set(files)
    source = [f for f in files if is_source_path(f)]
    source_set = set(source)
    n_source = max(1, len(source))
    scored: dict[str, _File] = defaultdict(_File)

    def add(path: str, weight: float, reason: str) -> None:
        f = scored[path]
        f.score += weight
        if reason not in f.reasons:
            f.reasons.append(reason)

    # traceback frames, links, mentioned paths
    in_repo_frames = [(resolve_path(p, files, file_set), line, fn) for p, line, fn in clues.frames]
    in_repo_frames = [(p, line, fn) for p, line, fn in in_repo_frames if p in source_set]
    for i, (path, line, fn) in enumerate(in_repo_frames):
        last = i == len(in_repo_frames) - 1
        add(path, WEIGHTS["frame"] + (WEIGHTS["frame_last"] if last else 0.0), f"traceback {line}")
        if line:
            scored[path].hit(line, (repo.text(path) or "").splitlines()[line - 1]
                             if line <= len((repo.text(path) or "").splitlines()) else "",
                             f"traceback {fn}".strip(), WEIGHTS["frame"])
    for p, line in clues.links:
        path = resolve_path(p, files, file_set)
        if path in source_set:
            add(path, WEIGHTS["link"], "link")
            if line:
                scored[path].hit(line, "", "link", WEIGHTS["link"])
    for p in clues.paths:
        path = resolve_path(p, files, file_set)
        if path in source_set:
            kind = "path" if p.endswith((".py", ".pyx", ".c", ".h")) else "module"
            add(path, WEIGHTS[kind], f"{kind} {p}")

    # error texts
    for frag in clues.errors:
        rows = [r for r in repo.grep([frag], words=False, paths=SOURCE_PATHSPECS)
                if r[0] in source_set]
        if not rows or len(rows) > cfg.max_error_lines:
            continue
        kind = "error" if frag == (clues.errors[0] if clues.errors else None) else "error_fragment"
        w = WEIGHTS[kind] / math.sqrt(len({r[0] for r in rows}))
        for path, line, text in rows:
            add(path, w, f"error text {frag[:40]!r}")
            scored[path].hit(line, text, "error text", w)

    # identifiers
    idents = sorted(clues.identifiers.items(), key=lambda kv: (-kv[1], kv[0]))[: cfg.max_identifiers]
    names = [n for n, _ in idents]
    strength = dict(idents)
    rows = [r for r in repo.grep(names, words=True, paths=SOURCE_PATHSPECS) if r[0] in source_set]
    patterns = {n: re.compile(rf"(?<![\w]){re.escape(n)}(?![\w])") for n in names}
    per_file: dict[str, dict[str, list[tuple[int, str]]]] = defaultdict(lambda: defaultdict(list))
    for path, line, text in rows:
        for n, pat in patterns.items():
            if n in text and pat.search(text):
                per_file[path][n].append((line, text))
    df: dict[str, int] = defaultdict(int)
    for found in per_file.values():
        for n in found:
            df[n] += 1
    idf = {n: math.log(1.0 + n_source / df[n]) for n in df}
    common = {n for n in df if df[n] > cfg.max_df * n_source and n_source >= 20}
    for path, found in per_file.items():
        stem = path.rsplit("/", 1)[-1].rsplit(".", 1)[0].lower()
        for n, occ in found.items():
            if n in common:
                continue
            w = strength[n] * idf[n] * (INIT_FACTOR if path.endswith("__init__.py") else 1.0)
            defined = [(ln, t) for ln, t in occ if _defines(t, n)]
            named = n.lower() == stem
            add(path, w * (1.0 + (1.0 if defined else 0.0) + (1.0 if named else 0.0)), n)
            for ln, t in (defined or occ[:3]):
                scored[path].hit(ln, t, f"def {n}" if defined else n, w * (2.0 if defined else 1.0))
    # a file whose path names an identifier but that does not contain it (``mathematica``)
    for n, s in strength.items():
        low = n.lower()
        for path in source:
            stem = path.rsplit("/", 1)[-1].removesuffix(".py")
            if stem.lower() == low and path not in per_file:
                add(path, s * math.log(1.0 + n_source), f"named {n}")

    ranked = sorted(scored.items(), key=lambda kv: (-kv[1].score, kv[0]))[: cfg.max_files]
    out_files = []
    for path, f in ranked:
        outline = repo.outline(path)
        sym_scores: dict[str, float] = defaultdict(float)
        hits = sorted(f.hits.values(), key=lambda h: (-h["weight"], h["line"]))
        for h in hits:
            sym = outline.enclosing(h["line"])
            h["symbol"] = sym.name if sym else None
            if sym:
                sym_scores[sym.name] += h["weight"]
                # a method's class gets a share, so a class-level pick stays possible
                if "." in sym.name:
                    sym_scores[sym.name.rsplit(".", 1)[0]] += h["weight"] * 0.25
        symbols = []
        for name, s in sorted(sym_scores.items(), key=lambda kv: (-kv[1], kv[0]))[:10]:
            sym = outline.find(name)
            if sym:
                symbols.append({"name": name, "start": sym.start, "end": sym.end,
                                "score": round(s, 3)})
        out_files.append({"path": path, "score": round(f.score, 3), "reasons": f.reasons[:12],
                          "hits": [{**h, "weight": round(h["weight"], 3)}
                                   for h in sorted(hits[: cfg.max_hits], key=lambda h: h["line"])],
                          "symbols": symbols})
    return {"clues": clues.to_json(), "n_source_files": len(source), "files": out_files}
