"""The agent's tools and the environment that executes them in a workspace.

Tool names and argument names are a contract with the policy engine (``fak.policy``) and the
gateway; keep them:

==========  ==============================================  ======================================
tool        arguments                                       what it does
==========  ==============================================  ======================================
read        path, start_line?, end_line? (1-based, incl.)   a window of at most ``max_read_lines``
                                                            (100) numbered lines under a
                                                            ``path: lines a-b of N`` header, and
                                                            how to read the next window
list        path?                                           entries of a directory (dirs end in
                                                            ``/``)
search      pattern, path?, regex? (default false)          matching lines ``file:line:text``;
                                                            ``pattern`` is a fixed string unless
                                                            ``regex`` (Python ``re``); source files
                                                            first, bounded per file and in all;
                                                            on a miss, where each identifier of
                                                            the pattern occurs (``search.py``)
edit        path, old, new                                  replace ``old`` by ``new``; ``old``
                                                            must occur exactly once (else every
                                                            match, or the closest lines, are
                                                            shown), differ from ``new``; a ``.py``
                                                            file must still parse; the changed
                                                            lines are shown; a note on test/doc
                                                            files
write       path, content                                   create or overwrite a file (``.py``
                                                            must parse)
edit/write                                                  refuse git metadata: ``.git`` and all
                                                            under it, a nested ``.git`` folder or
                                                            ``gitdir:`` file, a symlink into one
                                                            (``fak.gitsafe.git_metadata``)
bash        command                                         ``bash -c`` in the workspace, inside
                                                            the sandbox (``fak.sandbox``: no
                                                            network, the workspace the only
                                                            writable tree, limits), only with
                                                            ``--allow-exec``
submit      (none)                                          end the run; the patch is the
                                                            workspace diff
==========  ==============================================  ======================================

Outputs are cut to a bound (``max_output_chars``): the head and the tail are kept, the middle is
replaced by a line saying how many characters were cut.

Identical calls: ``call_key(name, arguments)`` is the same for two calls that do the same thing
(arguments normalized: defaults dropped, paths normalized, integers given as strings read as
integers), and ``ToolBox.state_token()`` changes whenever the workspace's files may have changed
(a successful edit or write; a bash command after which ``git status`` differs), so the agent can
tell a repeated call (same key, same state) from a call worth running again.
"""

from __future__ import annotations

import ast
import difflib
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from fak.agent import search as code_search
from fak.agent.exceptions import SandboxError, Submitted, ToolError
from fak.agent.search import Bounds, path_kind
from fak.agent.workspace import Workspace
from fak.gitsafe import git
from fak.sandbox import (
    Limits,
    MiB,
    Sandbox,
    SandboxResult,
    SandboxUnavailable,
    probe,
    run_on_host,
    venv_paths,
)
from fak.toolcalls.wire import FunctionDefinition, Tool, arguments_digest


@dataclass(frozen=True)
class Param:
    """One argument of a tool: its Python type (``str``, ``int``, ``bool``; the JSON Schema type
    ``string``, ``integer``, ``boolean``), whether a call must give it, what it is (in the
    schema's ``description``), and the value a call that leaves it out gets (``None``: none)."""

    type: type
    required: bool = False
    description: str = ""
    default: Any = None


