"""Code search over a workspace, bounded for a small model's context: the ``search`` tool's engine.

Shared by the agent loop (``ToolBox._tool_search``) and anything else that greps a task repository
(the staged pipeline's localizer), so both see the same files and the same matches.

- **Files**: what git lists in the work tree (``git ls-files --cached --others
  --exclude-standard`` through ``fak.gitsafe.git``: tracked and untracked, ignored files and
  ``.git`` left out), text only (a
  NUL byte in the first 8 KiB marks a binary file), at most ``MAX_FILE_BYTES`` each. Outside a git
  repository, a walk of the folder that skips ``.git``.
- **Patterns**: a fixed string by default (what small models type is mostly an identifier, a phrase
  of the issue or a line of code: ``foo.bar(baz`` must not be read as a regular expression), or a
  Python regular expression (``re``) with ``regex=True``. Matching is per line.
- **Order**: source files first, then tests, then docs and everything else (``path_kind``), each in
  path order, so a common word shows code before ``doc/`` pages.
- **Bounds**: at most ``per_file`` lines per file and ``max_lines`` lines (and about
  ``max_chars`` characters) in all, each line cut to ``line_chars``; what was left out is counted.
- **On a miss** (``explain_miss``): the pattern read the other way (as a regular expression, or with
  its regex escapes removed, or an error message without its ``TypeError:`` prefix),
  case-insensitive matches, and for each identifier in the pattern the
  files it appears in as a whole word, most matches first (``foo.bar(baz`` misses, but ``bar`` is in
  ``x.py (3), y.py (1)``).
"""

from __future__ import annotations

import keyword
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from fak.gitsafe import git

#: files larger than this are not searched (generated tables, data dumps), bytes
MAX_FILE_BYTES = 4_000_000
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_REGEX_META = re.compile(r"\\[()\[\]{}.*+?|^$\\sdwbSDWB]|\.\*|\.\+|\[[^\]]*\]|\(\?|\|")
_ESCAPED = re.compile(r"\\([^A-Za-z0-9])")
_LETTER_ESCAPE = re.compile(r"\\[A-Za-z]")
#: words of a phrase that say nothing about where code is (not looked up as identifiers)
_STOPWORDS = frozenset(["the", "and", "for", "not", "are", "but", "with", "from", "this", "that", "when", "what", "which", "then", "than", "into", "have", "has", "had", "was", "were", "will", "would", "should", "could", "can", "does", "did", "doing", "done", "get", "gets", "got", "use", "used", "using", "how", "why", "who", "error", "errors", "issue", "bug", "fix", "wrong", "work", "works", "working", "returns", "return", "result", "results", "value", "values", "true", "false", "none", "self", "cls", "def", "class", "import", "raise", "print", "pass"]) | frozenset(keyword.kwlist)
_TEST_DIRS = {"test", "tests", "testing"}
_DOC_DIRS = {"doc", "docs", "documentation", "examples", "example", "bench", "benchmarks"}
_DOC_SUFFIXES = {".rst", ".md", ".txt", ".tex", ".html", ".ipynb", ".css", ".js", ".json", ".yml",
                 ".yaml", ".cfg", ".ini", ".toml", ".in", ".csv"}


def path_kind(path: str) -> str:
    """``"test"`` (a ``tests``/``test``/``testing`` folder, ``test_*.py``, ``*_test.py``,
    ``conftest.py``), ``"doc"`` (a docs/examples folder or a text/markup/config file), else
    ``"source"``. ``path`` is relative to the repository root, ``/``-separated."""
    parts = path.split("/")
    name = parts[-1]
    if any(p in _TEST_DIRS for p in parts[:-1]) or name.startswith("test_") \
            or name.endswith("_test.py") or name == "conftest.py":
        return "test"
    if any(p.lower() in _DOC_DIRS for p in parts[:-1]) or Path(name).suffix.lower() in _DOC_SUFFIXES:
        return "doc"
    return "source"


_KIND_RANK = {"source": 0, "test": 1, "doc": 2}


