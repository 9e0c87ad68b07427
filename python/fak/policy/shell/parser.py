"""The shell analyzer's entry points (:func:`analyze`, :func:`analyze_full`), the state one
analysis shares across nested strings (:class:`Ctx`), the parser assembled from its parts
(:class:`Parser`: lexer, grammar, command following, git, files written), and the fast paths
that skip the full parser for plain command lines."""

from __future__ import annotations

from fak.policy import commands as _cmds
from fak.policy import gitcmd as _git
from fak.policy.shell.base import Ctx
from fak.policy.shell.follow import _EDITORS, _ENV_SETTERS, Follow, apply_cd
from fak.policy.shell.gitrun import GitRun
from fak.policy.shell.grammar import KEYWORDS, Grammar, stdin_of
from fak.policy.shell.lexer import _FAST_LINE, _SIMPLE, _UNQUOTE, CMD, Lexer, _unquote_piece
from fak.policy.shell.model import (EMPTY, MAX_COMMANDS, MAX_DEPTH, MAX_PARSE_CHARS,
                                    MAX_SOURCE_CHARS, ROOT_CWD, Analysis, Redirect,
                                    ShellSyntaxError, SimpleCommand)
from fak.policy.shell.written import WrittenFiles

# command names whose arguments hold other commands, change the directory or the environment
_SPECIAL = frozenset({*_cmds.WRAPPERS, "busybox", "toybox", "setarch", "flock", "sg", "git",
                      "find", "eval", "source", ".", "trap", "alias", "cd", "pushd", "popd",
                      "tar", "parallel", "gdb", "split", *_ENV_SETTERS, *_EDITORS})
# commands whose output files a later command of the same line may run
_FILE_MAKERS = frozenset({"cp", "install", "ln", "mv", "dd", "tee", "echo", "printf", "cat"})


def _may_run_written(cmds: list[SimpleCommand]) -> bool:
    """Some command writes a file and a later one runs a program by path or a shell script
    (``program`` is already set by :func:`_classify_command` for plain interpreters)."""
    for k, c in enumerate(cmds[:-1]):
        if c.name in _FILE_MAKERS or any(r.writes for r in c.redirects):
            return any("/" in d.argv[0] or (d.name in ("source", ".") and len(d.argv) > 1)
                       or (d.program == "file" and _cmds.is_shell(d.name))
                       for d in cmds[k + 1:] if d.argv)
    return False


class Parser(Follow, GitRun, WrittenFiles, Grammar, Lexer):
    """Lexer and permissive recursive parser over ``s`` from ``i``; ``closer`` is ``")"`` for an
    in-place ``$(...)``/``<(...)`` (the parse ends at the matching parenthesis)."""

    def __init__(self, ctx: Ctx, s: str, i: int, depth: int, via: str, stdin: str,
                 closer: str | None):
        if depth > MAX_DEPTH:
            raise ShellSyntaxError(f"commands nested deeper than {MAX_DEPTH} levels")
        self.ctx = ctx
        self.s = s
        self.i = i
        self.n = len(s)
        self.depth = depth
        self.via = via
        self.closer = closer
        self.base_stdin = stdin
        self.frames: list[tuple[str, str, bool, bool]] = []
        self.words: list[tuple[str, bool, int]] = []
        self.redirects: list[Redirect] = []
        self.pipe_next = False
        self.mode = CMD
        self.pending: list[tuple[Redirect, str, bool, bool]] = []
        self.func_next = False
        self.func_parens = False
        self.func_name = ""
        self.array_next = False
        self.after_time = False

    def _child(self, s: str, i: int, via: str, stdin: str, closer: str | None) -> Parser:
        """A parser for a nested command string (``s`` is this one's text for an in-place
        ``$(...)``); new text counts against the analysis's budget of characters."""
        if s is not self.s:
            self.ctx.budget -= len(s)
            if self.ctx.budget < 0:
                raise ShellSyntaxError(f"more than {MAX_PARSE_CHARS} characters to analyze "
                                       f"(nested command strings included)")
        return Parser(self.ctx, s, i, self.depth + 1, via, stdin, closer)

    def _err(self, what: str, at: int | None = None) -> ShellSyntaxError:
        return ShellSyntaxError(f"{what} at offset {self.i if at is None else at}")


