"""The state of one analysis (:class:`Ctx`) and of one parser (:class:`ParserBase`: its fields
and the methods its parts call across each other), shared by the mixins that make up
:class:`~fak.policy.shell.parser.Parser` (lexer, grammar, follow, gitrun, written)."""

from __future__ import annotations

from typing import Any

from fak.policy.shell.model import MAX_PARSE_CHARS, Redirect, ShellSyntaxError, SimpleCommand


class Ctx:
    """State shared by the parsers of one analysis (nested strings included): the commands
    found, the directories ``cd`` may have reached, loop/function nesting, the files written
    and variables set so far, git aliases seen, the characters left to parse, and the
    workspace root (``None``: unknown; then nothing is looked up on disk)."""

    __slots__ = ("commands", "cwds", "cd_seen", "loop_depth", "cwd_unknown", "deferred", "root",
                 "written", "env", "path_dirs", "git_aliases", "git_env_done", "func_stack",
                 "budget")

    def __init__(self, root: str | None = None) -> None:
        self.commands: list[SimpleCommand] = []
        self.cwds: list[str | None] = [""]
        self.cd_seen = False
        self.loop_depth = 0
        self.cwd_unknown = False
        self.deferred = False
        self.root = root
        self.written: dict[str, Any] = {}
        self.env: dict[str, tuple[str, bool]] = {}
        self.path_dirs: list[str] = []
        self.git_aliases: dict[str, str | None] = {}
        self.git_env_done: set[tuple] = set()
        self.func_stack: list[str] = []
        self.budget = MAX_PARSE_CHARS


class ParserBase:
    """Fields of a parser over ``s`` from ``i`` and the methods one part calls in another;
    :class:`~fak.policy.shell.parser.Parser` provides them all."""

    ctx: Ctx
    s: str
    i: int
    n: int
    depth: int
    via: str
    closer: str | None
    base_stdin: str
    frames: list[tuple[str, str, bool, bool]]
    words: list[tuple[str, bool, int]]
    redirects: list[Redirect]
    pipe_next: bool
    mode: int
    pending: list[tuple[Redirect, str, bool, bool]]
    func_next: bool
    func_parens: bool
    func_name: str
    array_next: bool
    after_time: bool

    def _child(self, s: str, i: int, via: str, stdin: str, closer: str | None) -> ParserBase:
        raise NotImplementedError

    def _err(self, what: str, at: int | None = None) -> ShellSyntaxError:
        raise NotImplementedError

    def run(self) -> None:
        raise NotImplementedError

    def _next_tok(self) -> tuple:
        raise NotImplementedError

    def _stdin_now(self) -> str:
        raise NotImplementedError

    def _dq(self, i: int, parts: list[str], quoted: bool,
            heredoc: bool = False) -> tuple[int, bool]:
        raise NotImplementedError

    def _parse_string(self, text: str, via: str, stdin: str, deferred: bool = False) -> None:
        raise NotImplementedError

    def _split_words(self, text: str, via: str) -> list[tuple[str, bool, int]]:
        raise NotImplementedError

    def _note(self, why: str) -> None:
        raise NotImplementedError

    def _emit(self, argv: list[str], dyn: list[bool], flags: list[int],
              redirects: list[Redirect], stdin: str, via: str, cwds: tuple | None,
              unknown_operands: bool, find_roots: tuple | None, hops: int,
              find_guarded: bool = False) -> None:
        raise NotImplementedError

    def _run_text(self, cmd: SimpleCommand, text: str, dynamic: bool, via: str,
                  stdin: str = "") -> None:
        raise NotImplementedError

    def _env_assign(self, var: str, value: str, dyn: bool) -> None:
        raise NotImplementedError

    def _git_env(self, var: str) -> None:
        raise NotImplementedError

    def _git(self, cmd: SimpleCommand, hops: int) -> None:
        raise NotImplementedError

    def _record_writes(self, cmd: SimpleCommand) -> None:
        raise NotImplementedError

    def _run_file(self, cmd: SimpleCommand, hops: int) -> bool:
        raise NotImplementedError

    def _run_script(self, cmd: SimpleCommand, word: str) -> None:
        raise NotImplementedError