def rank_key(path: str) -> tuple[int, str]:
    """Sort key: source files first, then tests, then docs/other, each in path order."""
    return _KIND_RANK[path_kind(path)], path


def list_files(root: Path, rel: str = ".") -> list[str]:
    """Files under ``rel`` (a folder or a file, relative to ``root``) that git sees in the work tree
    (tracked + untracked, not ignored), as root-relative ``/`` paths in path order; outside git, a
    walk that skips ``.git``."""
    proc = git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", rel,
               check=False, text=False, timeout=120)
    if proc.returncode == 0:
        names = {n for n in proc.stdout.decode("utf-8", "surrogateescape").split("\0") if n}
        return sorted(names)
    base = (root / rel).resolve()
    if base.is_file():
        return [base.relative_to(root).as_posix()]
    out = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        for f in filenames:
            out.append((Path(dirpath) / f).relative_to(root).as_posix())
    return sorted(out)


def read_text_file(path: Path, root: Path | None = None) -> str | None:
    """The file's text (UTF-8, undecodable bytes replaced), or ``None`` for a binary, missing,
    unreadable or too-large file, and, with ``root``, for one that resolves outside ``root``
    (a symlink a model made to a host file: git grep never follows it, and neither does this)."""
    try:
        if root is not None and not _inside(path, root):
            return None
        if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
            return None
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data[:8192]:
        return None
    return data.decode("utf-8", "replace")


def _inside(path: Path, root: Path) -> bool:
    real, top = os.path.realpath(path), os.path.realpath(root)
    return real == top or real.startswith(top.rstrip("/") + "/")


@dataclass
class Hits:
    """Matching lines per file: ``files`` maps path → ``[(line number, line)]`` (1-based)."""

    files: dict[str, list[tuple[int, str]]] = field(default_factory=dict)

    @property
    def n_matches(self) -> int:
        return sum(len(v) for v in self.files.values())

    def __bool__(self) -> bool:
        return bool(self.files)


class Searcher:
    """Line search in the work tree at ``root``: ``git grep`` (fixed strings ``-F``, regular
    expressions ``-P``; Python ``re`` where git has no PCRE) over the files git sees (tracked and
    untracked, not ignored, not binary: ``--untracked -I``); outside a git repository, Python over
    ``list_files``. Paths are root-relative. Raises ``re.error`` for a bad regular expression."""

    def __init__(self, root: Path):
        self.root = Path(root)
        probe = git(self.root, "rev-parse", "--is-inside-work-tree", check=False)
        self.git = probe.returncode == 0 and probe.stdout.strip() == "true"
        self._has_pcre: bool | None = None

    def grep(self, pattern: str, rel: str = ".", regex: bool = False,
             ignore_case: bool = False) -> Hits:
        """Every matching line under ``rel`` (a folder or a file)."""
        if regex:
            re.compile(pattern)  # the model is told Python syntax: check it the same way
        if self.git:
            out = self._git_grep(pattern, rel, regex, ignore_case, ["-n"])
            if out is not None:
                hits = Hits()
                for raw in out.split(b"\n"):
                    parts = raw.split(b"\0", 2)
                    if len(parts) != 3 or not parts[1].isdigit():
                        continue
                    path = parts[0].decode("utf-8", "surrogateescape")
                    hits.files.setdefault(path, []).append(
                        (int(parts[1]), parts[2].decode("utf-8", "replace").rstrip("\r")))
                return hits
        return self._python_grep(pattern, rel, regex, ignore_case)

    def word_counts(self, word: str, rel: str = ".") -> dict[str, int]:
        """Files under ``rel`` where ``word`` occurs as a whole word → number of such lines."""
        if self.git:
            out = self._git_grep(word, rel, False, False, ["-c", "-w"])
            if out is not None:
                counts: dict[str, int] = {}
                for raw in out.split(b"\n"):
                    name, _, num = raw.partition(b"\0")
                    if num.isdigit():
                        counts[name.decode("utf-8", "surrogateescape")] = int(num)
                return counts
        rx = re.compile(r"(?<![A-Za-z0-9_])" + re.escape(word) + r"(?![A-Za-z0-9_])")
        counts = {}
        for path, text in self._texts(rel):
            if word in text:
                n = sum(1 for line in text.splitlines() if rx.search(line))
                if n:
                    counts[path] = n
        return counts

    def _git_grep(self, pattern: str, rel: str, regex: bool, ignore_case: bool,
                  extra: list[str]) -> bytes | None:
        """``git grep -z`` output, or ``None`` when git cannot run it (a regular expression and a
        git built without PCRE: the caller falls back to Python)."""
        if regex and not self._pcre():
            return None
        proc = git(self.root, "grep", "-z", "-I", "--untracked", "--no-color", "--no-textconv",
                   *extra, "-P" if regex else "-F", *(["-i"] if ignore_case else []),
                   "-e", pattern, "--", rel, check=False, text=False, timeout=120)
        return proc.stdout if proc.returncode in (0, 1) else None

    def _pcre(self) -> bool:
        """Whether this git's grep takes ``-P`` (built with PCRE; checked once)."""
        if self._has_pcre is None:
            proc = git(self.root, "grep", "-P", "-q", "-e", "x", "--", ":(exclude)*",
                       check=False)
            self._has_pcre = proc.returncode in (0, 1)
        return self._has_pcre

    def _texts(self, rel: str) -> Iterable[tuple[str, str]]:
        for f in list_files(self.root, rel):
            t = read_text_file(self.root / f, self.root)
            if t is not None:
                yield f, t

    def _python_grep(self, pattern: str, rel: str, regex: bool, ignore_case: bool) -> Hits:
        match = line_matcher(pattern, regex, ignore_case)
        hits = Hits()
        for path, text in self._texts(rel):
            found = [(i, line) for i, line in enumerate(text.splitlines(), 1) if match(line)]
            if found:
                hits.files[path] = found
        return hits


