"""What the prompts say about one task's repository: real example paths and names, seed locations.

Small models copy the examples of a prompt literally (in the CPU runs of
``benches/results/swebench-cpu-1.5b.md`` the placeholder ``src/package/module.py`` was copied in 8
of 14 text-protocol runs), so every example in a prompt is taken from the workspace itself: a real
source file under the repository's package folder, a real function of it, a real test file.
``prompt_variables`` gives them to the templates (``fak.agent.prompts``); the agent loop and the
staged pipeline render the same templates with them.

Seed locations (``{path, line?, symbol?}``, e.g. from a localizer that greps the issue's names) are
checked against the workspace (``normalize_seeds``) and shown in the first user message.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from fak.agent.search import list_files, path_kind, read_text_file

_TOP_DEF = re.compile(r"^(?:async\s+)?(def|class)\s+([A-Za-z_][A-Za-z0-9_]*)", re.MULTILINE)
_STRING_START = re.compile(r"^[rRuUbBfF]{0,2}[\"']")
_SKIP_NAMES = {"__init__.py", "__main__.py", "setup.py", "conftest.py", "_version.py", "version.py"}
MAX_SEEDS = 10

#: every variable the packaged templates use, with its value when nothing is known about the
#: task (templates are rendered with ``StrictUndefined``)
PROMPT_DEFAULTS: dict[str, Any] = {
    "problem_statement": "", "repo": "", "listing": None, "python_note": None,
    "example_path": None, "example_symbol": "main", "example_dir": ".", "example_test": None,
    "example_old": None, "example_new": None, "seeds": [], "seed_lines": [],
    "verify_on_edit": False,
}


def package_dir(files: list[str], repo: str = "") -> str | None:
    """The repository's main Python package folder (``sympy``, ``requests``, ``src/_pytest``):
    among the folders ``X/`` and ``src/X/`` holding an ``__init__.py``, the one named like the
    repository (``owner/name``, ignoring ``_`` and ``-``) with the most ``.py`` files, else the one
    with the most ``.py`` files. ``None`` when there is none."""
    counts: dict[str, int] = {}
    for f in files:
        parts = f.split("/")
        if parts[-1] == "__init__.py" and (len(parts) == 2 or (len(parts) == 3 and parts[0] == "src")):
            pkg = "/".join(parts[:-1])
            if path_kind(f) == "source":
                counts[pkg] = 0
    if not counts:
        return None
    for f in files:
        if f.endswith(".py"):
            for pkg in counts:
                if f.startswith(pkg + "/"):
                    counts[pkg] += 1
    want = repo.rsplit("/", 1)[-1].replace("-", "_").strip("_").lower()

    def score(pkg: str) -> tuple[bool, int]:
        return pkg.rsplit("/", 1)[-1].strip("_").lower() == want, counts[pkg]

    return max(sorted(counts), key=score)


def _first_symbol(text: str) -> str | None:
    m = _TOP_DEF.search(text)
    return m.group(2) if m else None


def _example_snippet(text: str) -> str | None:
    """Two real lines of ``text`` (a top-level ``def`` line and its first statement, not a
    docstring) that occur once in it: the ``old`` of the edit example."""
    lines = text.splitlines()
    for i, line in enumerate(lines[:-1]):
        if not line.startswith("def ") or not line.rstrip().endswith(":"):
            continue
        body = lines[i + 1]
        stripped = body.strip()
        if not stripped or _STRING_START.match(stripped) or stripped.startswith("#") \
                or len(body) > 90:
            continue
        snippet = f"{line}\n{body}"
        if "'''" in snippet or "\\" in snippet:  # it must fit the example's '''...''' literal
            continue
        if text.count(snippet) == 1:
            return snippet
    return None


def _example_file(files: list[str], pkg: str | None, root: Path) -> tuple[str | None, str | None]:
    """A real source file (preferably ``pkg/sub/module.py``, a few KB, with a top-level def) and
    its first top-level function or class."""
    prefix = f"{pkg}/" if pkg else ""
    cands = [f for f in files if f.endswith(".py") and f.startswith(prefix)
             and path_kind(f) == "source" and f.rsplit("/", 1)[-1] not in _SKIP_NAMES]
    depth = prefix.count("/") + 1  # pkg/sub/module.py has one folder below pkg
    cands.sort(key=lambda f: (f.count("/") != depth, f))
    fallback: tuple[str | None, str | None] = (None, None)
    for f in cands[:400]:
        text = read_text_file(root / f, root)
        if not text:
            continue
        sym = _first_symbol(text)
        if sym is None:
            continue
        if fallback[0] is None:
            fallback = (f, sym)
        if 1500 <= len(text) <= 200_000 and _example_snippet(text):
            return f, sym
    return fallback


def _example_test(files: list[str], pkg: str | None, example: str | None) -> str | None:
    """A real test file: ``tests/test_<module>.py`` beside the example file if there is one,
    else the first ``test_*.py`` under the package (or anywhere)."""
    fileset = set(files)
    if example:
        folder, _, name = example.rpartition("/")
        cand = f"{folder}/tests/test_{name}" if folder else f"tests/test_{name}"
        if cand in fileset:
            return cand
    tests = [f for f in files if f.rsplit("/", 1)[-1].startswith("test_") and f.endswith(".py")]
    docs = {"doc", "docs", "example", "examples"}
    tests.sort(key=lambda f: (not (pkg and f.startswith(pkg + "/")),
                              any(p in docs for p in f.split("/")), f))
    return tests[0] if tests else None


def normalize_seeds(root: Path, seeds: Any) -> list[dict[str, Any]]:
    """Seed locations as ``[{"path", "line"?, "symbol"?}]``: entries without a ``path`` string,
    or whose file is not in the workspace, are dropped; ``line`` must be a positive int; at most
    ``MAX_SEEDS``. Accepts ``None`` (no seeds)."""
    out: list[dict[str, Any]] = []
    root = Path(root).resolve()
    for s in seeds or []:
        if isinstance(s, str):
            s = {"path": s}
        if not isinstance(s, dict) or not isinstance(s.get("path"), str) or not s["path"].strip():
            continue
        path = s["path"].strip().removeprefix("./")
        p = (root / path).resolve()
        if root not in p.parents or not p.is_file():
            continue
        seed: dict[str, Any] = {"path": p.relative_to(root).as_posix()}
        line = s.get("line")
        if isinstance(line, int) and not isinstance(line, bool) and line > 0:
            seed["line"] = line
        if isinstance(s.get("symbol"), str) and s["symbol"].strip():
            seed["symbol"] = s["symbol"].strip()
        if seed not in out:
            out.append(seed)
        if len(out) >= MAX_SEEDS:
            break
    return out


def format_seed(seed: dict[str, Any]) -> str:
    """``sympy/core/evalf.py line 1308 (evalf)`` for one seed location."""
    text = seed["path"]
    if seed.get("line"):
        text += f" line {seed['line']}"
    if seed.get("symbol"):
        text += f" ({seed['symbol']})"
    return text


def prompt_variables(root: str | Path, repo: str = "",
                     seeds: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Template variables about the workspace at ``root``: ``example_path`` (a real source file;
    the first seed's file when seeds are given), ``example_symbol`` (a function/class in it),
    ``example_dir`` (the package folder, or ``.``), ``example_test`` (a real test file or
    ``None``), ``example_old``/``example_new`` (two real lines of the example file and the same
    lines as an edit would leave them, for the text protocol's edit example; ``None`` when none
    fits), ``seeds`` (``normalize_seeds``) and ``seed_lines`` (their display form)."""
    root = Path(root).resolve()
    files = list_files(root)
    pkg = package_dir(files, repo)
    seeds = normalize_seeds(root, seeds)
    example, symbol = None, None
    for s in seeds:
        if s["path"].endswith(".py"):
            text = read_text_file(root / s["path"], root) or ""
            example, symbol = s["path"], s.get("symbol") or _first_symbol(text)
            if symbol:
                break
            example = None
    if example is None:
        example, symbol = _example_file(files, pkg, root)
    if example is None:  # no Python file with a def: any file
        example = next((f for f in files if path_kind(f) == "source"), files[0] if files else None)
    old = new = None
    if example and example.endswith(".py"):
        old = _example_snippet(read_text_file(root / example, root) or "")
        if old:
            first, second = old.split("\n", 1)
            new = f"{first}\n{second}  # the fixed line(s) here"
            m = _TOP_DEF.match(first)
            if m and (not seeds or not seeds[0].get("symbol")):
                symbol = m.group(2)  # the function the example edits
    return {"example_path": example, "example_symbol": symbol or "main",
            "example_dir": pkg or ".", "example_test": _example_test(files, pkg, example),
            "example_old": old, "example_new": new, "seeds": seeds,
            "seed_lines": [format_seed(s) for s in seeds]}
