"""Static analysis of a shell command line: the simple commands it would run, normalized.

:func:`analyze` reads a POSIX/bash command string (the ``bash`` tool's ``command``) and returns
every simple command it contains, wherever it hides: after ``;``/``&&``/``||``/``|``/``&``/newlines,
inside ``$(...)``, backquotes, ``<(...)``/``>(...)``, subshells, groups, ``if``/``while``/``for``/
``case`` bodies, function bodies, ``bash -c``/``sh -c``/``su -c`` strings, ``eval`` arguments,
here-documents fed to a shell, ``trap``/``alias``/``watch`` strings, git ``!`` aliases and git
configuration values that git runs as commands, ``find -exec`` actions, and behind wrappers
(``sudo``, ``env``, ``command``, ``exec``, ``nohup``, ``xargs``, ``timeout``, ``busybox``, ...;
see :mod:`fak.policy.commands`).

Each :class:`SimpleCommand` carries its words after quote removal (``r''m`` → ``rm``, ``"rm"`` →
``rm``, ``\\r\\m`` → ``rm``, ``$'\\x72m'`` → ``rm``, unquoted ``{a,b}`` brace expansion), a flag per
word that says whether its value is only known at run time (parameter expansion, command
substitution, arithmetic), its redirections, where its standard input comes from (a pipe, a file,
a here-document), the directories it may run in (``cd`` is tracked), and ``line``: the command
name's basename followed by its arguments, joined by single spaces (``/bin/rm -r -f /`` → ``rm -r
-f /``) — the text that policy regexes with ``"match": "normalized"`` see.

The grammar follows the bash manual ("Shell Syntax", "Shell Commands", "Shell Expansions",
"Redirections") and POSIX "Shell Command Language" §2.2-2.10. The parser is permissive where
bash is permissive and raises :class:`ShellSyntaxError` where bash would refuse to run the line
(unbalanced quotes, ``$(`` without ``)``, ``if`` without ``fi``) or where the analysis gives up
(nesting deeper than :data:`MAX_DEPTH`), so that callers can fail closed. It is an analysis, not
an interpreter: it never runs anything and over-approximates (both branches of ``&&``/``||``, all
loop bodies, every directory ``cd`` may have reached).

A hand-written lexer rather than :mod:`shlex`: shlex does not know ``$(...)`` nesting, backquotes,
``$'...'``, here-documents, newlines as separators or which words were quoted, all of which
decide what bash runs.
"""

from __future__ import annotations

import re

from fak.policy import commands as _cmds

MAX_DEPTH = 8            # nested $(...), bash -c, eval, ... strings
MAX_COMMANDS = 2048      # simple commands in one analysis
MAX_CWDS = 16            # directories tracked after cd
MAX_BRACE_WORDS = 256    # words one brace expansion may produce


class ShellSyntaxError(ValueError):
    """The command line is not valid shell, or is beyond what the analysis follows.

    ``str(err)`` says what and where (``unterminated single quote at offset 12``)."""


# word flags
GLOB = 1       # an unquoted *, ? or [...] (pathname expansion)
PROCSUB = 2    # a process substitution <(...) / >(...)
_BRACE = 4     # unquoted { , } (brace expansion pending)

# markers for unquoted brace-expansion syntax inside a word being built
_LB, _RB, _COMMA = "\ue000", "\ue001", "\ue002"
_UNMARK = str.maketrans({_LB: "{", _RB: "}", _COMMA: ","})

_UNQ_PLAIN = re.compile(r"[^ \t\n'\"\\$`;&|<>(){},*?\[]+")
_DQ_PLAIN = re.compile(r'[^"\\$`]+')
_HD_PLAIN = re.compile(r"[^\\$`]+")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\[[^\]]*\])?\+?=")
_FD_REDIR = re.compile(r"([0-9]+)(?=[<>])")
_SIMPLE = re.compile(r"[^'\"\\$`;&|<>(){}*?\[#\n\r\x0b\x0c=]*")
_REDIR_OPS = ("<<<", "<<-", "<<", "<>", "<&", "<", ">>", ">&", ">|", ">")
# One token of the common subset, matched in C: a word made of unquoted plain text, '...' and
# "..." without expansions or escapes; a plain control operator; a plain redirection operator.
# Anything else goes through the character-level lexer. The word is matched greedily with no
# trailing assertion (an assertion after a nested quantifier backtracks exponentially when it
# fails); whether it ends at a metacharacter is checked after the match.
_FAST_TOK = re.compile(r"""[ \t]*(?:
    ([0-9]*)(>>|>&|>(?![|(&])|<(?![<>&(]))
  | ((?:[^ \t\n'"\\$`;&|<>(){}*?\[\#]+|'[^']*'|"[^"\\$`]*")+)
  | (&&|\|\||;(?![;&])|\|(?!&)|&(?![>])|\n)
)""", re.X)
_WORD_END = frozenset(" \t\n;&|<>()")
_UNQUOTE = re.compile(r"'([^']*)'|\"([^\"]*)\"")
# The same subset over a whole line (findall); group 5 catches any other character, which sends
# the line to the full parser.
_FAST_LINE = re.compile(_FAST_TOK.pattern[:-2] + "  | (.)\n)", re.X | re.S)
_MAX_BRACES = 64         # unquoted { in one word (brace scanning is quadratic in them)


def _unquote_piece(m: re.Match[str]) -> str:
    a = m.group(1)
    return a if a is not None else m.group(2)


# tokens: (kind, ...)
_EOF, _WORD, _OP, _REDIR, _ARITH = 0, 1, 2, 3, 4
_EOF_TOK = (_EOF,)
_NL_TOK = (_OP, "\n")

# parser modes
_CMD, _FOR_HEADER, _CASE_SUBJECT, _CASE_IN, _CASE_PAT, _FUNC_NAME, _DBRACKET = range(7)

_KEYWORDS = {
    "if": "if", "then": "then", "else": "else", "elif": "elif", "fi": "fi", "do": "do",
    "done": "done", "while": "while", "until": "until", "for": "for", "select": "for",
    "case": "case", "esac": "esac", "function": "function", "!": "!", "time": "time",
    "coproc": "coproc", "[[": "[[", _LB: "{", "}": "}",
}
_PREFIX_KEYWORDS = frozenset({"then", "else", "elif", "do", "!", "coproc"})

# environment variables whose value a program runs as a shell command
_COMMAND_VARS = frozenset({
    "GIT_PAGER", "PAGER", "GIT_EDITOR", "EDITOR", "VISUAL", "GIT_SSH_COMMAND", "GIT_SSH",
    "GIT_ASKPASS", "SSH_ASKPASS", "GIT_EXTERNAL_DIFF", "MANPAGER", "PROMPT_COMMAND",
    "GIT_SEQUENCE_EDITOR", "LESSOPEN", "LESSCLOSE", "BROWSER", "SUDO_ASKPASS",
})

