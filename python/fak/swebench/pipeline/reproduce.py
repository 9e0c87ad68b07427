"""Stage 4a, ``reproduce``: reproduction scripts written by the model (run by the ``test`` stage).

The issue and the best location's code (no line numbers); ``samples`` answers (the first
greedy), pre-filled with the opening of a Python code block where the server takes a raw prompt.
An answer is a script when its first code block (or the whole answer) parses as Python;
scripts are deduplicated by their AST. Whether a script shows the bug is only known once it has
run on the original code (``testing``).
"""

from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass
from typing import Any

from fak.swebench.pipeline.prompts import render
from fak.swebench.pipeline.sampler import Sampler, Usage
from fak.swebench.pipeline.source import Repo, module_name, region

_FENCE = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)(?:\n```|$)", re.DOTALL)


@dataclass
class ReproduceConfig:
    """``samples`` (greedy included), ``temperature``, ``max_tokens`` per answer."""

    samples: int = 7
    temperature: float = 0.8
    max_tokens: int = 512


def script_of(text: str) -> str | None:
    """The Python script in an answer, or ``None`` when there is none that parses."""
    m = _FENCE.search(text)
    code = (m.group(1) if m else text).strip("\n")
    if not code.strip():
        return None
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return None
    return code + "\n"


def reproduce(repo: Repo, issue: str, task: dict[str, Any], locations: list[dict[str, Any]],
              sampler: Sampler, cfg: ReproduceConfig, usage: Usage, key: str) -> list[dict[str, Any]]:
    """The reproduce stage's records: ``sample`` per answer (``status`` ``ok`` | ``duplicate`` |
    ``syntax``, ``script``), then ``script`` records (``id``, ``code``, ``votes``)."""
    if not locations:
        return []
    loc = locations[0]
    text = repo.text(loc["path"]) or ""
    package = module_name(loc["path"]).split(".")[0]
    prompt = render("reproduce.j2", issue=issue, repo=task["repo"], path=loc["path"],
                    symbol=loc.get("symbol"), code=region(text, loc["start"], loc["end"]),
                    import_hint=f"the package `{package}` is importable" if package else
                    "its modules are importable")
    prefill = "```python\n" if sampler.mode == "completions" else ""
    system = render("system.j2", repo=task["repo"])
    samples = sampler.sample([{"role": "system", "content": system},
                              {"role": "user", "content": prompt}], n=cfg.samples,
                             key=f"{key}/reproduce", prefill=prefill, temperature=cfg.temperature,
                             max_tokens=cfg.max_tokens, stop=["\n```"] if prefill else None,
                             usage=usage)
    records: list[dict[str, Any]] = []
    scripts: dict[str, dict[str, Any]] = {}
    for s in samples:
        code = script_of(s.text)
        sid, status = None, "syntax"
        if code is not None:
            norm = hashlib.sha256(ast.dump(ast.parse(code)).encode()).hexdigest()[:24]
            if norm in scripts:
                scripts[norm]["votes"] += 1
                status = "duplicate"
            else:
                scripts[norm] = {"kind": "script", "id": f"r{len(scripts)}", "code": code, "votes": 1}
                status = "ok"
            sid = scripts[norm]["id"]
        records.append({"kind": "sample", **s.to_json(), "status": status, "script": sid})
    records.extend(scripts.values())
    return records
