"""What an issue text names that can be searched for in the source, without a model.

``extract(text)`` returns ``Clues``:

- ``frames``: traceback frames as ``(path, line, function)`` — CPython tracebacks
  (``File "x.py", line 12, in f``), IPython ones (``/site-packages/pkg/x.py in f(a)`` with its
  ``---> 61`` line) and pytest's (``pkg/x.py:12: in f``); paths as written (absolute,
  ``site-packages``, Windows), mapped to the repository by ``locate``;
- ``paths``: file paths and dotted module names mentioned anywhere, and GitHub ``blob/REF/PATH#L12``
  links (``links``: path and line);
- ``errors``: the messages of ``SomethingError: message`` lines and quoted sentences, searched
  as fixed strings (with their longest literal fragments, since the source formats them);
- ``identifiers``: CamelCase, snake_case and dotted names, names called or defined in the
  issue's code (```` ``` ```` blocks, ``>>>`` lines, backticks), minus Python keywords and
  builtins.
"""

from __future__ import annotations

import builtins
import keyword
import re
from dataclasses import dataclass, field

_CODE_BLOCK = re.compile(r"```[^\n]*\n(.*?)(?:```|$)", re.DOTALL)
_BACKTICK = re.compile(r"`([^`\n]{2,120})`")
_PY_FRAME = re.compile(r'File "([^"]+)", line (\d+)(?:, in ([\w<>.]+))?')
_IPY_FRAME = re.compile(r"^\s*(\S+\.py) in ([\w<>.]+)\(", re.MULTILINE)
_IPY_ARROW = re.compile(r"^-*> ?(\d+)\s", re.MULTILINE)
_PYTEST_FRAME = re.compile(r"^(\S+\.py):(\d+): (?:in (\w+)|\w*Error)", re.MULTILINE)
_LINK = re.compile(r"github\.com/[\w.-]+/[\w.-]+/blob/[\w.-]+/([\w./-]+)(?:#L(\d+))?")
_PATH = re.compile(r"(?<![\w/.-])((?:[\w.-]+[/\\])*[\w-]+\.(?:py|pyx|pxd|pyi|cfg|toml|ini|c|h|js))\b")
_ERROR_LINE = re.compile(r"^\s*(?:E\s+)?([A-Z]\w*(?:Error|Exception|Warning)): (.{6,300})$", re.MULTILINE)
_ERROR_INLINE = re.compile(r"\b([A-Z]\w*(?:Error|Exception|Warning)): ([^`\n]{6,300})")
_QUOTED = re.compile(r"""(?<![\w])(["'])([^"'\n]{12,200})\1""")
_DOTTED = re.compile(r"\b([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)\b")
_CAMEL = re.compile(r"\b([A-Z][a-z0-9]+(?:[A-Z][A-Za-z0-9]*)+|[A-Z]{2,}[a-z][A-Za-z0-9]*)\b")
_SNAKE = re.compile(r"\b(_{0,2}[a-z][a-z0-9]*(?:_[a-z0-9]+)+_{0,2})\b")
_CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
_NAME = re.compile(r"\b([A-Za-z_]\w{2,})\b")

#: never searched: Python's keywords and builtins (exact case)
COMMON = frozenset(set(keyword.kwlist) | set(dir(builtins)) | {"self", "cls", "args", "kwargs"})
#: never searched in any case: words of tracebacks, shells and prose
ENGLISH = frozenset({
    "traceback", "most", "recent", "call", "last", "line", "file", "module", "stdin", "ipython",
    "input", "python", "python3", "pip", "http", "https", "www", "com", "github", "org", "the",
    "and", "for", "not", "with", "this", "that", "but", "are", "was", "you", "can", "should",
    "would", "when", "what", "how", "then", "expected", "actual", "output", "result", "error",
    "value", "test", "tests", "example", "issue", "bug", "version", "lib", "site", "packages",
    "usr", "local", "bin", "env", "envs", "venv", "main", "out", "foo", "bar", "baz", "during",
    "above", "another", "occurred", "handling", "exception", "following", "here", "there",
    "instead", "also", "have", "has", "does", "doesn", "don", "works", "work", "fine", "using",
})


