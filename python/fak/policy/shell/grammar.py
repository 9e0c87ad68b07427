"""The grammar of the shell analyzer: simple commands, pipelines and lists, compound commands
(``if``/``while``/``until``/``for``/``case``, groups, subshells, ``[[ ]]``), function
definitions, assignments and redirections (bash manual "Shell Grammar", "Shell Commands",
"Shell Functions"; POSIX "Shell Command Language" 2.9-2.10). Permissive where bash is permissive;
:class:`~fak.policy.shell.model.ShellSyntaxError` where bash would refuse to run the line.

:class:`Grammar` is a mixin of :class:`~fak.policy.shell.parser.Parser`; every simple command it
completes goes to ``self._emit`` (:mod:`fak.policy.shell.follow`).
"""

from __future__ import annotations

from fak.policy.shell.base import ParserBase
from fak.policy.shell.brace import brace_expand
from fak.policy.shell.lexer import (_ASSIGN, ARITH, CASE_IN, CASE_PAT, CASE_SUBJECT, CMD, DBRACKET,
                                    EOF, FOR_HEADER, FUNC_NAME, OP, REDIR, WORD)
from fak.policy.shell.model import BRACE, GLOB, LB, PROCSUB, UNMARK, Redirect

KEYWORDS = {
    "if": "if", "then": "then", "else": "else", "elif": "elif", "fi": "fi", "do": "do",
    "done": "done", "while": "while", "until": "until", "for": "for", "select": "for",
    "case": "case", "esac": "esac", "function": "function", "!": "!", "time": "time",
    "coproc": "coproc", "[[": "[[", LB: "{", "}": "}",
}
_PREFIX_KEYWORDS = frozenset({"then", "else", "elif", "do", "!", "coproc"})


def stdin_of(redirects: list[Redirect], stdin: str) -> str:
    """Where a command's standard input comes from, given its redirections and what it
    inherits: ``"file"``, ``"procsub"``, ``"heredoc"``, ``"herestring"`` or ``stdin``
    unchanged (``< /dev/stdin`` and the like reopen what is inherited)."""
    for r in redirects:
        if r.fd in (None, 0):
            op = r.op
            if op == "<" or op == "<>":
                if r.target in _SAME_STDIN and not r.dynamic:
                    continue
                stdin = "procsub" if r.procsub else "file"
            elif op == "<<" or op == "<<-":
                stdin = "heredoc"
            elif op == "<<<":
                stdin = "herestring"
    return stdin


_SAME_STDIN = frozenset({"/dev/stdin", "/dev/fd/0", "/proc/self/fd/0", "/proc/thread-self/fd/0"})


