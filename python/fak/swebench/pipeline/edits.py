"""SEARCH/REPLACE edits: parse them out of a model's answer, apply them to files, make the patch,
and the normalized form candidates are deduplicated by.

The format (Aider's and Agentless's)::

    ### path/to/file.py
    <<<<<<< SEARCH
        lines copied from the file
    =======
        the lines that replace them
    >>>>>>> REPLACE

Applying one block to a file's text (``apply_block``), in this order: the SEARCH text exactly (if
it occurs more than once, the occurrence nearest ``near_line``); the same with the line numbers a
small model copies from a numbered listing removed (``strip_line_numbers``); then line by line
ignoring trailing whitespace, and then ignoring indentation, in which case the REPLACE lines are
re-indented by the same offset. An empty SEARCH, or one found nowhere, fails (``EditError``).
"""

from __future__ import annotations

import ast
import hashlib
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fak.gitsafe import git, names_git_metadata

_BLOCK = re.compile(
    r"(?:^|\n)(?:###\s*(?P<path>[^\n]+?)\s*\n)?(?:```[\w+-]*\n)?"
    r"<{5,9} ?SEARCH[^\n]*\n(?P<search>.*?)(?:^|\n)={5,9}[^\n]*\n(?P<replace>.*?)(?:^|\n)>{5,9} ?REPLACE",
    re.DOTALL)
_GUTTER = re.compile(r"^\s{0,6}\d{1,6}(?: {1,2}|\t|[:|] ?)")


class EditError(ValueError):
    """An edit that cannot be applied; ``reason`` is a short label (``not_found``,
    ``empty_search``, ``no_path``, ``format``)."""

    def __init__(self, reason: str, message: str = ""):
        self.reason = reason
        super().__init__(message or reason)


@dataclass(frozen=True)
class Block:
    """One SEARCH/REPLACE block: ``path`` (``""`` when the answer named none), ``search``,
    ``replace`` (texts without the final newline)."""

    path: str
    search: str
    replace: str


def parse_blocks(text: str, default_path: str = "") -> list[Block]:
    """Every block of an answer (``default_path`` for blocks with no ``### path`` line; a path
    line is inherited by the blocks that follow it)."""
    blocks = []
    path = default_path
    for m in _BLOCK.finditer(text):
        if m.group("path"):
            path = m.group("path").strip().strip("`").strip()
        blocks.append(Block(path, m.group("search"), m.group("replace")))
    return blocks


def strip_line_numbers(lines: list[str], gutter_width: int | None = None) -> list[str] | None:
    """``lines`` with a copied line-number gutter removed, or ``None`` when fewer than 60% of the
    non-blank lines carry one. The listing format is ``NUMBER`` right-aligned plus two spaces."""
    nonblank = [ln for ln in lines if ln.strip()]
    if not nonblank:
        return None
    with_gutter = [ln for ln in nonblank if _GUTTER.match(ln)]
    if len(with_gutter) < 0.6 * len(nonblank):
        return None
    return [_GUTTER.sub("", ln, count=1) if _GUTTER.match(ln) else ln for ln in lines]


def indent_of(s: str) -> int:
    return len(s) - len(s.lstrip(" \t"))


def reindent(lines: list[str], delta: int) -> list[str]:
    out = []
    for ln in lines:
        if not ln.strip():
            out.append(ln.strip(" \t"))
        elif delta >= 0:
            out.append(" " * delta + ln)
        else:
            out.append(ln[min(-delta, indent_of(ln)):])
    return out


def _line_offsets(text: str) -> list[int]:
    offs, pos = [], 0
    for ln in text.splitlines(keepends=True):
        offs.append(pos)
        pos += len(ln)
    return offs