@dataclass
class Clues:
    """See the module docstring. ``identifiers`` maps a name to how strongly the issue points at
    it (1: mentioned; 2: in code or backticks; 3: called/defined or in a traceback)."""

    frames: list[tuple[str, int, str]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    links: list[tuple[str, int]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    identifiers: dict[str, int] = field(default_factory=dict)

    def add_identifier(self, name: str, strength: int) -> None:
        name = name.strip(".")
        if len(name) < 3 or name in COMMON or name.lower() in ENGLISH or name.isdigit():
            return
        self.identifiers[name] = max(strength, self.identifiers.get(name, 0))

    def to_json(self) -> dict:
        return {"frames": [list(f) for f in self.frames], "paths": self.paths,
                "links": [list(x) for x in self.links], "errors": self.errors,
                "identifiers": dict(sorted(self.identifiers.items(), key=lambda kv: (-kv[1], kv[0])))}


def _frames(text: str) -> list[tuple[str, int, str]]:
    frames: list[tuple[str, int, str]] = []
    for m in _PY_FRAME.finditer(text):
        frames.append((m.group(1).replace("\\", "/"), int(m.group(2)), m.group(3) or ""))
    for m in _IPY_FRAME.finditer(text):
        arrow = _IPY_ARROW.search(text, m.end())
        line = int(arrow.group(1)) if arrow else 0
        frames.append((m.group(1).replace("\\", "/"), line, m.group(2)))
    for m in _PYTEST_FRAME.finditer(text):
        frames.append((m.group(1).replace("\\", "/"), int(m.group(2)), m.group(3) or ""))
    seen: set[tuple[str, int, str]] = set()
    return [f for f in frames if not (f in seen or seen.add(f))]


def error_fragments(message: str, min_len: int = 10) -> list[str]:
    """Fixed strings to search for an error message: the message, then its literal pieces between
    the parts a format string fills in (quoted values, numbers, reprs), longest first."""
    msg = message.strip().rstrip(".")
    out = [msg] if len(msg) >= min_len else []
    pieces = re.split(r"""['"`].*?['"`]|\d+(?:\.\d+)?|<[^>]*>|\([^)]*\)|\[[^\]]*\]|\{[^}]*\}""", msg)
    for piece in sorted((p.strip(" :,.;") for p in pieces), key=len, reverse=True):
        if len(piece) >= min_len and piece not in out and " " in piece:
            out.append(piece)
    return out[:4]


def extract(text: str) -> Clues:
    """The clues of one issue text (see the module docstring)."""
    clues = Clues()
    clues.frames = _frames(text)
    for m in _LINK.finditer(text):
        clues.links.append((m.group(1), int(m.group(2) or 0)))
    paths: list[str] = [p for p, _, _ in clues.frames] + [p for p, _ in clues.links]
    paths += [m.group(1).replace("\\", "/") for m in _PATH.finditer(text)]
    ticks = "\n".join(_BACKTICK.findall(text))
    for m in [*_ERROR_LINE.finditer(text), *_ERROR_INLINE.finditer(ticks)]:
        for frag in error_fragments(m.group(2)):
            if frag not in clues.errors:
                clues.errors.append(frag)
    for m in _QUOTED.finditer(text):
        s = m.group(2).strip()
        if " " in s and not s.startswith(("http", "/")) and s not in clues.errors:
            clues.errors.append(s)
    code = "\n".join(_CODE_BLOCK.findall(text))
    code += "\n" + "\n".join(ln for ln in text.splitlines() if ln.lstrip().startswith(">>>"))
    for _, _, fn in clues.frames:
        if fn and not fn.startswith("<"):
            clues.add_identifier(fn.split(".")[-1], 3)
    for m in _DOTTED.finditer(text):
        dotted = m.group(1)
        if re.fullmatch(r"[\w.-]+\.(py|pyx|cfg|toml|ini|txt|rst|md|org|com|io|html)", dotted):
            continue
        parts = dotted.split(".")
        if all(p.islower() or p.startswith("_") for p in parts[:-1]) and len(parts) >= 2:
            paths.append("/".join(parts))  # a module path, maybe (checked by locate)
        for p in parts:
            clues.add_identifier(p, 2 if len(parts) > 2 else 1)
    for src, strength in ((text, 1), (ticks, 2), (code, 2)):
        for m in _CAMEL.finditer(src):
            clues.add_identifier(m.group(1), strength + (1 if src is not text else 0))
        for m in _SNAKE.finditer(src):
            clues.add_identifier(m.group(1), strength + (1 if src is not text else 0))
    for m in _CALL.finditer(text):
        clues.add_identifier(m.group(1), 2)
    for src in (code, ticks):
        for m in _CALL.finditer(src):
            clues.add_identifier(m.group(1), 3)
        for m in _NAME.finditer(src):
            clues.add_identifier(m.group(1), 1)
    seen: set[str] = set()
    clues.paths = [p for p in paths if not (p in seen or seen.add(p))]
    return clues