_ANSI_SIMPLE = {"a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n", "r": "\r",
                "t": "\t", "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}


class Redirect:
    """One redirection: ``op`` (``>``, ``>>``, ``<``, ``<<``, ``<<-``, ``<<<``, ``&>``, ``&>>``,
    ``>&``, ``<&``, ``>|``, ``<>``), ``fd`` (explicit descriptor or ``None``), ``target`` (the
    word after quote removal; for ``<<`` the delimiter), ``dynamic`` (the target holds a run-time
    expansion), ``procsub`` (the target is ``<(...)``), ``body`` (here-document or here-string
    text, ``None`` until read)."""

    __slots__ = ("op", "fd", "target", "dynamic", "procsub", "body", "callbacks")

    def __init__(self, op: str, fd: int | None, target: str, dynamic: bool, procsub: bool):
        self.op = op
        self.fd = fd
        self.target = target
        self.dynamic = dynamic
        self.procsub = procsub
        self.body: str | None = None
        self.callbacks: list = []

    def __repr__(self) -> str:
        fd = "" if self.fd is None else str(self.fd)
        return f"Redirect({fd}{self.op}{self.target!r})"

    @property
    def writes(self) -> bool:
        """True when the redirection opens ``target`` as a file for writing."""
        op = self.op
        if op in (">", ">>", ">|", "&>", "&>>", "<>"):
            return True
        if op == ">&":
            return not (self.target.isdigit() or self.target == "-")
        return False


class SimpleCommand:
    """One simple command the line would run.

    ``argv``: words after quote removal and expansion of what is static (list[str]; empty for a
    command that is only redirections); ``dyn``: per word, True when it holds an expansion known
    only at run time; ``flags``: per word, :data:`GLOB` / :data:`PROCSUB` bits; ``name``: the
    basename of ``argv[0]`` (or ``argv[0]`` itself when dynamic); ``line``: ``name`` and
    ``argv[1:]`` joined by single spaces; ``redirects``: list[:class:`Redirect`]; ``stdin``:
    ``""`` (inherited from the caller), ``"pipe"``, ``"file"``, ``"heredoc"``, ``"herestring"``
    or ``"procsub"``; ``cwds``: the directories it may run in, each ``""`` (the workspace root),
    a path relative to it, an absolute path, a ``~`` path, or ``None`` (unknown); ``via``: how it
    was reached (``""`` top level, ``"sudo"``, ``"bash -c"``, ``"$(...)"``, ...);
    ``unknown_operands``: operands are appended at run time (``xargs``); ``find_roots``: for a
    ``find -exec`` action, the starting points that ``{}`` stands under (``None`` otherwise);
    ``program``: for an interpreter, where its program comes from (``"string"``, ``"stdin"``,
    ``"heredoc"``, ``"herestring"``, ``"file"``, ``"module"``, ``"procsub"``, ``"dynamic"``,
    ``"none"``), else ``None``; ``program_index``: the word holding the ``-c`` string, the
    script or the ``-m`` module, if any; ``note``: why the command is only known at run time,
    else ``None``."""

    __slots__ = ("argv", "dyn", "flags", "name", "line", "redirects", "stdin", "cwds", "via",
                 "unknown_operands", "find_roots", "program", "program_index", "note")

    def __init__(self, argv: list[str], dyn: list[bool], flags: list[int],
                 redirects: list[Redirect], stdin: str, cwds: tuple, via: str,
                 unknown_operands: bool = False, find_roots: tuple | None = None):
        self.argv = argv
        self.dyn = dyn
        self.flags = flags
        self.redirects = redirects
        self.stdin = stdin
        self.cwds = cwds
        self.via = via
        self.unknown_operands = unknown_operands
        self.find_roots = find_roots
        self.program: str | None = None
        self.program_index: int | None = None
        self.note: str | None = None
        if argv:
            a0 = argv[0]
            name = a0 if dyn[0] or "/" not in a0 else (a0.rstrip("/").rsplit("/", 1)[-1] or a0)
            self.name = name
            self.line = name if len(argv) == 1 else name + " " + " ".join(argv[1:])
        else:
            self.name = ""
            self.line = ""

    def __repr__(self) -> str:
        extra = f", via={self.via!r}" if self.via else ""
        return f"SimpleCommand({self.argv!r}{extra})"


class Analysis:
    """What :func:`analyze` found: ``commands`` (tuple[:class:`SimpleCommand`], in the order
    they were read) and ``lines`` (tuple[str], the non-empty normalized lines)."""

    __slots__ = ("commands", "lines")

    def __init__(self, commands: tuple[SimpleCommand, ...]):
        self.commands = commands
        self.lines: tuple[str, ...]
        if len(commands) == 1:
            self.lines = (commands[0].line,) if commands[0].argv else ()
        else:
            self.lines = tuple(c.line for c in commands if c.argv)

    def __repr__(self) -> str:
        return f"Analysis({list(self.lines)!r})"


_EMPTY = Analysis(())
_ROOT_CWD = ("",)
# command names whose arguments hold other commands or change the directory
_SPECIAL = frozenset({*_cmds.WRAPPERS, "busybox", "flock", "sg", "git", "find", "eval", "source",
                      ".", "trap", "alias", "cd", "pushd", "popd", "tar"})


class _Ctx:
    """State shared by the parsers of one analysis (nested strings included)."""

    __slots__ = ("commands", "cwds", "cd_seen", "loop_depth", "cwd_unknown", "deferred")

    def __init__(self) -> None:
        self.commands: list[SimpleCommand] = []
        self.cwds: list[str | None] = [""]
        self.cd_seen = False
        self.loop_depth = 0
        self.cwd_unknown = False
        self.deferred = False


def analyze(src: str) -> Analysis:
    """Every simple command in the shell command line ``src``, normalized.

    Raises :class:`ShellSyntaxError` when ``src`` is not valid shell (bash would run nothing)
    or the analysis cannot follow it. Runs in microseconds for typical commands: a line made only
    of plain or quoted words, control operators and simple redirections is tokenized by one
    regex in C (:func:`_analyze_line`); anything else goes through the full lexer and parser
    (:func:`analyze_full`), and both give the same result on the lines the first accepts."""
    if src.isascii() and _SIMPLE.fullmatch(src) is not None:
        words = src.split()
        if not words:
            return _EMPTY
        if words[0] not in _KEYWORDS:
            n = len(words)
            cmd = SimpleCommand(words, [False] * n, [0] * n, [], "", _ROOT_CWD, "")
            if _classify_command(cmd) == _PLAIN:
                return Analysis((cmd,))
    try:
        fast = _analyze_line(src)
        if fast is not None:
            return fast
        return analyze_full(src)
    except RecursionError:
        raise ShellSyntaxError("expansions nested too deeply") from None


def analyze_full(src: str) -> Analysis:
    """:func:`analyze` through the full lexer and parser, whatever the line looks like."""
    ctx = _Ctx()
    _Parser(ctx, src, 0, 0, "", "", None).run()
    return _done(ctx)


def _done(ctx: _Ctx) -> Analysis:
    if ctx.cwd_unknown or (ctx.deferred and ctx.cd_seen):
        for c in ctx.commands:
            c.cwds = (None,)
    return Analysis(tuple(ctx.commands))


_PLAIN, _CD, _PARSE = 0, 1, 2


def _classify_command(cmd: SimpleCommand) -> int:
    """How a command of static words is analyzed: ``_PLAIN`` (no other command runs; an
    interpreter's ``program`` is filled in here, a function of its words), ``_CD`` (changes the
    directory) or ``_PARSE`` (wrappers, ``eval``, ``bash -c`` strings, git global options,
    ``find -exec``, tar command options, ...: the parser's semantic expansion)."""
    argv = cmd.argv
    if not argv:
        return _PLAIN
    name = cmd.name
    if name in _SPECIAL:
        if name == "git":
            return _PLAIN if len(argv) < 2 or not argv[1].startswith("-") else _PARSE
        if name == "find":
            return _PARSE if any(a.startswith(("-exec", "-ok")) for a in argv) else _PLAIN
        if name == "tar":
            return _PARSE if any(a.startswith(("--to", "--checkpoint-a", "--use", "--rsh", "--info",
                                               "--new", "-I", "-F")) for a in argv) else _PLAIN
        if name == "cd" or name == "pushd" or name == "popd":
            return _CD
        return _PARSE
    if _cmds.is_interpreter(name):
        kind, idx = _cmds.interpreter_program(name, argv, cmd.dyn)
        if kind == "string" and _cmds.is_shell(name):
            return _PARSE
        cmd.program, cmd.program_index = kind, idx
    return _PLAIN


def _stdin_of(redirects: list[Redirect], stdin: str) -> str:
    for r in redirects:
        if r.fd in (None, 0):
            op = r.op
            if op == "<" or op == "<>":
                stdin = "procsub" if r.procsub else "file"
            elif op == "<<" or op == "<<-":
                stdin = "heredoc"
            elif op == "<<<":
                stdin = "herestring"
    return stdin


def _analyze_line(src: str) -> Analysis | None:
    """The common subset in one pass: ``None`` when the line needs the full parser (any
    expansion, escape, glob, brace, comment, here-document, keyword or assignment)."""
    specs: list[tuple[list[str], list[Redirect], str]] = []
    words: list[str] = []
    redirects: list[Redirect] = []
    pipe = False
    target: tuple[str, str] | None = None
    special = False
    for fd, rop, word, op, bad in _FAST_LINE.findall(src):
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
            if not words and ((plain and text in _KEYWORDS) or "=" in text):
                return None
            words.append(text)
        elif op:
            if target is not None:
                return None
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
        else:
            return None
    if target is not None:
        return None
    if words or redirects:
        specs.append((words, redirects, "pipe" if pipe else ""))
    if not specs:
        return _EMPTY
    cmds = [SimpleCommand(argv, [False] * len(argv), [0] * len(argv), redirects,
                          _stdin_of(redirects, stdin), _ROOT_CWD, "")
            for argv, redirects, stdin in specs]
    kinds = [_classify_command(c) for c in cmds]
    if _PARSE in kinds:
        full = _Ctx()
        p = _Parser(full, src, len(src), 0, "", "", None)
        for c in cmds:
            p._emit(c.argv, c.dyn, c.flags, c.redirects, c.stdin, "", None, False, None, 0)
        return _done(full)
    if _CD in kinds:
        ctx = _Ctx()
        cwds: tuple = _ROOT_CWD
        for c, kind in zip(cmds, kinds):
            c.cwds = cwds
            if kind == _CD:
                _apply_cd(ctx, c)
                cwds = tuple(ctx.cwds)
    return Analysis(tuple(cmds))


def _combine_cwd(c: str | None, target: str, dynamic: bool) -> str | None:
    if dynamic:
        return None
    if target.startswith(("/", "~")):
        return target
    if c is None:
        return None
    if c == "":
        return target
    return c + "/" + target


class _Parser:
    """Lexer and permissive recursive parser over ``s`` from ``i``; ``closer`` is ``")"`` for an
    in-place ``$(...)``/``<(...)`` (the parse ends at the matching parenthesis)."""

    def __init__(self, ctx: _Ctx, s: str, i: int, depth: int, via: str, stdin: str,
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
        self.frames: list[tuple[str, str, bool]] = []
        self.words: list[tuple[str, bool, int]] = []
        self.redirects: list[Redirect] = []
        self.pipe_next = False
        self.mode = _CMD
        self.pending: list[tuple[Redirect, str, bool, bool]] = []
        self.func_next = False
        self.func_parens = False
        self.array_next = False
        self.after_time = False

    # ----------------------------------------------------------------------------- lexer

    def _err(self, what: str, at: int | None = None) -> ShellSyntaxError:
        return ShellSyntaxError(f"{what} at offset {self.i if at is None else at}")

    def _next_tok(self) -> tuple:
        s = self.s
        m = _FAST_TOK.match(s, self.i)
        if m is not None and (m.lastindex != 3 or m.end() >= self.n
                              or s[m.end()] in _WORD_END):
            k = m.lastindex
            self.i = m.end()
            if k == 3:
                raw = m.group(3)
                if "'" in raw or '"' in raw:
                    return (_WORD, _UNQUOTE.sub(_unquote_piece, raw), False, 0, False,
                            m.start(3))
                return (_WORD, raw, False, 0, True, m.start(3))
            if k == 4:
                op = m.group(4)
                if op == "\n":
                    if self.pending:
                        self._read_heredocs()
                    return _NL_TOK
                return (_OP, op)
            fd = m.group(1)
            return (_REDIR, m.group(2), int(fd) if fd else None)
        n = self.n
        while True:
            i = self.i
            while i < n:
                c = s[i]
                if c == " " or c == "\t":
                    i += 1
                elif c == "\\" and i + 1 < n and s[i + 1] == "\n":
                    i += 2
                else:
                    break
            self.i = i
            if i >= n:
                if self.pending:
                    self._read_heredocs()
                return _EOF_TOK
            c = s[i]
            if c == "#":
                j = s.find("\n", i)
                self.i = n if j < 0 else j
                continue
            if c == "\n":
                self.i = i + 1
                if self.pending:
                    self._read_heredocs()
                return _NL_TOK
            break
        if c == "<" or c == ">":
            if i + 1 < n and s[i + 1] == "(":
                return self._procsub(i)
            return self._redir(i, None)
        if c == "(":
            if i + 1 < n and s[i + 1] == "(" and not self.words and self.mode in (_CMD, _FOR_HEADER):
                end = self._arith(i + 2)
                if end is not None:
                    self.i = end
                    return (_ARITH,)
            self.i = i + 1
            return (_OP, "(")
        if c == ")":
            self.i = i + 1
            return (_OP, ")")
        if c == ";":
            for op in (";;&", ";;", ";&"):
                if s.startswith(op, i):
                    self.i = i + len(op)
                    return (_OP, op)
            self.i = i + 1
            return (_OP, ";")
        if c == "&":
            if s.startswith("&&", i):
                self.i = i + 2
                return (_OP, "&&")
            if s.startswith("&>>", i):
                self.i = i + 3
                return (_REDIR, "&>>", None)
            if s.startswith("&>", i):
                self.i = i + 2
                return (_REDIR, "&>", None)
            self.i = i + 1
            return (_OP, "&")
        if c == "|":
            if s.startswith("||", i):
                self.i = i + 2
                return (_OP, "||")
            if s.startswith("|&", i):
                self.i = i + 2
                return (_OP, "|&")
            self.i = i + 1
            return (_OP, "|")
        if "0" <= c <= "9":
            m = _FD_REDIR.match(s, i)
            if m is not None and not s.startswith("(", m.end() + 1):
                return self._redir(m.end(), int(m.group(1)))
        return self._word()

    def _redir(self, i: int, fd: int | None) -> tuple:
        s = self.s
        for op in _REDIR_OPS:
            if s.startswith(op, i):
                self.i = i + len(op)
                return (_REDIR, op, fd)
        raise self._err("bad redirection", i)  # pragma: no cover - ops cover < and >

    def _procsub(self, i: int) -> tuple:
        child = _Parser(self.ctx, self.s, i + 2, self.depth + 1, "<(...)", "", ")")
        child.run()
        self.i = child.i
        return (_WORD, self.s[i:child.i], True, PROCSUB, False, i)

    def _word(self) -> tuple:
        s = self.s
        n = self.n
        i = start = self.i
        parts: list[str] = []
        dyn = False
        flags = 0
        plain = True
        bracket = False
        while i < n:
            m = _UNQ_PLAIN.match(s, i)
            if m is not None:
                parts.append(m.group())
                i = m.end()
                if i >= n:
                    break
            c = s[i]
            if c in " \t\n;&|<>()":
                break
            if c == "'":
                j = s.find("'", i + 1)
                if j < 0:
                    raise self._err("unterminated single quote", i)
                parts.append(s[i + 1:j])
                i = j + 1
                plain = False
            elif c == '"':
                i, d = self._dq(i + 1, parts, True)
                dyn |= d
                plain = False
            elif c == "\\":
                if i + 1 < n:
                    if s[i + 1] != "\n":
                        parts.append(s[i + 1])
                    i += 2
                else:
                    parts.append("\\")
                    i += 1
                plain = False
            elif c == "$":
                i, d = self._dollar(i, parts, False)
                dyn |= d
                plain = False
            elif c == "`":
                i = self._backtick(i, parts)
                dyn = True
                plain = False
            elif c == "{":
                parts.append(_LB)
                flags |= _BRACE
                i += 1
            elif c == "}":
                parts.append(_RB if flags & _BRACE else "}")
                i += 1
            elif c == ",":
                parts.append(_COMMA if flags & _BRACE else ",")
                i += 1
            elif c == "[":
                bracket = True
                parts.append(c)
                i += 1
            else:  # * ?
                flags |= GLOB
                parts.append(c)
                i += 1
        self.i = i
        text = "".join(parts)
        if bracket and "]" in text and text not in ("[", "[[", "]]"):
            flags |= GLOB
        return (_WORD, text, dyn, flags, plain, start)

    def _dq(self, i: int, parts: list[str], quoted: bool, heredoc: bool = False) -> tuple[int, bool]:
        """Double-quoted text from ``i`` (after the quote) to the closing quote, or a
        here-document body to its end (``heredoc``). Returns (end, dynamic)."""
        s = self.s
        n = self.n
        dyn = False
        plain_re = _HD_PLAIN if heredoc else _DQ_PLAIN
        while True:
            m = plain_re.match(s, i)
            if m is not None:
                parts.append(m.group())
                i = m.end()
            if i >= n:
                if heredoc:
                    return i, dyn
                raise self._err("unterminated double quote")
            c = s[i]
            if c == '"':
                return i + 1, dyn
            if c == "\\":
                nx = s[i + 1:i + 2]
                if nx == "\n":
                    i += 2
                elif nx and (nx in "$`\\" or (nx == '"' and not heredoc)):
                    parts.append(nx)
                    i += 2
                else:
                    parts.append("\\")
                    i += 1
            elif c == "$":
                i, d = self._dollar(i, parts, quoted)
                dyn |= d
            else:  # backquote
                i = self._backtick(i, parts)
                dyn = True

    def _dollar(self, i: int, parts: list[str], quoted: bool) -> tuple[int, bool]:
        s = self.s
        j = i + 1
        if j >= self.n:
            parts.append("$")
            return j, False
        c = s[j]
        if c == "(":
            if s.startswith("((", j):
                end = self._arith(j + 2)
                if end is not None:
                    parts.append(s[i:end])
                    return end, True
            child = _Parser(self.ctx, s, j + 1, self.depth + 1, "$(...)", self._stdin_now(), ")")
            child.run()
            parts.append(s[i:child.i])
            return child.i, True
        if c == "{":
            end = self._param(j + 1, quoted)
            parts.append(s[i:end])
            return end, True
        if c == "'" and not quoted:
            end, text = self._ansi_c(j + 1)
            parts.append(text)
            return end, False
        if c == '"' and not quoted:
            return self._dq(j + 1, parts, True)
        m = _NAME.match(s, j)
        if m is not None:
            parts.append(s[i:m.end()])
            return m.end(), True
        if c in "@*#?-$!0123456789":
            parts.append(s[i:j + 1])
            return j + 1, True
        parts.append("$")
        return j, False

    def _param(self, i: int, quoted: bool) -> int:
        """End of a ``${...}`` parameter expansion whose body starts at ``i``."""
        s = self.s
        n = self.n
        scratch: list[str] = []
        while i < n:
            c = s[i]
            if c == "}":
                return i + 1
            if c == "\\":
                i += 2
            elif c == "'" and not quoted:
                j = s.find("'", i + 1)
                if j < 0:
                    raise self._err("unterminated single quote", i)
                i = j + 1
            elif c == '"':
                i, _ = self._dq(i + 1, scratch, True)
            elif c == "$":
                i, _ = self._dollar(i, scratch, quoted)
            elif c == "`":
                i = self._backtick(i, scratch)
            else:
                i += 1
        raise self._err("unterminated ${")

    def _arith(self, i: int) -> int | None:
        """End (after ``))``) of an arithmetic expansion/command whose body starts at ``i``, or
        ``None`` when the text is not arithmetic (``((cd x); ls)`` is a nested subshell).
        Raises :class:`ShellSyntaxError` when no ``))`` closes it before the end."""
        s = self.s
        n = self.n
        depth = 0
        scratch: list[str] = []
        save = len(self.ctx.commands)
        try:
            while i < n:
                c = s[i]
                if c == "(":
                    depth += 1
                    i += 1
                elif c == ")":
                    if depth == 0:
                        if i + 1 < n and s[i + 1] == ")":
                            return i + 2
                        break
                    depth -= 1
                    i += 1
                elif c == "$":
                    i, _ = self._dollar(i, scratch, True)
                elif c == "`":
                    i = self._backtick(i, scratch)
                elif c == "\\":
                    i += 2
                elif c == "'" or c == '"':
                    j = s.find(c, i + 1)
                    if j < 0:
                        break
                    i = j + 1
                else:
                    i += 1
            else:
                raise self._err("unterminated ((")
        except ShellSyntaxError as e:
            if str(e).startswith("unterminated (("):
                raise
        del self.ctx.commands[save:]
        return None

    def _ansi_c(self, i: int) -> tuple[int, str]:
        """Decode ``$'...'`` (bash "ANSI-C Quoting") whose body starts at ``i``."""
        s = self.s
        n = self.n
        out: list[str] = []
        while i < n:
            c = s[i]
            if c == "'":
                return i + 1, "".join(out)
            if c != "\\" or i + 1 >= n:
                out.append(c)
                i += 1
                continue
            e = s[i + 1]
            i += 2
            if e in _ANSI_SIMPLE:
                out.append(_ANSI_SIMPLE[e])
            elif e in "01234567":
                m = re.match(r"[0-7]{0,2}", s[i:])
                digits = e + (m.group() if m else "")
                i += len(digits) - 1
                out.append(chr(int(digits, 8) & 0xFF))
            elif e in "xuU":
                width = {"x": 2, "u": 4, "U": 8}[e]
                m = re.match(r"[0-9A-Fa-f]{1,%d}" % width, s[i:])
                if m:
                    i += len(m.group())
                    out.append(chr(min(int(m.group(), 16), 0x10FFFF)))
                else:
                    out.append("\\" + e)
            elif e == "c" and i < n:
                out.append(chr(ord(s[i]) & 0x1F))
                i += 1
            else:
                out.append("\\" + e)
        raise self._err("unterminated $'")

    def _backtick(self, i: int, parts: list[str]) -> int:
        """Parse a backquoted command substitution starting at ``i``; returns its end."""
        s = self.s
        n = self.n
        j = i + 1
        buf: list[str] = []
        while j < n:
            c = s[j]
            if c == "\\" and j + 1 < n:
                nx = s[j + 1]
                buf.append(nx if nx in "$`\\" else c + nx)
                j += 2
            elif c == "`":
                self._parse_string("".join(buf), "`...`", self._stdin_now())
                parts.append(s[i:j + 1])
                return j + 1
            else:
                buf.append(c)
                j += 1
        raise self._err("unterminated backquote", i)

    def _read_heredocs(self) -> None:
        s = self.s
        n = self.n
        pending = self.pending
        self.pending = []
        for r, delim, strip, quoted in pending:
            lines: list[str] = []
            while self.i < n:
                j = s.find("\n", self.i)
                end = n if j < 0 else j
                line = s[self.i:end]
                self.i = n if j < 0 else j + 1
                if strip:
                    line = line.lstrip("\t")
                if line == delim:
                    break
                lines.append(line)
            body = "\n".join(lines) + ("\n" if lines else "")
            r.body = body
            if not quoted and ("$" in body or "`" in body):
                sub = _Parser(self.ctx, body, 0, self.depth + 1, "<<", "", None)
                sub._dq(0, [], True, heredoc=True)
            for cb in r.callbacks:
                cb(body)

    def _stdin_now(self) -> str:
        return "pipe" if self.pipe_next else self.base_stdin

    # ----------------------------------------------------------------------------- parser

    def run(self) -> None:
        """Parse to the end of the string (or the closing parenthesis of an in-place parse)."""
        while True:
            tok = self._next_tok()
            k = tok[0]
            if k == _WORD:
                self._on_word(tok)
            elif k == _OP:
                if self._on_op(tok[1]):
                    return
            elif k == _REDIR:
                self._on_redir(tok[1], tok[2])
            elif k == _ARITH:
                continue
            else:
                if self.closer is not None:
                    raise self._err("unterminated $( or <(")
                self._finish()
                if self.frames:
                    raise self._err(f"unterminated {self.frames[-1][0]}")
                if self.mode != _CMD:
                    raise self._err("incomplete for/case/function")
                return

    def _on_word(self, tok: tuple) -> None:
        _, text, dyn, flags, plain, start = tok
        mode = self.mode
        if mode != _CMD:
            if mode == _DBRACKET:
                self.words.append((text.translate(_UNMARK), dyn, 0))
                if plain and text == "]]":
                    self.mode = _CMD
                return
            if mode == _FOR_HEADER:
                if plain and text == "do":
                    self.mode = _CMD
                return
            if mode == _CASE_SUBJECT:
                self.mode = _CASE_IN
                return
            if mode == _CASE_IN:
                if plain and text == "in":
                    self.mode = _CASE_PAT
                    return
                raise self._err("expected `in` after case")
            if mode == _CASE_PAT:
                if plain and text == "esac":
                    self._pop("case")
                    self.mode = _CMD
                return
            if mode == _FUNC_NAME:
                self.mode = _CMD
                self.func_next = True
                self.func_parens = True
                self.ctx.deferred = True
                return
        words = self.words
        if not words:
            if plain and text in _KEYWORDS:
                self._keyword(_KEYWORDS[text])
                return
            if self.after_time:
                self.after_time = False
                if plain and text == "-p":
                    return
            if "=" in text:
                m = _ASSIGN.match(self.s, start)
                if m is not None:
                    self._assignment(text, dyn, m.end() - start, m.group())
                    return
        if flags & _BRACE:
            for t in _brace_expand(text):
                words.append((t, dyn, flags & (GLOB | PROCSUB)))
            return
        words.append((text, dyn, flags))

    def _assignment(self, text: str, dyn: bool, name_len: int, name: str) -> None:
        value = text[name_len:].translate(_UNMARK)
        var = name.rstrip("+=").split("[", 1)[0]
        if var in _COMMAND_VARS and value and not dyn:
            self._parse_string(value, f"{var}=", "", deferred=True)
        if not value and self.i < self.n and self.s[self.i] == "(":
            self.array_next = True

    def _keyword(self, kw: str) -> None:
        if kw in _PREFIX_KEYWORDS:
            return
        if kw == "time":
            self.after_time = True
        elif kw == "if":
            self._push("if", False)
        elif kw == "while" or kw == "until":
            self._push("loop", True)
        elif kw == "for":
            self._push("loop", True)
            self.mode = _FOR_HEADER
        elif kw == "case":
            self._push("case", False)
            self.mode = _CASE_SUBJECT
        elif kw == "{":
            self.func_parens = False
            self._push("group", False)
        elif kw == "}":
            self._pop("group")
        elif kw == "fi":
            self._pop("if")
        elif kw == "done":
            self._pop("loop")
        elif kw == "esac":
            self._pop("case")
        elif kw == "function":
            self.mode = _FUNC_NAME
        elif kw == "[[":
            self.words.append(("[[", False, 0))
            self.mode = _DBRACKET

    def _push(self, kind: str, loopish: bool) -> None:
        if self.func_next:
            loopish = True
            self.func_next = False
        self.frames.append((kind, self.base_stdin, loopish))
        self.base_stdin = self._stdin_now()
        self.pipe_next = False
        if loopish:
            self.ctx.loop_depth += 1

    def _pop(self, kind: str) -> None:
        if not self.frames or self.frames[-1][0] != kind:
            want = self.frames[-1][0] if self.frames else "nothing"
            raise self._err(f"unexpected end of {kind} (open: {want})")
        _, stdin, loopish = self.frames.pop()
        self.base_stdin = stdin
        if loopish:
            self.ctx.loop_depth -= 1

    def _on_op(self, op: str) -> bool:
        mode = self.mode
        if mode != _CMD:
            if mode == _DBRACKET:
                self.words.append((op, False, 0))
                return False
            if mode == _CASE_PAT:
                if op == ")":
                    self.mode = _CMD
                return False
            if mode in (_FOR_HEADER, _CASE_SUBJECT, _CASE_IN):
                if op in (";", "\n"):
                    return False
                raise self._err(f"unexpected {op!r}")
            raise self._err(f"unexpected {op!r}")
        if op in (";", "\n", "&&", "||", "&"):
            self._finish()
            if self.after_time and op != "\n":
                self.after_time = False
            return False
        if op == "|" or op == "|&":
            self._finish()
            self.pipe_next = True
            return False
        if op in (";;", ";&", ";;&"):
            self._finish()
            if not self.frames or self.frames[-1][0] != "case":
                raise self._err(f"unexpected {op!r}")
            self.mode = _CASE_PAT
            return False
        if op == "(":
            if self.array_next:
                self.array_next = False
                while True:
                    t = self._next_tok()
                    if t[0] == _EOF:
                        raise self._err("unterminated array assignment")
                    if t[0] == _OP and t[1] == ")":
                        return False
            if self.func_parens or (len(self.words) == 1 and not self.words[0][1]):
                t = self._next_tok()
                if t[0] != _OP or t[1] != ")":
                    raise self._err("unexpected `(`")
                self.words = []
                self.func_parens = False
                self.func_next = True
                self.ctx.deferred = True
                return False
            if self.words:
                raise self._err("unexpected `(`")
            self._push("subshell", False)
            return False
        # ")"
        self._finish()
        if self.frames:
            self._pop("subshell")
            return False
        if self.closer == ")":
            return True
        raise self._err("unexpected `)`")

    def _on_redir(self, op: str, fd: int | None) -> None:
        if self.mode == _DBRACKET:
            self.words.append((op, False, 0))
            return
        if self.mode != _CMD:
            raise self._err(f"unexpected {op!r}")
        t = self._next_tok()
        if t[0] != _WORD:
            raise self._err(f"redirection {op!r} without a target")
        _, text, dyn, flags, plain, _ = t
        if flags & _BRACE:
            text = text.translate(_UNMARK)
        r = Redirect(op, fd, text, dyn, bool(flags & PROCSUB))
        if op == "<<" or op == "<<-":
            self.pending.append((r, text, op == "<<-", not plain))
        elif op == "<<<":
            r.body = text
        self.redirects.append(r)

    def _finish(self) -> None:
        words = self.words
        redirects = self.redirects
        if not words and not redirects:
            self.pipe_next = False
            return
        stdin = _stdin_of(redirects, self._stdin_now())
        self.words = []
        self.redirects = []
        self.pipe_next = False
        self._emit([w[0] for w in words], [w[1] for w in words], [w[2] for w in words],
                   redirects, stdin, self.via, None, False, None, 0)

    # ----------------------------------------------------------------------------- semantics

    def _parse_string(self, text: str, via: str, stdin: str, deferred: bool = False) -> None:
        """Analyze ``text`` as a shell program run by this one (``bash -c``, ``eval``, ...)."""
        p = _Parser(self.ctx, text, 0, self.depth + 1, via, stdin, None)
        if deferred:
            self.ctx.loop_depth += 1
            try:
                p.run()
            finally:
                self.ctx.loop_depth -= 1
        else:
            p.run()

    def _split_words(self, text: str, via: str) -> list[tuple[str, bool, int]]:
        """The words of ``text`` (``env -S`` strings, git alias values), expansions analyzed."""
        p = _Parser(self.ctx, text, 0, self.depth + 1, via, "", None)
        out: list[tuple[str, bool, int]] = []
        while True:
            t = p._next_tok()
            if t[0] != _WORD:
                return out
            if t[3] & _BRACE:
                out.extend((w, t[2], t[3] & GLOB) for w in _brace_expand(t[1]))
            else:
                out.append((t[1], t[2], t[3]))

    def _emit(self, argv: list[str], dyn: list[bool], flags: list[int],
              redirects: list[Redirect], stdin: str, via: str, cwds: tuple | None,
              unknown_operands: bool, find_roots: tuple | None, hops: int) -> None:
        ctx = self.ctx
        if len(ctx.commands) >= MAX_COMMANDS:
            raise self._err(f"more than {MAX_COMMANDS} commands")
        cmd = SimpleCommand(argv, dyn, flags, redirects, stdin,
                            tuple(ctx.cwds) if cwds is None else cwds, via, unknown_operands,
                            find_roots)
        ctx.commands.append(cmd)
        if not argv:
            return
        if dyn[0] or flags[0] & (GLOB | PROCSUB):
            cmd.note = "the command name is only known at run time"
            return
        name = cmd.name
        if find_roots is not None and "{}" in argv[0]:
            cmd.note = "find runs the found files as commands"
            return
        if name == "cd" or name == "pushd" or name == "popd":
            self._cd(cmd)
            return
        if hops > 16:
            raise self._err("more than 16 nested command wrappers")
        w = _cmds.unwrap(name, argv, dyn)
        if w is not None:
            self._emit_unwrapped(cmd, w, hops)
            return
        if name == "git":
            self._git(cmd, hops)
        elif name == "tar":
            for prog, pdyn in _cmds.tar_programs(argv, dyn):
                if pdyn:
                    cmd.note = "tar runs a command computed at run time"
                else:
                    self._parse_string(prog, "tar", "", deferred=True)
        elif name == "find":
            self._find(cmd, hops)
        elif name == "eval":
            if any(dyn[1:]):
                cmd.program = "dynamic"
                cmd.note = "eval of text computed at run time"
            elif len(argv) > 1:
                cmd.program = "string"
                self._parse_string(" ".join(argv[1:]), "eval", cmd.stdin)
        elif name == "source" or name == ".":
            self._source(cmd)
        elif name == "trap":
            ops = [i for i in range(1, len(argv)) if not argv[i].startswith("-")]
            if ops and len(ops) >= 2:
                i = ops[0]
                if dyn[i]:
                    cmd.note = "trap of a command computed at run time"
                else:
                    self._parse_string(argv[i], "trap", "", deferred=True)
        elif name == "alias":
            for i in range(1, len(argv)):
                if "=" in argv[i]:
                    if dyn[i]:
                        cmd.note = "alias of a command computed at run time"
                    else:
                        self._parse_string(argv[i].split("=", 1)[1], "alias", "", deferred=True)
        elif _cmds.is_interpreter(name):
            self._interpreter(cmd)

    def _emit_unwrapped(self, cmd: SimpleCommand, w: _cmds.Unwrapped, hops: int) -> None:
        argv, dyn, flags = cmd.argv, cmd.dyn, cmd.flags
        name = cmd.name
        if w.dynamic:
            cmd.note = f"{name} runs a command computed at run time"
        for idx in w.programs:
            if dyn[idx]:
                cmd.note = f"{name} runs a command computed at run time"
                continue
            text = " ".join(argv[idx:]) if w.join_program else argv[idx]
            self._parse_string(text, name, cmd.stdin, deferred=w.repeats)
        if w.programs:
            return
        inner: list[tuple[str, bool, int]] = []
        for idx in w.split:
            if dyn[idx]:
                cmd.note = f"{name} runs a command computed at run time"
                return
            inner.extend(self._split_words(argv[idx], name))
        if w.start is not None:
            inner.extend(zip(argv[w.start:], dyn[w.start:], flags[w.start:]))
        elif not inner:
            inner.extend((a, False, 0) for a in w.default)
        if not inner:
            return
        if w.join_program:
            if any(d for _, d, _ in inner[:1]):
                cmd.note = f"{name} runs a command computed at run time"
                return
            self._parse_string(" ".join(t for t, _, _ in inner), name, cmd.stdin,
                               deferred=w.repeats)
            return
        if w.replace:
            inner = [(t, d or w.replace in t, f) for t, d, f in inner]
        cwds = cmd.cwds
        for idx in w.chdirs:
            cwds = tuple(_combine_cwd(c, argv[idx], dyn[idx]) for c in cwds)
        self._emit([t for t, _, _ in inner], [d for _, d, _ in inner], [f for _, _, f in inner],
                   [], cmd.stdin, name, cwds, w.unknown_operands or cmd.unknown_operands,
                   cmd.find_roots, hops + 1)

    def _interpreter(self, cmd: SimpleCommand) -> None:
        name, argv, dyn = cmd.name, cmd.argv, cmd.dyn
        kind, found = _cmds.interpreter_program(name, argv, dyn)
        cmd.program_index = found
        idx = -1 if found is None else found
        shell = _cmds.is_shell(name)
        if kind == "string":
            if dyn[idx]:
                cmd.program = "dynamic"
                cmd.note = f"{name} runs a program computed at run time"
            else:
                cmd.program = "string"
                if shell:
                    self._parse_string(argv[idx], f"{name} -c", cmd.stdin)
        elif kind == "stdin":
            if cmd.unknown_operands:
                cmd.program = "dynamic"
                cmd.note = f"{name} runs a program named by data read at run time"
            elif cmd.stdin in ("heredoc", "herestring"):
                cmd.program = cmd.stdin
                if shell:
                    self._feed_body(cmd, name)
            else:
                cmd.program = "stdin"
        elif kind == "file":
            if cmd.flags[idx] & PROCSUB:
                cmd.program = "procsub"
            else:
                cmd.program = "file"
        elif kind == "module":
            cmd.program = "module"
        else:
            if cmd.unknown_operands:
                cmd.program = "dynamic"
                cmd.note = f"{name} runs a program named by data read at run time"
            else:
                cmd.program = "none"

    def _feed_body(self, cmd: SimpleCommand, name: str) -> None:
        """Analyze the here-document/here-string a shell reads its program from."""
        for r in reversed(cmd.redirects):
            if r.fd in (None, 0) and r.op in ("<<", "<<-", "<<<"):
                if r.op == "<<<" and r.dynamic:
                    cmd.program = "dynamic"
                    cmd.note = f"{name} runs a here-string computed at run time"
                    return
                if r.body is not None:
                    self._parse_string(r.body, f"{name} <<", "")
                else:
                    depth = self.depth
                    ctx = self.ctx

                    def _cb(body: str, depth: int = depth, ctx: _Ctx = ctx) -> None:
                        _Parser(ctx, body, 0, depth + 1, f"{name} <<", "", None).run()

                    r.callbacks.append(_cb)
                return

    def _source(self, cmd: SimpleCommand) -> None:
        argv, dyn = cmd.argv, cmd.dyn
        ops = [i for i in range(1, len(argv)) if argv[i] != "--"]
        if not ops:
            return
        i = ops[0]
        self.ctx.deferred = True    # a sourced file may cd; treat later directories as unknown
        if cmd.flags[i] & PROCSUB:
            cmd.program = "procsub"
        elif dyn[i]:
            cmd.program = "dynamic"
            cmd.note = "source of a file computed at run time"
        elif argv[i] in _cmds.STDIN_PATHS:
            if cmd.stdin in ("heredoc", "herestring"):
                cmd.program = cmd.stdin
                self._feed_body(cmd, cmd.name)
            else:
                cmd.program = "stdin"
        else:
            cmd.program = "file"

    def _git(self, cmd: SimpleCommand, hops: int) -> None:
        argv, dyn = cmd.argv, cmd.dyn
        if len(argv) < 2 or (not dyn[1] and not argv[1].startswith("-")):
            return      # no global options: no aliases, no configuration, nothing to rewrite
        call = _cmds.parse_git(argv, dyn)
        for key, value, vdyn in call.config:
            if _cmds.GIT_COMMAND_KEYS.match(key) or (key.lower().startswith("alias.")
                                                     and value.startswith("!")):
                if vdyn:
                    cmd.note = f"git -c {key} runs a command computed at run time"
                elif value:
                    v = value[1:] if value.startswith("!") else value
                    self._parse_string(v, f"git -c {key}", "", deferred=True)
        sub = call.sub
        if sub is None:
            return
        canon: list[tuple[str, bool, int]] = [("git", False, 0)]
        name = argv[sub]
        sub_dyn = dyn[sub]
        rest = list(zip(argv[sub + 1:], dyn[sub + 1:], cmd.flags[sub + 1:]))
        seen: set[str] = set()
        while not sub_dyn and name.lower() in call.aliases and name.lower() not in seen:
            seen.add(name.lower())
            alias = call.aliases[name.lower()]
            if alias is None:
                sub_dyn = True
                break
            value = alias
            if value.startswith("!"):
                return      # a shell alias: analyzed above with the -c values
            words = self._split_words(value, "git alias")
            if not words:
                break
            name, sub_dyn = words[0][0], words[0][1]
            rest = words[1:] + rest
        canon.append((name, sub_dyn, 0))
        canon.extend(rest)
        if len(canon) != len(argv) or any(c[0] != a for c, a in zip(canon, argv)):
            self._emit([c[0] for c in canon], [c[1] for c in canon], [c[2] for c in canon], [],
                       cmd.stdin, "git", cmd.cwds, cmd.unknown_operands, cmd.find_roots,
                       hops + 1)

    def _find(self, cmd: SimpleCommand, hops: int) -> None:
        argv, dyn = cmd.argv, cmd.dyn
        call = _cmds.parse_find(argv, dyn)
        if not call.execs:
            return
        if call.follow or any(dyn[i] for i in call.starts):
            roots = None
        else:
            roots = tuple(argv[i] for i in call.starts) or (".",)
        for action, a, b in call.execs:
            if a >= b:
                continue
            words = argv[a:b]
            wdyn = list(dyn[a:b])
            if roots is None:
                wdyn = [d or "{}" in t for t, d in zip(words, wdyn)]
            cwds = (None,) if action in ("-execdir", "-okdir") else cmd.cwds
            self._emit(list(words), wdyn, list(cmd.flags[a:b]), [], "", f"find {action}", cwds,
                       cmd.unknown_operands, roots, hops + 1)

    def _cd(self, cmd: SimpleCommand) -> None:
        _apply_cd(self.ctx, cmd)


def _apply_cd(ctx: _Ctx, cmd: SimpleCommand) -> None:
    """Record the directories a ``cd``/``pushd``/``popd`` may move to (``ctx.cwds`` only
    grows: every later command may run in any of them)."""
    ctx.cd_seen = True
    if ctx.loop_depth > 0:
        ctx.cwd_unknown = True
    if cmd.name == "popd":
        return      # back to a directory already tracked
    argv, dyn = cmd.argv, cmd.dyn
    ops = [i for i in range(1, len(argv)) if dyn[i] or not (
        argv[i] in ("-L", "-P", "-e", "-@", "-n", "--"))]
    if not ops:
        targets = [("~", False)]
    else:
        t = argv[ops[0]]
        if not dyn[ops[0]] and (t == "-" or (cmd.name == "pushd" and t[:1] in "+-"
                                               and t[1:].isdigit())):
            targets = [("", True)]
        else:
            targets = [(t, dyn[ops[0]])]
    new = list(ctx.cwds)
    for t, d in targets:
        for c in ctx.cwds:
            v = _combine_cwd(c, t, d)
            if v not in new:
                new.append(v)
    if len(new) > MAX_CWDS:
        new = new[:MAX_CWDS] + [None]
    ctx.cwds = new


def _brace_expand(text: str) -> list[str]:
    """Bash brace expansion of a word whose unquoted ``{ , }`` are marked (bash manual, "Brace
    Expansion"): ``{a,b}`` alternatives and ``{x..y[..step]}`` sequences, nested, left to right;
    at most :data:`MAX_BRACE_WORDS` words (more raises :class:`ShellSyntaxError`)."""
    out = _expand_marked(text)
    return [t.translate(_UNMARK) for t in out]


def _expand_marked(t: str) -> list[str]:
    if t.count(_LB) > _MAX_BRACES:
        raise ShellSyntaxError(f"more than {_MAX_BRACES} braces in one word")
    i = t.find(_LB)
    while i >= 0:
        depth = 0
        commas: list[int] = []
        end = -1
        for j in range(i, len(t)):
            c = t[j]
            if c == _LB:
                depth += 1
            elif c == _RB:
                depth -= 1
                if depth == 0:
                    end = j
                    break
            elif c == _COMMA and depth == 1:
                commas.append(j)
        if end < 0:
            i = t.find(_LB, i + 1)
            continue
        pre, post = t[:i], t[end + 1:]
        if commas:
            bounds = [i, *commas, end]
            alts = [t[bounds[k] + 1:bounds[k + 1]] for k in range(len(bounds) - 1)]
        else:
            seq = _sequence(t[i + 1:end].translate(_UNMARK))
            if seq is None:
                i = t.find(_LB, i + 1)
                continue
            alts = seq
        results: list[str] = []
        for a in alts:
            results.extend(_expand_marked(pre + a + post))
            if len(results) > MAX_BRACE_WORDS:
                raise ShellSyntaxError(f"brace expansion of more than {MAX_BRACE_WORDS} words")
        return results
    return [t]


def _sequence(body: str) -> list[str] | None:
    m = re.fullmatch(r"(-?\d+|[A-Za-z])\.\.(-?\d+|[A-Za-z])(?:\.\.(-?\d+))?", body)
    if m is None:
        return None
    a, b, step = m.group(1), m.group(2), m.group(3)
    inc = abs(int(step)) if step and int(step) != 0 else 1
    if a.lstrip("-").isdigit() and b.lstrip("-").isdigit():
        x, y = int(a), int(b)
        if abs(y - x) // inc > MAX_BRACE_WORDS:
            raise ShellSyntaxError(f"brace expansion of more than {MAX_BRACE_WORDS} words")
        width = max(len(a), len(b)) if (a.lstrip("-").startswith("0") and len(a.lstrip("-")) > 1
                                       or b.lstrip("-").startswith("0")
                                       and len(b.lstrip("-")) > 1) else 0
        rng = range(x, y + 1, inc) if y >= x else range(x, y - 1, -inc)
        return [str(v).zfill(width) if width else str(v) for v in rng]
    if len(a) == 1 and len(b) == 1 and not a.isdigit() and not b.isdigit():
        x, y = ord(a), ord(b)
        rng = range(x, y + 1, inc) if y >= x else range(x, y - 1, -inc)
        return [chr(v) for v in rng]
    return None