def line_matcher(pattern: str, regex: bool, ignore_case: bool = False) -> Callable[[str], bool]:
    """A predicate on one line. Raises ``re.error`` for a bad regular expression."""
    if regex:
        rx = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
        return lambda line: rx.search(line) is not None
    if ignore_case:
        low = pattern.lower()
        return lambda line: low in line.lower()
    return lambda line: pattern in line


@dataclass
class Bounds:
    """Output bounds of one search result (lines, characters)."""

    per_file: int = 5
    max_lines: int = 30
    line_chars: int = 160
    max_chars: int = 4000
    more_files: int = 10


def format_hits(hits: Hits, bounds: Bounds) -> tuple[str, bool]:
    """``file:line:text`` lines, source files first, bounded; returns (text, whether anything was
    left out). Left-out lines are counted per file and in total, and the files not shown at all
    are named (most matches first) up to ``bounds.more_files``."""
    out: list[str] = []
    chars = 0
    shown = 0
    cut = False
    order = sorted(hits.files, key=rank_key)
    unshown: list[str] = []
    for path in order:
        lines = hits.files[path]
        if shown >= bounds.max_lines or chars >= bounds.max_chars:
            unshown.append(path)
            continue
        k = 0
        for lineno, line in lines[: bounds.per_file]:
            if shown >= bounds.max_lines or chars >= bounds.max_chars:
                break
            text = line if len(line) <= bounds.line_chars else line[: bounds.line_chars] + " [...]"
            entry = f"{path}:{lineno}:{text}"
            out.append(entry)
            chars += len(entry) + 1
            shown += 1
            k += 1
        if k < len(lines):
            cut = True
            out.append(f"[... {len(lines) - k} more in {path}]")
    if unshown:
        cut = True
        unshown.sort(key=lambda p: (-len(hits.files[p]), rank_key(p)))
        named = ", ".join(f"{p} ({len(hits.files[p])})" for p in unshown[: bounds.more_files])
        rest = len(unshown) - bounds.more_files
        out.append(f"[... also in {len(unshown)} more files: {named}"
                   + (f" and {rest} others" if rest > 0 else "") + "]")
    if cut:
        out.append(f"[{hits.n_matches} matching lines in {len(hits.files)} files, {shown} shown: "
                   "give a longer pattern or a path to see the rest]")
    return "\n".join(out), cut


