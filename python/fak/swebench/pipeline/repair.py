"""Stage 3, ``repair``: many SEARCH/REPLACE samples per location, checked and deduplicated.

Per location (``choose``'s ``location`` records): the issue and the region with line numbers;
``samples`` answers (the first greedy, the rest at ``temperature``), each pre-filled with the
opening of an edit of that file where the server takes a raw prompt. An answer becomes a
candidate patch only when every block applies (``edits.apply_block``) to a tracked non-test
file, the result changes something (not only comments or formatting: the AST differs, for
Python) and still parses. Candidates are deduplicated by the normalized content of the files
they change (``edits.normalized``); a candidate's ``votes`` are the answers that gave it.

Sample statuses: ``ok`` (a new candidate), ``duplicate`` (an earlier candidate again),
``format`` (no block), ``bad_path`` (a file that is not a tracked source file), ``no_apply``
(SEARCH not found, or empty), ``noop`` (nothing changes), ``syntax`` (the result does not parse).
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass
from typing import Any

from fak.swebench.pipeline.edits import (
    EditError,
    apply_block,
    diff_size,
    make_patch,
    normalized,
    parse_blocks,
    syntax_ok,
)
from fak.swebench.pipeline.prompts import render
from fak.swebench.pipeline.sampler import Sampler, Usage
from fak.swebench.pipeline.source import Repo, is_source_path, numbered

REPLACE_PLACEHOLDER = "<the fixed lines>"


@dataclass
class RepairConfig:
    """``samples`` per location (greedy included), ``temperature``, ``max_tokens`` per answer."""

    samples: int = 21
    temperature: float = 0.8
    max_tokens: int = 768


def prefill_of(path: str) -> str:
    """The opening of an edit of ``path`` that a raw-completion answer starts with."""
    return f"```python\n### {path}\n<<<<<<< SEARCH\n"


def example_line_of(lines: list[str], start: int, end: int) -> str:
    """A real line of the region for the format example: the first statement of the function's
    body that is not its docstring (else the region's first non-blank line)."""
    region = lines[start - 1:end]
    try:
        tree = ast.parse(textwrap.dedent("\n".join(region)))
        node = tree.body[0]
        body = getattr(node, "body", [])
        if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
            body = body[1:]
        if body:
            return region[body[0].lineno - 1]
    except (SyntaxError, ValueError, IndexError):
        pass
    return next((ln for ln in region if ln.strip()), "")


def _resolve(path: str, files: set[str], default: str) -> str | None:
    p = path.strip().removeprefix("a/").removeprefix("b/").removeprefix("./")
    if p in files:
        return p
    same = [f for f in files if f.endswith("/" + p)]
    if len(same) == 1:
        return same[0]
    return default if not p else None


def evaluate(repo: Repo, text: str, location: dict[str, Any]) -> tuple[str, str, dict[str, tuple[str, str]]]:
    """(status, message, changes ``{path: (old, new)}``) of one answer (see the module docstring)."""
    blocks = parse_blocks(text, default_path=location["path"])
    if not blocks:
        return "format", "no SEARCH/REPLACE block", {}
    files = set(repo.files)
    changes: dict[str, tuple[str, str]] = {}
    for b in blocks:
        path = _resolve(b.path, files, location["path"])
        if path is None or not is_source_path(path):
            return "bad_path", f"not a source file of the repository: {b.path!r}", {}
        old = changes[path][0] if path in changes else (repo.text(path) or "")
        cur = changes[path][1] if path in changes else old
        near = location["start"] if path == location["path"] else 1
        try:
            new = apply_block(cur, b, near_line=near)
        except EditError as e:
            return "no_apply", str(e), {}
        changes[path] = (old, new)
    changes = {p: (o, n) for p, (o, n) in changes.items() if o != n}
    if not changes:
        return "noop", "the edit changes nothing", {}
    for p, (o, n) in changes.items():
        if not syntax_ok(p, o, n):
            return "syntax", f"{p} no longer parses", {}
    if all(normalized(p, o) == normalized(p, n) for p, (o, n) in changes.items()):
        return "noop", "only comments or formatting change", {}
    return "ok", "", changes


def repair(repo: Repo, issue: str, task: dict[str, Any], locations: list[dict[str, Any]],
           sampler: Sampler, cfg: RepairConfig, usage: Usage, key: str) -> list[dict[str, Any]]:
    """The repair stage's records: one ``sample`` per answer, then one ``candidate`` per distinct
    patch (``id``, ``patch``, ``files``, ``votes``, ``samples`` as ``[location, index]``,
    ``locations``, ``diff_lines``, ``norm``), in order of first appearance."""
    records: list[dict[str, Any]] = []
    candidates: dict[str, dict[str, Any]] = {}
    system = render("system.j2", repo=task["repo"])
    for loc in locations:
        text = repo.text(loc["path"]) or ""
        lines = text.splitlines()
        example_line = example_line_of(lines, loc["start"], loc["end"])
        prompt = render("repair.j2", issue=issue, path=loc["path"], start=loc["start"],
                        end=loc["end"], symbol=loc.get("symbol"),
                        code=numbered(text, loc["start"], loc["end"]),
                        search_example=example_line, replace_example=REPLACE_PLACEHOLDER)
        prefill = prefill_of(loc["path"]) if sampler.mode == "completions" else ""
        samples = sampler.sample([{"role": "system", "content": system},
                                  {"role": "user", "content": prompt}], n=cfg.samples,
                                 key=f"{key}/repair/{loc['rank']}", prefill=prefill,
                                 temperature=cfg.temperature, max_tokens=cfg.max_tokens,
                                 stop=["\n```"] if prefill else None, usage=usage)
        for s in samples:
            status, message, changes = evaluate(repo, s.text, loc)
            cid = None
            if status == "ok":
                norm = "|".join(f"{p}:{normalized(p, n)}" for p, (_, n) in sorted(changes.items()))
                if norm in candidates:
                    status = "duplicate"
                    cand = candidates[norm]
                    cand["votes"] += 1
                    cand["samples"].append([loc["rank"], s.index])
                    if loc["rank"] not in cand["locations"]:
                        cand["locations"].append(loc["rank"])
                else:
                    patch = make_patch(changes)
                    cand = {"kind": "candidate", "id": f"c{len(candidates)}", "patch": patch,
                            "files": sorted(changes), "votes": 1, "samples": [[loc["rank"], s.index]],
                            "locations": [loc["rank"]], "diff_lines": diff_size(patch), "norm": norm}
                    candidates[norm] = cand
                cid = cand["id"]
            records.append({"kind": "sample", "location": loc["rank"], **s.to_json(),
                            "status": status, "message": message, "candidate": cid})
    records.extend(candidates.values())
    return records