#: The agent's tools in the order they are offered: name → (description, arguments). The one
#: definition of them: the ``tools`` schema (:func:`tool_schemas`), the argument check
#: (``ToolBox.execute``) and the defaults :func:`normalize_arguments` drops come from it.
TOOLS: dict[str, tuple[str, dict[str, Param]]] = {
    "read": ("Show up to 100 lines of a file with line numbers, from start_line (default 1).", {
        "path": Param(str, True, "file path, relative to the repository root"),
        "start_line": Param(int, False, "first line (1-based)", default=1),
        "end_line": Param(int, False, "last line (inclusive)")}),
    "list": ("List the files and folders in a folder (default: the repository root).", {
        "path": Param(str, False, "folder path")}),
    "search": ("Search the files for a text (an exact string, not a regular expression, unless regex is "
               "true); prints file:line:text for each matching line.", {
        "pattern": Param(str, True, "the text to find, e.g. a function or class name"),
        "path": Param(str, False, "file or folder to search (default: everything)"),
        "regex": Param(bool, False, "true: pattern is a Python regular expression", default=False)}),
    "edit": ("Replace the text `old` with `new` in a file. `old` must appear exactly once and match the file "
             "exactly, including indentation.", {
        "path": Param(str, True), "old": Param(str, True, "exact text to replace"),
        "new": Param(str, True, "replacement text")}),
    "write": ("Create a file, or overwrite it, with the given content.", {
        "path": Param(str, True), "content": Param(str, True)}),
    "bash": ("Run a shell command in the repository root (in a sandbox: no network, only the repository is "
             "writable). Use it to run tests or small Python scripts.", {
        "command": Param(str, True)}),
    "submit": ("Finish: submit your changes to the repository.", {}),
}
TOOL_NAMES = tuple(TOOLS)
_JSON_TYPES = {str: "string", int: "integer", bool: "boolean"}


def tool_schemas(allow_exec: bool) -> list[dict]:
    """The OpenAI ``tools`` array (``fak.toolcalls.wire.Tool``, a JSON Schema per function) of
    :data:`TOOLS`; ``bash`` only when ``allow_exec``."""
    tools = []
    for name, (description, params) in TOOLS.items():
        if name == "bash" and not allow_exec:
            continue
        properties = {key: {"type": _JSON_TYPES[p.type], **({"description": p.description} if p.description else {})}
                      for key, p in params.items()}
        required = [key for key, p in params.items() if p.required]
        schema = {"type": "object", "properties": properties, "required": required}
        tools.append(Tool(function=FunctionDefinition(name, description, schema)))
    return msgspec.to_builtins(tools)


_PATH_ARGS = ("path",)
_MISSING = object()


