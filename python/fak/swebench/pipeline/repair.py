"""Stage 3, ``repair``: many edit samples per location, checked and deduplicated.

Per location (``choose``'s ``location`` records) and per answer form (``forms``), ``samples``
answers (the first greedy, the rest at ``temperature``):

- ``search_replace``: the issue and the region with line numbers; the answer is SEARCH/REPLACE
  blocks, pre-filled with the opening of an edit of that file where the server takes a raw
  prompt. Every block must apply (``edits.apply_block``) to a tracked non-test file.
- ``rewrite``: the issue and the region as it is; the answer is the whole region rewritten,
  pre-filled with a code fence and the region's first line; it replaces the region's lines
  (re-indented when the model moved it). The issue's calibration saw a small model follow this
  form far more often than SEARCH/REPLACE, and drift more.

An answer becomes a candidate patch only when the result changes something (not only comments
or formatting: the AST differs, for Python) and still parses. Candidates are deduplicated by the
normalized content of the files they change (``edits.normalized``), across forms and locations;
a candidate's ``votes`` are the answers that gave it.

Sample statuses: ``ok`` (a new candidate), ``duplicate`` (an earlier candidate again),
``format`` (no block), ``bad_path`` (a file that is not a tracked source file), ``no_apply``
(SEARCH not found, or empty), ``noop`` (nothing changes), ``syntax`` (the result does not parse).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from fak.gitsafe import names_git_metadata
from fak.swebench.pipeline.edits import (
    EditError,
    apply_block,
    diff_size,
    indent_of,
    make_patch,
    normalized,
    parse_blocks,
    reindent,
    syntax_ok,
)
from fak.swebench.pipeline.prompts import render
from fak.swebench.pipeline.sampler import Sampler, Usage
from fak.swebench.pipeline.source import Repo, is_source_path, numbered, region

FORMS = ("search_replace", "rewrite")
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)(?:\n```|$)", re.DOTALL)

@dataclass
class RepairConfig:
    """``samples`` per location and form (greedy included), ``temperature``, ``max_tokens`` per
    answer (a ``rewrite`` answer may use as many as the region needs, up to
    ``max_rewrite_tokens``), ``forms`` (``FORMS``)."""

    samples: int = 11
    temperature: float = 0.8
    max_tokens: int = 768
    max_rewrite_tokens: int = 2048
    forms: tuple[str, ...] = FORMS


def prefill_of(path: str) -> str:
    """The opening of an edit of ``path`` that a raw-completion answer starts with."""
    return f"```python\n### {path}\n<<<<<<< SEARCH\n"


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
        if path is None or not is_source_path(path) or names_git_metadata(path):
            return "bad_path", f"not a source file of the repository: {b.path!r}", {}
        old = changes[path][0] if path in changes else (repo.text(path) or "")
        cur = changes[path][1] if path in changes else old
        near = location["start"] if path == location["path"] else 1
        try:
            new = apply_block(cur, b, near_line=near)
        except EditError as e:
            return "no_apply", str(e), {}
        changes[path] = (old, new)
    return check(changes)


def evaluate_rewrite(repo: Repo, text: str, location: dict[str, Any]) -> tuple[str, str, dict[str, tuple[str, str]]]:
    """(status, message, changes) of a ``rewrite`` answer: its code block replaces the region."""
    m = _FENCE.search(text)
    code = (m.group(1) if m else text).rstrip().removesuffix("```").rstrip()
    if not code.strip():
        return "format", "no code", {}
    path, start, end = location["path"], location["start"], location["end"]
    old = repo.text(path) or ""
    lines = old.split("\n")
    new_lines = code.split("\n")
    first_old = next((ln for ln in lines[start - 1:end] if ln.strip()), "")
    first_new = next((ln for ln in new_lines if ln.strip()), "")
    delta = indent_of(first_old) - indent_of(first_new)
    if delta:
        new_lines = reindent(new_lines, delta)
    new = "\n".join(lines[:start - 1] + new_lines + lines[end:])
    return check({path: (old, new)})


def check(changes: dict[str, tuple[str, str]]) -> tuple[str, str, dict[str, tuple[str, str]]]:
    """``ok`` for changes that change something and parse, else ``noop`` / ``syntax``."""
    changes = {p: (o, n) for p, (o, n) in changes.items() if o != n}
    if not changes:
        return "noop", "the edit changes nothing", {}
    for p, (o, n) in changes.items():
        if not syntax_ok(p, o, n):
            return "syntax", f"{p} no longer parses", {}
    if all(normalized(p, o) == normalized(p, n) for p, (o, n) in changes.items()):
        return "noop", "only comments or formatting change", {}
    return "ok", "", changes


_KEYS = {"search_replace": "repair", "rewrite": "rewrite"}


def _prompt(form: str, issue: str, loc: dict[str, Any], text: str, system: str, mode: str,
            cfg: RepairConfig) -> tuple[list[dict[str, str]], str, int]:
    """(messages, prefill, max_tokens) of one location's prompt in ``form``."""
    if form == "search_replace":
        prompt = render("repair.j2", issue=issue, path=loc["path"], start=loc["start"],
                        end=loc["end"], symbol=loc.get("symbol"),
                        code=numbered(text, loc["start"], loc["end"]))
        prefill = prefill_of(loc["path"]) if mode == "completions" else ""
        max_tokens = cfg.max_tokens
    elif form == "rewrite":
        code = region(text, loc["start"], loc["end"])
        prompt = render("rewrite.j2", issue=issue, path=loc["path"], start=loc["start"],
                        end=loc["end"], symbol=loc.get("symbol"), code=code)
        first = code.split("\n", 1)[0]
        prefill = f"```python\n{first}\n" if mode == "completions" else ""
        max_tokens = min(cfg.max_rewrite_tokens, max(cfg.max_tokens, len(code) // 3 + 64))
    else:
        raise ValueError(f"unknown repair form {form!r}; the forms are {', '.join(FORMS)}")
    return ([{"role": "system", "content": system}, {"role": "user", "content": prompt}],
            prefill, max_tokens)


def repair(repo: Repo, issue: str, task: dict[str, Any], locations: list[dict[str, Any]],
           sampler: Sampler, cfg: RepairConfig, usage: Usage, key: str) -> list[dict[str, Any]]:
    """The repair stage's records: one ``sample`` per answer (``location``, ``form``, ``status``,
    ``candidate``), then one ``candidate`` per distinct patch (``id``, ``diff`` (the patch), ``files``,
    ``votes``, ``samples`` as ``[location, form, index]``, ``locations``, ``forms``,
    ``diff_lines``, ``norm``), in order of first appearance."""
    records: list[dict[str, Any]] = []
    candidates: dict[str, dict[str, Any]] = {}
    system = render("system.j2", repo=task["repo"])
    for loc in locations:
        text = repo.text(loc["path"]) or ""
        for form in cfg.forms:
            messages, prefill, max_tokens = _prompt(form, issue, loc, text, system, sampler.mode, cfg)
            samples = sampler.sample(messages, n=cfg.samples, key=f"{key}/{_KEYS[form]}/{loc['rank']}",
                                     prefill=prefill, temperature=cfg.temperature,
                                     max_tokens=max_tokens, stop=["\n```"] if prefill else None,
                                     usage=usage)
            for s in samples:
                judge = evaluate if form == "search_replace" else evaluate_rewrite
                status, message, changes = judge(repo, s.text, loc)
                cid = None
                if status == "ok":
                    norm = "|".join(f"{p}:{normalized(p, n)}" for p, (_, n) in sorted(changes.items()))
                    if norm in candidates:
                        status = "duplicate"
                        cand = candidates[norm]
                        cand["votes"] += 1
                        cand["samples"].append([loc["rank"], form, s.index])
                        if loc["rank"] not in cand["locations"]:
                            cand["locations"].append(loc["rank"])
                        if form not in cand["forms"]:
                            cand["forms"].append(form)
                    else:
                        patch = make_patch(changes)
                        cand = {"kind": "candidate", "id": f"c{len(candidates)}", "diff": patch,
                                "files": sorted(changes), "votes": 1,
                                "samples": [[loc["rank"], form, s.index]], "locations": [loc["rank"]],
                                "forms": [form], "diff_lines": diff_size(patch), "norm": norm}
                        candidates[norm] = cand
                    cid = cand["id"]
                records.append({"kind": "sample", "location": loc["rank"], "form": form,
                                **s.to_json(), "status": status, "message": message,
                                "candidate": cid})
    records.extend(candidates.values())
    return records