def analyze(src: str, root: str | None = None) -> Analysis:
    """Every simple command in the shell command line ``src`` (str), normalized.

    ``root``: the real path of the workspace root, when known; then a command run by a path
    inside it is looked up on disk (:func:`fak.policy.binaries.real_program`). Bash receives
    the line as a C string, so it is read up to its first NUL. Raises
    :class:`ShellSyntaxError` when ``src`` is not valid shell (bash would run nothing), is
    longer than :data:`MAX_SOURCE_CHARS` characters, or the analysis cannot follow it. Runs in
    microseconds for typical commands: a line made only of plain or quoted words, control
    operators and simple redirections is tokenized by one regex in C (:func:`_analyze_line`);
    anything else goes through the full lexer and parser (:func:`analyze_full`), and both give
    the same result on the lines the first accepts."""
    if "\0" in src:
        src = src[:src.index("\0")]
    if len(src) > MAX_SOURCE_CHARS:
        raise ShellSyntaxError(f"command longer than {MAX_SOURCE_CHARS} characters")
    if src.isascii() and _SIMPLE.fullmatch(src) is not None:
        words = src.split()
        if not words:
            return EMPTY
        if words[0] not in KEYWORDS:
            n = len(words)
            cmd = SimpleCommand(words, [False] * n, [0] * n, [], "", ROOT_CWD, "")
            if _classify_command(cmd) == _PLAIN:
                return Analysis((cmd,))
    try:
        fast = _analyze_line(src, root)
        if fast is not None:
            return fast
        return analyze_full(src, root)
    except RecursionError:
        raise ShellSyntaxError("expansions nested too deeply") from None


def analyze_full(src: str, root: str | None = None) -> Analysis:
    """:func:`analyze` through the full lexer and parser, whatever the line looks like."""
    if "\0" in src:
        src = src[:src.index("\0")]
    if len(src) > MAX_SOURCE_CHARS:
        raise ShellSyntaxError(f"command longer than {MAX_SOURCE_CHARS} characters")
    ctx = Ctx(root)
    Parser(ctx, src, 0, 0, "", "", None).run()
    return _done(ctx)


def _done(ctx: Ctx) -> Analysis:
    if ctx.cwd_unknown or (ctx.deferred and ctx.cd_seen):
        for c in ctx.commands:
            c.cwds = (None,)
    return Analysis(tuple(ctx.commands))


_PLAIN, _CD, _PARSE = 0, 1, 2


def _classify_command(cmd: SimpleCommand) -> int:
    """How a command of static words is analyzed: ``_PLAIN`` (no other command runs; an
    interpreter's ``program`` is filled in here, a function of its words), ``_CD`` (changes the
    directory) or ``_PARSE`` (wrappers, ``eval``, ``bash -c`` strings, git global options and
    sub-commands that run commands, ``find -exec``, tar command options, awk and sed programs,
    programs run by path, ...: the parser's semantic expansion)."""
    argv = cmd.argv
    if not argv:
        return _PLAIN
    if "/" in argv[0]:
        return _PARSE
    name = cmd.name
    if name in _SPECIAL:
        if name == "git":
            if len(argv) < 2:
                return _PLAIN
            a = argv[1]
            return _PARSE if a.startswith("-") or a in _GIT_PARSE else _PLAIN
        if name == "find":
            return _PARSE if any(a.startswith(("-exec", "-ok")) for a in argv) else _PLAIN
        if name == "tar":
            return _PARSE if any(a.startswith(("--to", "--checkpoint-a", "--use", "--rsh", "--info",
                                               "--new", "-I", "-F")) for a in argv) else _PLAIN
        if name == "cd" or name == "pushd" or name == "popd":
            return _CD
        if name == "split":
            return _PARSE if any(a.startswith("--filter") for a in argv) else _PLAIN
        if name in _ENV_SETTERS:
            return _PARSE if any("=" in a for a in argv) else _PLAIN
        if name in _EDITORS:
            return _PARSE if any(a.startswith("+") or a in ("-c", "--cmd") for a in argv) \
                else _PLAIN
        return _PARSE
    if _cmds.is_interpreter(name):
        kind, idx = _cmds.interpreter_program(name, argv, cmd.dyn)
        if kind == "descriptor" or (kind == "string" and not _cmds.is_opaque_language(name)):
            return _PARSE
        cmd.program, cmd.program_index = kind, idx
    return _PLAIN