class Grammar(ParserBase):
    """Parser methods over the lexer's tokens (see the module docstring)."""

    def run(self) -> None:
        """Parse to the end of the string (or the closing parenthesis of an in-place parse)."""
        while True:
            tok = self._next_tok()
            k = tok[0]
            if k == WORD:
                self._on_word(tok)
            elif k == OP:
                if self._on_op(tok[1]):
                    return
            elif k == REDIR:
                self._on_redir(tok[1], tok[2])
            elif k == ARITH:
                continue
            else:
                if self.closer is not None:
                    raise self._err("unterminated $( or <(")
                self._finish()
                if self.frames:
                    raise self._err(f"unterminated {self.frames[-1][0]}")
                if self.mode != CMD:
                    raise self._err("incomplete for/case/function")
                return

    def _on_word(self, tok: tuple) -> None:
        _, text, dyn, flags, plain, start = tok
        mode = self.mode
        if mode != CMD:
            if mode == DBRACKET:
                self.words.append((text.translate(UNMARK), dyn, 0))
                if plain and text == "]]":
                    self.mode = CMD
                return
            if mode == FOR_HEADER:
                if plain and text == "do":
                    self.mode = CMD
                return
            if mode == CASE_SUBJECT:
                self.mode = CASE_IN
                return
            if mode == CASE_IN:
                if plain and text == "in":
                    self.mode = CASE_PAT
                    return
                raise self._err("expected `in` after case")
            if mode == CASE_PAT:
                if plain and text == "esac":
                    self._pop("case")
                    self.mode = CMD
                return
            if mode == FUNC_NAME:
                self.mode = CMD
                self.func_name = text
                self.func_next = True
                self.func_parens = True
                self.ctx.deferred = True
                return
        words = self.words
        if not words:
            if plain and text in KEYWORDS:
                self._keyword(KEYWORDS[text])
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
        if flags & BRACE:
            for t in brace_expand(text):
                words.append((t, dyn, flags & (GLOB | PROCSUB)))
            return
        words.append((text, dyn, flags))

    def _assignment(self, text: str, dyn: bool, name_len: int, name: str) -> None:
        value = text[name_len:].translate(UNMARK)
        var = name.rstrip("+=").split("[", 1)[0]
        if value:
            self._env_assign(var, value, dyn)
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
            self.mode = FOR_HEADER
        elif kw == "case":
            self._push("case", False)
            self.mode = CASE_SUBJECT
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
            self.mode = FUNC_NAME
        elif kw == "[[":
            self.words.append(("[[", False, 0))
            self.mode = DBRACKET

    def _push(self, kind: str, loopish: bool) -> None:
        func = self.func_next
        if func:
            loopish = True
            self.func_next = False
            self.ctx.func_stack.append(self.func_name)
        self.frames.append((kind, self.base_stdin, loopish, func))
        self.base_stdin = self._stdin_now()
        self.pipe_next = False
        if loopish:
            self.ctx.loop_depth += 1

    def _pop(self, kind: str) -> None:
        if not self.frames or self.frames[-1][0] != kind:
            want = self.frames[-1][0] if self.frames else "nothing"
            raise self._err(f"unexpected end of {kind} (open: {want})")
        _, stdin, loopish, func = self.frames.pop()
        self.base_stdin = stdin
        if loopish:
            self.ctx.loop_depth -= 1
        if func and self.ctx.func_stack:
            self.ctx.func_stack.pop()

    def _on_op(self, op: str) -> bool:
        mode = self.mode
        if mode != CMD:
            if mode == DBRACKET:
                self.words.append((op, False, 0))
                return False
            if mode == CASE_PAT:
                if op == ")":
                    self.mode = CMD
                return False
            if mode in (FOR_HEADER, CASE_SUBJECT, CASE_IN):
                if op in (";", "\n"):
                    return False
                raise self._err(f"unexpected {op!r}")
            raise self._err(f"unexpected {op!r}")
        if op in (";", "\n", "&&", "||"):
            self._finish()
            if self.after_time and op != "\n":
                self.after_time = False
            return False
        if op == "&" or op == "|" or op == "|&":
            commands = self.ctx.commands
            first = len(commands)
            self._finish()
            for c in commands[first:]:
                c.concurrent = True
            if op == "&":
                self.after_time = False
            else:
                self.pipe_next = True
            return False
        if op in (";;", ";&", ";;&"):
            self._finish()
            if not self.frames or self.frames[-1][0] != "case":
                raise self._err(f"unexpected {op!r}")
            self.mode = CASE_PAT
            return False
        if op == "(":
            if self.array_next:
                self.array_next = False
                while True:
                    t = self._next_tok()
                    if t[0] == EOF:
                        raise self._err("unterminated array assignment")
                    if t[0] == OP and t[1] == ")":
                        return False
            if self.func_parens or (len(self.words) == 1 and not self.words[0][1]):
                t = self._next_tok()
                if t[0] != OP or t[1] != ")":
                    raise self._err("unexpected `(`")
                if self.words:
                    self.func_name = self.words[0][0]
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
        if self.mode == DBRACKET:
            self.words.append((op, False, 0))
            return
        if self.mode != CMD:
            raise self._err(f"unexpected {op!r}")
        t = self._next_tok()
        if t[0] != WORD:
            raise self._err(f"redirection {op!r} without a target")
        _, text, dyn, flags, plain, _ = t
        if flags & BRACE:
            text = text.translate(UNMARK)
        r = Redirect(op, fd, text, dyn, bool(flags & PROCSUB))
        if op == "<<" or op == "<<-":
            self.pending.append((r, text, op == "<<-", not plain))
        elif op == "<<<":
            r.body = text
            r.body_dynamic = dyn
        self.redirects.append(r)

    def _finish(self) -> None:
        words = self.words
        redirects = self.redirects
        if not words and not redirects:
            self.pipe_next = False
            return
        stdin = stdin_of(redirects, self._stdin_now())
        self.words = []
        self.redirects = []
        self.pipe_next = False
        self._emit([w[0] for w in words], [w[1] for w in words], [w[2] for w in words],
                   redirects, stdin, self.via, None, False, None, 0)

