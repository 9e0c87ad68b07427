"""What the shell analyzer produces: :class:`SimpleCommand` (one command the line would run, with
its words, redirections, standard input and directories), :class:`Redirect`, :class:`Analysis`
(all of them), the word flags, the analysis limits and :class:`ShellSyntaxError`."""

from __future__ import annotations

MAX_DEPTH = 8            # nested $(...), bash -c, eval, ... strings
MAX_COMMANDS = 512       # simple commands in one analysis
MAX_CWDS = 16            # directories tracked after cd
MAX_BRACE_WORDS = 256    # words one brace expansion may produce
MAX_SOURCE_CHARS = 65536     # longest command line analyzed (characters)
MAX_PARSE_CHARS = 262144     # characters parsed in one analysis, nested strings included


class ShellSyntaxError(ValueError):
    """The command line is not valid shell, or is beyond what the analysis follows.

    ``str(err)`` says what and where (``unterminated single quote at offset 12``)."""


# word flags
GLOB = 1       # an unquoted *, ? or [...] (pathname expansion)
PROCSUB = 2    # a process substitution <(...) / >(...)
BRACE = 4      # unquoted { , } (brace expansion pending)

# markers for unquoted brace-expansion syntax inside a word being built
LB, RB, COMMA = "\ue000", "\ue001", "\ue002"
UNMARK = str.maketrans({LB: "{", RB: "}", COMMA: ","})


class Redirect:
    """One redirection: ``op`` (``>``, ``>>``, ``<``, ``<<``, ``<<-``, ``<<<``, ``&>``, ``&>>``,
    ``>&``, ``<&``, ``>|``, ``<>``), ``fd`` (explicit descriptor or ``None``), ``target`` (the
    word after quote removal; for ``<<`` the delimiter), ``dynamic`` (the target holds a run-time
    expansion), ``procsub`` (the target is ``<(...)``), ``body`` (here-document or here-string
    text as the command receives it: for an unquoted here-document, after the outer shell's
    backslash removal, with run-time expansions left as their source text; ``None`` until read),
    ``body_dynamic`` (the body holds an expansion only known at run time)."""

    __slots__ = ("op", "fd", "target", "dynamic", "procsub", "body", "body_dynamic", "callbacks")

    def __init__(self, op: str, fd: int | None, target: str, dynamic: bool, procsub: bool):
        self.op = op
        self.fd = fd
        self.target = target
        self.dynamic = dynamic
        self.procsub = procsub
        self.body: str | None = None
        self.body_dynamic = False
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
    was reached (``""`` top level, ``"sudo"``, ``"bash -c"``, ``"$(...)"``, ``"copy of /bin/rm"``,
    ...); ``unknown_operands``: operands are appended at run time (``xargs``); ``find_roots``:
    for a ``find -exec`` action, the starting points that ``{}`` stands under (``None``
    otherwise); ``find_guarded``: for a ``find -exec`` action, a positive name or path test
    selects what it runs on; ``program``: for an interpreter, where its program comes from
    (``"string"``, ``"stdin"``, ``"heredoc"``, ``"herestring"``, ``"file"``, ``"module"``,
    ``"procsub"``, ``"descriptor"``, ``"dynamic"``, ``"none"``), else ``None``;
    ``program_index``: the word holding the ``-c`` string, the script or the ``-m`` module, if
    any; ``note``: why the command is only known at run time, else ``None``; ``func``: the name
    of the shell function whose body holds it, else ``None``; ``concurrent``: it runs alongside
    its caller (followed by ``&`` or piped into another command); ``cache``: values derived
    from the command by the checks of one decision (``None`` until one is stored)."""

    __slots__ = ("argv", "dyn", "flags", "name", "line", "redirects", "stdin", "cwds", "via",
                 "unknown_operands", "find_roots", "find_guarded", "program", "program_index",
                 "note", "func", "concurrent", "cache")

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
        self.find_guarded = False
        self.program: str | None = None
        self.program_index: int | None = None
        self.note: str | None = None
        self.func: str | None = None
        self.concurrent = False
        self.cache: dict | None = None
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
    """What :func:`~fak.policy.shell.analyze` found: ``commands`` (tuple[:class:`SimpleCommand`],
    in the order they were read) and ``lines`` (tuple[str], the non-empty normalized lines)."""

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


EMPTY = Analysis(())
ROOT_CWD = ("",)
