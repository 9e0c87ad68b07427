"""The repository at ``base_commit``, read straight from the mirror (no checkout): file list,
file text, fixed-string ``git grep``, and Python outlines (``ast``) that map a line to its
enclosing function or class.

Paths are repository-relative POSIX paths. Line numbers are 1-based, ranges inclusive.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from fak.gitsafe import git

#: path parts that mark tests, docs and other non-source trees
NON_SOURCE_PARTS = frozenset({"tests", "test", "testing", "doc", "docs", "examples", "example",
                              "benchmarks", "bench", "release", ".github", ".ci", "ci"})
SOURCE_SUFFIXES = (".py", ".pyx", ".pxd", ".pyi", ".c", ".h", ".cpp", ".js", ".cfg", ".toml", ".ini")


def is_test_path(path: str) -> bool:
    """True for a test file or a file inside a test folder (``tests/``, ``testing/``,
    ``test_*.py``, ``*_test.py``, ``conftest.py``)."""
    parts = path.split("/")
    name = parts[-1]
    return (any(p in ("tests", "test", "testing") for p in parts[:-1]) or name.startswith("test_")
            or name.endswith("_test.py") or name == "conftest.py")


def is_source_path(path: str) -> bool:
    """True for a source file the pipeline may locate and edit: a known source suffix, not a test,
    not under docs/examples/benchmarks/CI folders."""
    parts = path.split("/")
    if any(p in NON_SOURCE_PARTS for p in parts[:-1]) or is_test_path(path):
        return False
    return path.endswith(SOURCE_SUFFIXES) and parts[-1] not in ("setup.py", "conftest.py")


class Repo:
    """The tree of ``commit`` in the git repository ``mirror`` (bare or not), read-only."""

    def __init__(self, mirror: Path, commit: str):
        self.mirror = Path(mirror)
        self.commit = commit
        self._text: dict[str, str | None] = {}

    @property
    def files(self) -> list[str]:
        """Every tracked path at the commit (sorted)."""
        return _ls_tree(str(self.mirror), self.commit)

    def source_files(self) -> list[str]:
        return [f for f in self.files if is_source_path(f)]

    def text(self, path: str) -> str | None:
        """The file's text at the commit (UTF-8, undecodable bytes replaced), or ``None``."""
        if path not in self._text:
            proc = git(self.mirror, "show", f"{self.commit}:{path}", mode="trusted", check=False,
                       text=False)
            self._text[path] = (proc.stdout.decode("utf-8", "replace") if proc.returncode == 0
                                else None)
        return self._text[path]

    def grep(self, patterns: list[str], *, words: bool, paths: list[str] | None = None,
             max_lines: int = 200_000) -> list[tuple[str, int, str]]:
        """``git grep -F`` of ``patterns`` (fixed strings; ``words``: whole words only) at the
        commit over ``paths`` (pathspecs; default every file). Returns ``(path, line, text)``
        rows, at most ``max_lines`` of them; binary files are skipped."""
        if not patterns:
            return []
        args = ["grep", "-n", "-I", "-F", "--no-color", "-z"]
        if words:
            args.append("-w")
        for p in patterns:
            args += ["-e", p]
        args += [self.commit, "--", *(paths or [])]
        proc = git(self.mirror, *args, mode="trusted", check=False, text=False)
        out: list[tuple[str, int, str]] = []
        prefix = f"{self.commit}:".encode()
        for raw in proc.stdout.split(b"\n"):
            if not raw:
                continue
            parts = raw.split(b"\0", 2)
            if len(parts) != 3 or not parts[1].isdigit():
                continue
            path = parts[0].removeprefix(prefix)
            out.append((path.decode("utf-8", "replace"), int(parts[1]),
                        parts[2].decode("utf-8", "replace")[:400]))
            if len(out) >= max_lines:
                break
        return out

    def outline(self, path: str) -> Outline:
        """The ``Outline`` of a file (empty for a file that is not Python or does not parse)."""
        return outline_of(path, self.text(path) or "")


@lru_cache(maxsize=64)
def _ls_tree(mirror: str, commit: str) -> list[str]:
    proc = git(Path(mirror), "ls-tree", "-r", "-z", "--name-only", commit, mode="trusted",
               text=False)
    return sorted(p.decode("utf-8", "replace") for p in proc.stdout.split(b"\0") if p)


@dataclass(frozen=True)
class Symbol:
    """A function, method or class: ``name`` (qualified, ``Class.method``), ``kind`` (``def`` |
    ``class``), ``start``/``end`` (lines, decorators included), ``header`` (its ``def``/``class``
    line, stripped)."""

    name: str
    kind: str
    start: int
    end: int
    header: str
    depth: int = 0


@dataclass
class Outline:
    """The symbols of one Python file in source order, and the file's line count."""

    path: str
    n_lines: int
    symbols: list[Symbol] = field(default_factory=list)
    parsed: bool = True

    def enclosing(self, line: int) -> Symbol | None:
        """The innermost symbol whose range holds ``line``."""
        best = None
        for s in self.symbols:
            if s.start <= line <= s.end and (best is None or s.start >= best.start):
                best = s
        return best

    def find(self, name: str) -> Symbol | None:
        """The symbol named ``name`` (qualified name, or else the last part of it)."""
        for s in self.symbols:
            if s.name == name:
                return s
        tail = name.split(".")[-1]
        same = [s for s in self.symbols if s.name.split(".")[-1] == tail]
        return same[0] if len(same) == 1 else None


def outline_of(path: str, text: str) -> Outline:
    """Parse ``text`` with ``ast`` (the running interpreter's grammar) into an ``Outline``."""
    lines = text.splitlines()
    out = Outline(path, len(lines))
    if not path.endswith((".py", ".pyi")):
        out.parsed = False
        return out
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        out.parsed = False
        return out

    def visit(node: ast.AST, prefix: str, depth: int) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                start = min([child.lineno] + [d.lineno for d in child.decorator_list])
                end = getattr(child, "end_lineno", None) or child.lineno
                name = f"{prefix}{child.name}"
                header = lines[child.lineno - 1].strip() if child.lineno <= len(lines) else ""
                kind = "class" if isinstance(child, ast.ClassDef) else "def"
                out.symbols.append(Symbol(name, kind, start, end, header, depth))
                visit(child, name + ".", depth + 1)
            elif isinstance(child, (ast.If, ast.Try, ast.With)) and depth == 0:
                visit(child, prefix, depth)  # defs under `if PY3:` / `try:` at module level

    visit(tree, "", 0)
    out.symbols.sort(key=lambda s: (s.start, s.depth))
    return out


def numbered(text: str, start: int, end: int) -> str:
    """Lines ``start..end`` of ``text`` with right-aligned line numbers and two spaces."""
    lines = text.splitlines()
    end = min(end, len(lines))
    width = len(str(end))
    return "\n".join(f"{i:>{width}}  {lines[i - 1]}" for i in range(max(1, start), end + 1))


def region(text: str, start: int, end: int) -> str:
    """Lines ``start..end`` of ``text`` as they are (no numbers)."""
    lines = text.splitlines()
    return "\n".join(lines[max(1, start) - 1:min(end, len(lines))])


_PY_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def module_name(path: str) -> str:
    """``sympy/core/evalf.py`` → ``sympy.core.evalf``; ``src/_pytest/x.py`` → ``_pytest.x``;
    ``pkg/__init__.py`` → ``pkg``."""
    p = path.removesuffix(".py")
    parts = [x for x in p.split("/") if x]
    if parts and parts[0] in ("src", "lib"):
        parts = parts[1:]
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)