def apply_block(text: str, block: Block, near_line: int = 1) -> str:
    """``text`` with ``block`` applied (see the module docstring). Raises ``EditError``."""
    search, replace = block.search, block.replace
    if not search.strip():
        raise EditError("empty_search", "the SEARCH part is empty")
    attempts = [(search.split("\n"), replace.split("\n"))]
    s_stripped = strip_line_numbers(search.split("\n"))
    if s_stripped is not None:
        r_lines = replace.split("\n")
        r_stripped = strip_line_numbers(r_lines)
        attempts.append((s_stripped, r_stripped if r_stripped is not None else r_lines))
    file_lines = text.split("\n")
    for s_lines, r_lines in attempts:
        while s_lines and not s_lines[-1].strip():
            s_lines = s_lines[:-1]
        while s_lines and not s_lines[0].strip():
            s_lines = s_lines[1:]
        if not s_lines:
            continue
        # exact (as lines)
        for norm, loose in ((lambda x: x.rstrip(), False), (lambda x: x.strip(), True)):
            want = [norm(x) for x in s_lines]
            have = [norm(x) for x in file_lines]
            n = len(want)
            starts = [i for i in range(len(have) - n + 1) if have[i:i + n] == want]
            if not starts:
                continue
            i = min(starts, key=lambda k: (abs(k + 1 - near_line), k))
            new = r_lines
            if loose:
                first = next(j for j, x in enumerate(s_lines) if x.strip())
                delta = indent_of(file_lines[i + first]) - indent_of(s_lines[first])
                new = reindent(r_lines, delta)
            return "\n".join(file_lines[:i] + list(new) + file_lines[i + n:])
    raise EditError("not_found", "the SEARCH lines are not in the file")


def syntax_ok(path: str, before: str, after: str) -> bool:
    """False when ``after`` is Python that does not parse (a file that did not parse before
    either, e.g. Python 2 code, is not checked)."""
    if not path.endswith(".py"):
        return True
    try:
        ast.parse(after)
        return True
    except (SyntaxError, ValueError):
        try:
            ast.parse(before)
        except (SyntaxError, ValueError):
            return True
        return False


def normalized(path: str, text: str) -> str:
    """A digest of ``text`` that ignores what does not change behaviour: for Python the AST
    (comments, blank lines, formatting); for other files the lines without surrounding
    whitespace, blank lines dropped."""
    if path.endswith(".py"):
        try:
            body = ast.dump(ast.parse(text), include_attributes=False)
            return hashlib.sha256(body.encode()).hexdigest()[:24]
        except (SyntaxError, ValueError):
            pass
    body = "\n".join(ln.strip() for ln in text.splitlines() if ln.strip())
    return hashlib.sha256(body.encode()).hexdigest()[:24]


def make_patch(changes: dict[str, tuple[str, str]]) -> str:
    """A ``git apply``-able patch of ``{path: (old_text, new_text)}`` (``git diff --no-index``
    per file through ``fak.gitsafe.git``, paths as given, files in sorted order).

    Raises ``EditError("bad_path")`` for a path that is absolute, climbs out (``..``) or names
    git metadata (``fak.gitsafe.names_git_metadata``): such a file is never written, not even
    in the temporary folder the patch is made in."""
    parts = []
    for path in changes:
        parts_of = path.replace("\\", "/").split("/")
        if path.startswith("/") or ".." in parts_of or "" in parts_of or names_git_metadata(path):
            raise EditError("bad_path", f"not a repository file path: {path!r}")
    with tempfile.TemporaryDirectory(prefix="fak-patch-") as tmp:
        for path in sorted(changes):
            old, new = changes[path]
            a, b = Path(tmp, "a", path), Path(tmp, "b", path)
            a.parent.mkdir(parents=True, exist_ok=True)
            b.parent.mkdir(parents=True, exist_ok=True)
            a.write_text(old, encoding="utf-8", errors="surrogateescape")
            b.write_text(new, encoding="utf-8", errors="surrogateescape")
            proc = git(tmp, "diff", "--no-index", "--no-color", "--no-prefix", "--no-ext-diff",
                       "--no-textconv", f"a/{path}", f"b/{path}", mode="none", check=False,
                       text=False)
            if proc.returncode not in (0, 1):
                raise RuntimeError(f"git diff --no-index failed: {proc.stderr.decode()[:300]}")
            parts.append(proc.stdout.decode("utf-8", "surrogateescape"))
    return "".join(parts)


def diff_size(patch: str) -> int:
    """Changed lines of a patch (``+``/``-`` lines, headers excluded)."""
    return sum(1 for ln in patch.splitlines()
               if ln[:1] in "+-" and not ln.startswith(("+++ ", "--- ")))