def normalize_arguments(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """``arguments`` of tool ``name`` in the form two calls that do the same thing share:
    ``None`` values and defaults dropped (``read`` from line 1, ``search`` not regex), a path
    normalized (``./a//b/`` → ``a/b``; the root, ``.`` or ``""``, dropped), integers and booleans
    given as strings read as such, a bash command stripped of surrounding blanks. Unknown
    arguments are kept as they are (the call fails the same way each time)."""
    out: dict[str, Any] = {}
    for key, value in (arguments or {}).items():
        if value is None:
            continue
        if key in _PATH_ARGS and isinstance(value, str):
            value = os.path.normpath(value.strip()) if value.strip() else "."
            if value in (".", "./"):
                continue
        elif isinstance(value, str) and key in ("start_line", "end_line") \
                and value.strip().lstrip("-").isdigit():
            value = int(value)
        elif isinstance(value, str) and key == "regex" and value.strip().lower() in ("true", "false"):
            value = value.strip().lower() == "true"
        elif key == "command" and isinstance(value, str):
            value = value.strip()
        param = TOOLS[name][1].get(key) if name in TOOLS else None
        default = param.default if param is not None and param.default is not None else _MISSING
        if default is not _MISSING and type(value) is type(default) and value == default:
            continue
        out[key] = value
    return out


def call_key(name: str, arguments: dict[str, Any]) -> str:
    """``name`` plus the canonical digest of the normalized arguments: equal for two calls that
    do the same thing (``normalize_arguments``)."""
    return f"{name}:{arguments_digest(normalize_arguments(name, arguments))}"


@dataclass
class ToolResult:
    """What one tool call gave back: ``output`` (text shown to the model), ``ok`` (False when the
    call failed), ``returncode`` (bash only), ``duration_s`` (seconds)."""

    output: str
    ok: bool = True
    returncode: int | None = None
    duration_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def truncate_middle(text: str, limit: int) -> str:
    """``text`` cut to at most about ``limit`` characters: head and tail kept, the middle replaced
    by a line saying how many characters were left out."""
    if limit <= 0 or len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n... [{cut} characters cut] ...\n{text[-tail:]}"


def check_network_isolation() -> str | None:
    """``None`` when the sandbox (``fak.sandbox``) can be made here, else what is missing.
    (The name is older than the sandbox; it now checks the whole sandbox, not only ``-n``.)"""
    info = probe()
    return None if info.ok else info.detail


def python_syntax_error(source: str, filename: str) -> str | None:
    """``None`` when ``source`` parses as Python (the running interpreter's grammar), else the
    error as ``file:line:col: message`` plus the offending line."""
    try:
        ast.parse(source, filename=filename)
    except SyntaxError as e:
        line = (e.text or "").rstrip("\n")
        where = f"{filename}:{e.lineno}:{e.offset}"
        return f"{where}: {e.msg}" + (f"\n    {line}" if line else "")
    except ValueError as e:  # null bytes
        return f"{filename}: {e}"
    return None


_LINE_NUMBER = re.compile(r"^ *\d+(?:  |\t|: ?| \| ?)")


def _strip_line_numbers(text: str) -> str | None:
    """``text`` without the ``  12  `` prefixes that read puts before each line, when every
    non-blank line has one; else ``None``."""
    lines = text.split("\n")
    if not any(ln.strip() for ln in lines):
        return None
    out = []
    for ln in lines:
        if not ln.strip():
            out.append(ln)
            continue
        m = _LINE_NUMBER.match(ln)
        if m is None:
            return None
        out.append(ln[m.end():])
    return "\n".join(out)


def _edit_not_unique(shown: str, text: str, old: str, count: int, limit: int = 10) -> str:
    """Every line where ``old`` starts (line number, that line, how many times), up to ``limit``."""
    starts: dict[int, int] = {}
    pos = text.find(old)
    while pos >= 0:
        lineno = text.count("\n", 0, pos) + 1
        starts[lineno] = starts.get(lineno, 0) + 1
        pos = text.find(old, pos + 1)
    lines = text.splitlines()
    places = [f"  line {n}: {lines[n - 1].strip()[:120]}" + (f"  ({k} times)" if k > 1 else "")
              for n, k in list(starts.items())[:limit]]
    more = f"\n  ... and {len(starts) - limit} more lines" if len(starts) > limit else ""
    return (f"old occurs {count} times in {shown}, so it is not clear which one to change; the "
            f"file was not changed. It occurs at:\n" + "\n".join(places) + more
            + "\nPut more of the surrounding lines into old (and new) so that it occurs once.")


def _closest_lines(text: str, old: str, min_ratio: float = 0.5) -> tuple[int, int, float] | None:
    """The lines of ``text`` most like ``old`` (as many lines as ``old`` has): (first line, last
    line, similarity 0..1 by ``difflib.SequenceMatcher``), or ``None`` below ``min_ratio``."""
    lines = text.splitlines()
    want = old.strip("\n").split("\n")
    k = max(1, len(want))
    if not lines:
        return None
    target = "\n".join(ln.strip() for ln in want)
    matcher = difflib.SequenceMatcher(autojunk=False)
    matcher.set_seq2(target)
    best: tuple[float, int] = (0.0, 0)
    for i in range(max(1, len(lines) - k + 1)):
        window = "\n".join(ln.strip() for ln in lines[i:i + k])
        matcher.set_seq1(window)
        if matcher.real_quick_ratio() <= best[0] or matcher.quick_ratio() <= best[0]:
            continue
        r = matcher.ratio()
        if r > best[0]:
            best = (r, i)
    ratio, i = best
    if ratio < min_ratio:
        return None
    return i + 1, min(len(lines), i + k), ratio


@dataclass
class ToolBox:
    """The ``Environment`` of the agent: executes tool calls in ``workspace``.

    ``allow_exec`` enables ``bash``, which runs in ``fak.sandbox`` around the workspace (its
    ``.git`` read-only, so nothing written there runs later in fak's own git commands);
    ``exec_timeout_s`` bounds one command (seconds); ``max_output_chars`` bounds what goes back
    to the model; ``unsafe_no_sandbox`` runs bash on the host with fak's privileges (only when
    asked; ``unsafe_network`` is its deprecated name); ``env_overrides`` are set in bash's
    environment (the task's virtual environment: ``PATH``, ``VIRTUAL_ENV``; that venv and its
    interpreter are readable inside); ``sandbox_writable``: more writable paths (the task's
    per-instance venv). Raises ``SandboxUnavailable`` (a ``SandboxError``) at construction when
    exec is allowed, the sandbox is required and cannot be made here. ``max_read_lines`` is
    the read window (lines); ``search_bounds`` bounds a search's output
    (``fak.agent.search.Bounds``: lines per file, lines and characters in all).
    """

    workspace: Workspace
    allow_exec: bool = False
    exec_timeout_s: float = 60.0
    max_output_chars: int = 10_000
    unsafe_network: bool = False  # deprecated name of unsafe_no_sandbox
    max_read_lines: int = 100
    env_overrides: dict[str, str] = field(default_factory=dict)
    max_list_entries: int = 300
    search_bounds: Bounds = field(default_factory=Bounds)
    unsafe_no_sandbox: bool = False
    sandbox_writable: tuple[Path, ...] = ()
    _generation: int = field(default=0, init=False, repr=False)
    _fingerprint: str | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.unsafe_no_sandbox = self.unsafe_no_sandbox or self.unsafe_network
        self._sandbox: Sandbox | None = None
        if self.allow_exec and not self.unsafe_no_sandbox:
            venv = self.env_overrides.get("VIRTUAL_ENV")
            try:
                self._sandbox = Sandbox(
                    self.workspace.root, writable=self.sandbox_writable,
                    readable=venv_paths(venv) if venv else (),
                    readonly=[self.workspace.root / ".git"], env=self._bash_env(),
                    timeout_s=self.exec_timeout_s, limits=Limits(output_bytes=4 * MiB))
            except SandboxUnavailable as e:
                raise SandboxUnavailable(
                    f"bash must run in the sandbox, and it cannot be made here: {e}. Install "
                    "bubblewrap (apt-get install bubblewrap) or allow user namespaces; "
                    "--unsafe-no-sandbox runs model-written commands on this host with fak's "
                    "privileges (never for untrusted models).") from None

    @property
    def tool_names(self) -> tuple[str, ...]:
        return tuple(n for n in TOOL_NAMES if n != "bash" or self.allow_exec)

    def execute(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Run tool ``name`` with ``arguments``.

        Raises ``Submitted`` for ``submit``; ``ToolError`` for an unknown tool, missing or
        ill-typed arguments, or a failed operation (message meant for the model).
        """
        if name not in TOOL_NAMES:
            raise ToolError(f"unknown tool {name!r}; the tools are: {', '.join(self.tool_names)}")
        if name == "bash" and not self.allow_exec:
            raise ToolError("the bash tool is not available in this run (no --allow-exec)")
        if not isinstance(arguments, dict):
            raise ToolError(f"arguments of {name} must be a JSON object")
        checked = self._check_args(name, arguments)
        if name == "bash" and self._fingerprint is None:
            self._fingerprint = self.workspace.fingerprint()
        t0 = time.perf_counter()
        try:
            result = getattr(self, f"_tool_{name}")(**checked)
        finally:
            if name == "bash":  # a command may have changed files
                fp = self.workspace.fingerprint()
                if fp != self._fingerprint:
                    self._fingerprint = fp
                    self._generation += 1
        if name in ("edit", "write"):  # only reached when the change was made
            self._generation += 1
            self._fingerprint = None
        result.duration_s = time.perf_counter() - t0
        result.output = truncate_middle(result.output, self.max_output_chars)
        return result

    def state_token(self) -> int:
        """A number that changes whenever the workspace's files may have changed through this
        toolbox (a successful edit or write, a bash command after which the work tree's status
        differs). Two identical calls made at the same token give the same result."""
        return self._generation

    def _check_args(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        spec = TOOLS[name][1]
        out: dict[str, Any] = {}
        for key, value in arguments.items():
            if key not in spec:
                if name == "submit":
                    continue  # small models sometimes pass a summary; harmless
                raise ToolError(f"{name} has no argument {key!r}; its arguments: "
                                f"{', '.join(spec) or 'none'}")
            typ = spec[key].type
            if value is None:
                continue
            if typ is int and isinstance(value, str) and value.strip().lstrip("-").isdigit():
                value = int(value)
            if typ is bool and isinstance(value, str) and value.strip().lower() in ("true", "false"):
                value = value.strip().lower() == "true"
            if typ is bool and isinstance(value, int) and value in (0, 1):
                value = bool(value)
            if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
                raise ToolError(f"argument {key!r} of {name} must be a {typ.__name__}")
            out[key] = value
        missing = [k for k, p in spec.items() if p.required and k not in out]
        if missing:
            raise ToolError(f"{name} needs the argument(s): {', '.join(missing)}")
        return out

    def _path(self, path: str | None) -> Path:
        try:
            return self.workspace.resolve(path)
        except ValueError as e:
            raise ToolError(f"{e}; paths are relative to the repository root") from None

    def _write_path(self, path: str) -> Path:
        """``_path`` for edit/write: git metadata is refused too (``Workspace.resolve_for_write``)."""
        self._path(path)
        try:
            return self.workspace.resolve_for_write(path)
        except ValueError as e:
            raise ToolError(f"refused: {e}. The file was not changed.") from None

    def _not_found(self, what: str, path: str | None) -> ToolError:
        """A "no such file" error with a hint: tracked files of the same name, else the root's
        entries (small models guess paths such as ``src/x.py`` or ``OWNER/NAME/x.py``)."""
        name = Path(str(path or "").rstrip("/")).name
        hint = ""
        if name:
            proc = git(self.workspace.root, "ls-files", "-z", check=False, text=False, timeout=60)
            files = proc.stdout.decode("utf-8", "replace").split("\0")
            found: set[str] = set()
            for f in files:
                parts = f.split("/")
                for i, part in enumerate(parts):
                    if part == name:
                        found.add("/".join(parts[: i + 1]))
            candidates = sorted(found, key=lambda c: (c.count("/"), c))
            if candidates:
                hint = " Did you mean: " + ", ".join(candidates[:5]) + "?"
        if not hint:
            entries = sorted(e.name + ("/" if e.is_dir() else "") for e in self.workspace.root.iterdir()
                             if e.name != ".git")
            hint = " Paths are relative to the repository root, which holds: " + ", ".join(entries[:40])
        return ToolError(f"no such {what}: {path}.{hint}")

    # -- tools ---------------------------------------------------------------------------------

    def _tool_read(self, path: str, start_line: int | None = None,
                   end_line: int | None = None) -> ToolResult:
        p = self._path(path)
        if p.is_dir():
            raise ToolError(f"{path} is a folder; use list to see its entries")
        if not p.is_file():
            raise self._not_found("file", path)
        data = p.read_bytes()
        if b"\0" in data[:8192]:
            raise ToolError(f"{path} is a binary file ({len(data)} bytes)")
        lines = data.decode("utf-8", "replace").splitlines()
        n = len(lines)
        shown = self.workspace.display(p)
        if n == 0:
            return ToolResult(f"{shown} is empty (0 lines)")
        start = max(1, start_line or 1)
        if start > n:
            raise ToolError(f"{shown} has only {n} lines; read it with start_line between 1 and {n}")
        end = min(n, end_line if end_line is not None else n)
        if end < start:
            raise ToolError(f"end_line {end_line} is before start_line {start}")
        end = min(end, start + self.max_read_lines - 1)
        width = len(str(end))
        body = "\n".join(f"{i:>{width}}  {lines[i - 1]}" for i in range(start, end + 1))
        whole = " (the whole file)" if start == 1 and end == n else ""
        header = f"[{shown}: lines {start}-{end} of {n}{whole}]"
        footer = ""
        if end < n and (end_line is None or end_line > end):  # the window ended the read
            nxt = min(n, end + self.max_read_lines)
            footer = (f"\n[lines {end + 1}-{n} not shown; the next window: read with path "
                      f"{shown!r} and start_line {end + 1} (lines {end + 1}-{nxt})]")
        return ToolResult(f"{header}\n{body}{footer}")

    def _tool_list(self, path: str | None = None) -> ToolResult:
        p = self._path(path)
        if not p.is_dir():
            raise self._not_found("folder", path)
        entries = sorted(p.iterdir(), key=lambda e: (not e.is_dir(), e.name))
        names = [e.name + ("/" if e.is_dir() else "") for e in entries if e.name != ".git"]
        more = len(names) - self.max_list_entries
        names = names[: self.max_list_entries]
        if more > 0:
            names.append(f"[{more} more entries]")
        return ToolResult("\n".join(names) if names else "(empty folder)")

    def _tool_search(self, pattern: str, path: str | None = None,
                     regex: bool = False) -> ToolResult:
        p = self._path(path)
        if not p.exists():
            raise self._not_found("file or folder", path)
        if not pattern.strip():
            raise ToolError("pattern is empty: give the text to find, e.g. a function name")
        note = ""
        if "\n" in pattern:  # matching is per line: look for the first line that says something
            first = next(ln for ln in pattern.splitlines() if ln.strip())
            note = f"[matching is per line: searched only the first line, {first!r}]\n"
            pattern = first
        if regex:
            try:
                re.compile(pattern)
            except re.error as e:
                raise ToolError(f"bad regular expression {pattern!r}: {e}; leave out regex (or "
                                "set it false) to search for the text as it is") from None
        rel = self.workspace.display(p)
        searcher = code_search.Searcher(self.workspace.root)
        hits = searcher.grep(pattern, rel, regex=regex)
        if hits:
            text, _ = code_search.format_hits(hits, self.search_bounds)
            return ToolResult(note + text)
        kind = "regular expression" if regex else "text"
        where = "the repository" if rel == "." else rel
        msg = f"no matches for the {kind} {pattern!r} in {where}."
        extra = code_search.explain_miss(searcher, pattern, rel, regex, self.search_bounds)
        return ToolResult(note + msg + (f"\n{extra}" if extra else ""))

    def _check_python(self, p: Path, before: str | None, after: str) -> None:
        if p.suffix != ".py":
            return
        err = python_syntax_error(after, self.workspace.display(p))
        if err is None:
            return
        if before is not None and python_syntax_error(before, p.name) is not None:
            return  # the file did not parse before either (e.g. Python 2 code): not our check
        raise ToolError(f"rejected: the change makes {self.workspace.display(p)} invalid Python; "
                        f"the file was not changed.\n{err}")

    def _tool_edit(self, path: str, old: str, new: str) -> ToolResult:
        p = self._write_path(path)
        if not p.is_file():
            err = self._not_found("file", path)
            raise ToolError(f"{err} (write creates a new file)")
        shown = self.workspace.display(p)
        text = p.read_text(encoding="utf-8", errors="surrogateescape")
        if old == "":
            raise ToolError("old must not be empty: copy the lines to change from what read showed")
        if old == new:
            raise ToolError("old and new are the same text, so the edit would change nothing; "
                            "put the changed code in new")
        note = ""
        count = text.count(old)
        if count == 0:
            stripped_old, stripped_new = _strip_line_numbers(old), _strip_line_numbers(new)
            if stripped_old is not None and text.count(stripped_old) == 1:
                # the model copied read's line numbers into old (and maybe new): take them out
                old, new = stripped_old, stripped_new if stripped_new is not None else new
                count = 1
                note = "\n[the line numbers copied from read were taken out of old and new]"
                if old == new:
                    raise ToolError("old and new are the same text once the line numbers are "
                                    "taken out, so the edit would change nothing")
        if count == 0:
            raise ToolError(self._edit_not_found(shown, text, old))
        if count > 1:
            raise ToolError(_edit_not_unique(shown, text, old, count))
        updated = text.replace(old, new, 1)
        self._check_python(p, text, updated)
        p.write_text(updated, encoding="utf-8", errors="surrogateescape")
        start = text[: text.index(old)].count("\n") + 1
        new_lines = updated.splitlines()
        lo = max(1, start - 2)
        hi = min(len(new_lines), start + new.count("\n") + 2)
        snippet = "\n".join(f"{i:>{len(str(hi))}}  {new_lines[i - 1]}" for i in range(lo, hi + 1))
        kind = path_kind(shown)
        if kind != "source":
            what = "a test file" if kind == "test" else "documentation, not code"
            note += (f"\n[note: {shown} is {what}. The issue is fixed by changing the source "
                     "code; change tests or docs only in addition to that]")
        return ToolResult(f"edited {shown}; lines {lo}-{hi} now:\n{snippet}{note}")

    @staticmethod
    def _edit_not_found(shown: str, text: str, old: str) -> str:
        msg = f"old was not found in {shown}; the file was not changed."
        if old.strip() and text.count(old.strip()) == 1:
            return (msg + " It matches once without its leading/trailing whitespace: fix the "
                    "indentation (copy it exactly as read showed it, without the line numbers).")
        close = _closest_lines(text, old)
        if close is None:
            return msg + " Nothing in the file is close to it: read the file and copy the text exactly."
        lo, hi, ratio = close
        lines = text.splitlines()
        width = len(str(hi))
        block = "\n".join(f"{i:>{width}}  {lines[i - 1]}" for i in range(lo, hi + 1))
        return (f"{msg} The closest lines ({lo}-{hi}, {ratio:.0%} similar) are:\n{block}\n"
                "Copy old exactly from these lines (without the line numbers), or read the file.")

    def _tool_write(self, path: str, content: str) -> ToolResult:
        p = self._write_path(path)
        if p.is_dir():
            raise ToolError(f"{path} is a folder")
        before = p.read_text(encoding="utf-8", errors="surrogateescape") if p.exists() else None
        self._check_python(p, before, content)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content, encoding="utf-8", errors="surrogateescape")
        verb = "overwrote" if before is not None else "created"
        return ToolResult(f"{verb} {self.workspace.display(p)} ({content.count(chr(10)) + 1} lines)")

    def _bash_env(self) -> dict[str, str]:
        """bash's variables on top of the sandbox's allow-list: quiet pagers, UTF-8, unbuffered
        Python, then ``env_overrides``."""
        env = {"LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TERM": "dumb", "PAGER": "cat",
               "GIT_PAGER": "cat", "PIP_NO_INPUT": "1", "PYTHONDONTWRITEBYTECODE": "1",
               "PYTHONUNBUFFERED": "1"}
        env.update(self.env_overrides)
        return env

    def _tool_bash(self, command: str) -> ToolResult:
        argv = ["bash", "-c", command]
        try:
            if self._sandbox is not None:
                res: SandboxResult = self._sandbox.run(argv, timeout_s=self.exec_timeout_s)
            else:  # --unsafe-no-sandbox
                env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                       "HOME": os.environ.get("HOME", "/root"), **self._bash_env()}
                res = run_on_host(argv, cwd=self.workspace.root, env=env,
                                  timeout_s=self.exec_timeout_s, limits=Limits(output_bytes=4 * MiB))
        except SandboxError as e:
            raise ToolError(f"the sandbox failed to start the command: {e}") from None
        except (ValueError, UnicodeError) as e:  # a NUL byte, a lone surrogate: not runnable
            raise ToolError(f"the command cannot be run: {e}") from None
        text = truncate_middle(res.output, self.max_output_chars)
        extra = {"timed_out": res.killed == "timeout", "killed": res.killed}
        if res.note:
            return ToolResult(f"{text}\n[{res.note}]", ok=False, returncode=res.returncode,
                              extra=extra)
        return ToolResult(text if text.strip() else "(no output)", ok=res.returncode == 0,
                          returncode=res.returncode, extra=extra)

    def _tool_submit(self) -> ToolResult:
        raise Submitted("the model submitted")