def looks_like_regex(pattern: str) -> bool:
    """Whether ``pattern`` holds regular-expression syntax (``\\(``, ``.*``, ``[a-z]``, ``|``)."""
    return _REGEX_META.search(pattern) is not None


def unescape(pattern: str) -> str:
    """``pattern`` with regex escapes of punctuation removed (``Max\\(x\\)`` → ``Max(x)``)."""
    return _ESCAPED.sub(r"\1", pattern)


def identifiers(pattern: str, limit: int = 6) -> list[str]:
    """The identifiers of ``pattern`` worth looking up: at least 3 characters, not a stop word or
    keyword, in order, without duplicates, at most ``limit``."""
    out: list[str] = []
    for m in _IDENT.finditer(pattern):
        w = m.group(0)
        if len(w) < 3 or w.lower() in _STOPWORDS or w in out or w.isdigit():
            continue
        out.append(w)
    return out[:limit]


def format_word_files(word: str, counts: dict[str, int], max_files: int = 5) -> str:
    """``bar: x.py (3), y.py (1) and 12 more files`` (source files first, then most matches)."""
    if not counts:
        return f"{word}: nowhere"
    order = sorted(counts, key=lambda p: (_KIND_RANK[path_kind(p)], -counts[p], p))
    listed = ", ".join(f"{p} ({counts[p]})" for p in order[:max_files])
    more = len(order) - max_files
    return f"{word}: {listed}" + (f" and {more} more files" if more > 0 else "")


def explain_miss(searcher: Searcher, pattern: str, rel: str, regex: bool, bounds: Bounds) -> str:
    """What to tell the model when ``pattern`` matched nothing under ``rel``: matches of the
    pattern read the other way (as a regular expression, or without its backslashes; as plain
    text when it was a regex), else case-insensitive matches, else the files of the whole
    repository where each identifier of the pattern occurs (``""`` when there is nothing to say)."""
    small = Bounds(per_file=3, max_lines=10, line_chars=bounds.line_chars, max_chars=1500,
                   more_files=5)
    alternatives: list[tuple[str, str, bool]] = []
    if not regex and looks_like_regex(pattern):
        try:
            re.compile(pattern)
            alternatives.append(("read as a regular expression", pattern, True))
        except re.error:
            pass
        plain = unescape(pattern)
        if plain != pattern:
            alternatives.append((f"as the text {plain!r} (without the backslashes)", plain, False))
    elif regex:
        alternatives.append(("as plain text", pattern, False))
    if not regex and ": " in pattern:  # "TypeError: A Vector must be supplied": the message
        tail = pattern.split(": ", 1)[1].strip()
        if len(tail) >= 8:
            alternatives.append((f"after its {pattern.split(': ', 1)[0]!r} prefix, {tail!r},",
                                 tail, False))
    for label, pat, rx in alternatives:
        try:
            hits = searcher.grep(pat, rel, regex=rx)
        except re.error:
            continue
        if hits:
            return f"The pattern {label} matches:\n{format_hits(hits, small)[0]}"
    try:
        folded = searcher.grep(pattern, rel, regex=regex, ignore_case=True)
    except re.error:
        folded = Hits()
    if folded:
        return f"Ignoring upper/lower case it matches:\n{format_hits(folded, small)[0]}"
    words = identifiers(_LETTER_ESCAPE.sub(" ", pattern))
    if not words:
        return ""
    if words == [pattern] and rel == ".":
        return f"{pattern!r} occurs nowhere in the repository, in any upper/lower case."
    counts = {w: searcher.word_counts(w) for w in words}
    # the rarest words say most about where the code is: them first, words found nowhere last
    order = sorted(words, key=lambda w: (not counts[w], len(counts[w])))
    lines = [format_word_files(w, counts[w]) for w in order]
    return ("Where the words of the pattern occur in the repository (file, matching lines):\n"
            + "\n".join(lines))