_GIT_PARSE = _git.FOLLOWED_SUBCOMMANDS - {"worktree", "archive", "format-patch", "bundle", "diff",
                                          "log", "show", "init"}


def _analyze_line(src: str, root: str | None) -> Analysis | None:
    """The common subset in one pass: ``None`` when the line needs the full parser (any
    expansion, escape, glob, brace, comment, here-document, keyword or assignment)."""
    specs: list[tuple[list[str], list[Redirect], str]] = []
    words: list[str] = []
    redirects: list[Redirect] = []
    pipe = False
    target: tuple[str, str] | None = None
    for m in _FAST_LINE.finditer(src):
        fd, rop, word, op, bad = m.groups()
        if word:
            sq = "'" in word
            dq = '"' in word
            if sq or dq:
                # quotes here only delimit whole pieces; with one kind, dropping it is exact
                if not dq:
                    text = word.replace("'", "")
                elif not sq:
                    text = word.replace('"', "")
                else:
                    text = _UNQUOTE.sub(_unquote_piece, word)
                plain = False
            else:
                text = word
                plain = True
            if target is not None:
                redirects.append(Redirect(target[1], int(target[0]) if target[0] else None,
                                          text, False, False))
                target = None
                continue
            if not words and ((plain and text in KEYWORDS) or "=" in text):
                return None
            words.append(text)
        elif op:
            if target is not None:
                return None
            if op == "&":
                return None     # background jobs: the grammar marks them concurrent
            if words or redirects:
                specs.append((words, redirects, "pipe" if pipe else ""))
                words = []
                redirects = []
            elif op == "|":
                return None
            pipe = op == "|"
        elif rop:
            if target is not None:
                return None
            target = (fd, rop)
        elif bad is not None:
            return None
    if target is not None:
        return None
    if words or redirects:
        specs.append((words, redirects, "pipe" if pipe else ""))
    if not specs:
        return EMPTY
    if len(specs) > MAX_COMMANDS:
        raise ShellSyntaxError(f"more than {MAX_COMMANDS} commands")
    cmds = [SimpleCommand(argv, [False] * len(argv), [0] * len(argv), redirects,
                          stdin_of(redirects, stdin), ROOT_CWD, "")
            for argv, redirects, stdin in specs]
    kinds = [_classify_command(c) for c in cmds]
    if len(cmds) > 1 and _PARSE not in kinds and _may_run_written(cmds):
        kinds.append(_PARSE)    # a later command may run what an earlier one writes
    if _PARSE in kinds:
        full = Ctx(root)
        p = Parser(full, src, len(src), 0, "", "", None)
        for c in cmds:
            c.program = c.program_index = None
            c.cwds = tuple(full.cwds)
            p._emit_command(c, 0)
        return _done(full)
    if _CD in kinds:
        ctx = Ctx(root)
        cwds: tuple = ROOT_CWD
        for c, kind in zip(cmds, kinds):
            c.cwds = cwds
            if kind == _CD:
                apply_cd(ctx, c)
                cwds = tuple(ctx.cwds)
    return Analysis(tuple(cmds))

