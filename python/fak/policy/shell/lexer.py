"""The lexer of the shell analyzer: tokens, words after quote removal, ``$'...'``, ``$(...)``,
backquotes, ``${...}``, ``$((...))``, here-documents (bash manual "Quoting", "Shell Expansions",
"Here Documents"; POSIX "Shell Command Language" 2.2-2.3, 2.6-2.7).

:class:`Lexer` is a mixin of :class:`~fak.policy.shell.parser.Parser`: it reads ``self.s`` from
``self.i`` and starts child parsers for nested command strings through ``self._child``.
"""

from __future__ import annotations

import re

from fak.policy.shell.base import ParserBase
from fak.policy.shell.model import BRACE, COMMA, GLOB, LB, PROCSUB, RB, ShellSyntaxError

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
# The same subset over a whole line (finditer); group 5 catches any other character, which sends
# the line to the full parser.
_FAST_LINE = re.compile(_FAST_TOK.pattern[:-2] + "  | (.)\n)", re.X | re.S)


def _unquote_piece(m: re.Match[str]) -> str:
    a = m.group(1)
    return a if a is not None else m.group(2)


# tokens: (kind, ...)
EOF, WORD, OP, REDIR, ARITH = 0, 1, 2, 3, 4
_EOF_TOK = (EOF,)
_NL_TOK = (OP, "\n")

# parser modes (the grammar's; the lexer reads them to tell `((` arithmetic from subshells)
CMD, FOR_HEADER, CASE_SUBJECT, CASE_IN, CASE_PAT, FUNC_NAME, DBRACKET = range(7)

_OCTAL = re.compile(r"[0-7]{0,2}")
_HEX = {"x": re.compile(r"[0-9A-Fa-f]{1,2}"), "u": re.compile(r"[0-9A-Fa-f]{1,4}"),
        "U": re.compile(r"[0-9A-Fa-f]{1,8}")}
_ANSI_SIMPLE = {"a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n", "r": "\r",
                "t": "\t", "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}


class Lexer(ParserBase):
    """Tokenizer methods over ``self.s`` (see the module docstring)."""

    # ----------------------------------------------------------------------------- lexer

    def _err(self, what: str, at: int | None = None) -> ShellSyntaxError:
        return ShellSyntaxError(f"{what} at offset {self.i if at is None else at}")

    def _next_tok(self) -> tuple:
        s = self.s
        m = _FAST_TOK.match(s, self.i)
        if m is not None and (m.lastindex != 3 or m.end() >= self.n
                              or (s[m.end()] in _WORD_END
                                  and not (s[m.end()] in "<>" and m.group(3).isdigit()))):
            k = m.lastindex
            self.i = m.end()
            if k == 3:
                raw = m.group(3)
                if "'" in raw or '"' in raw:
                    return (WORD, _UNQUOTE.sub(_unquote_piece, raw), False, 0, False,
                            m.start(3))
                return (WORD, raw, False, 0, True, m.start(3))
            if k == 4:
                op = m.group(4)
                if op == "\n":
                    if self.pending:
                        self._read_heredocs()
                    return _NL_TOK
                return (OP, op)
            fd = m.group(1)
            return (REDIR, m.group(2), int(fd) if fd else None)
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
            if i + 1 < n and s[i + 1] == "(" and not self.words and self.mode in (CMD, FOR_HEADER):
                end = self._arith(i + 2)
                if end is not None:
                    self.i = end
                    return (ARITH,)
            self.i = i + 1
            return (OP, "(")
        if c == ")":
            self.i = i + 1
            return (OP, ")")
        if c == ";":
            for op in (";;&", ";;", ";&"):
                if s.startswith(op, i):
                    self.i = i + len(op)
                    return (OP, op)
            self.i = i + 1
            return (OP, ";")
        if c == "&":
            if s.startswith("&&", i):
                self.i = i + 2
                return (OP, "&&")
            if s.startswith("&>>", i):
                self.i = i + 3
                return (REDIR, "&>>", None)
            if s.startswith("&>", i):
                self.i = i + 2
                return (REDIR, "&>", None)
            self.i = i + 1
            return (OP, "&")
        if c == "|":
            if s.startswith("||", i):
                self.i = i + 2
                return (OP, "||")
            if s.startswith("|&", i):
                self.i = i + 2
                return (OP, "|&")
            self.i = i + 1
            return (OP, "|")
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
                return (REDIR, op, fd)
        raise self._err("bad redirection", i)  # pragma: no cover - ops cover < and >

    def _procsub(self, i: int) -> tuple:
        child = self._child(self.s, i + 2, "<(...)", "", ")")
        child.run()
        self.i = child.i
        return (WORD, self.s[i:child.i], True, PROCSUB, False, i)

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
                parts.append(LB)
                flags |= BRACE
                i += 1
            elif c == "}":
                parts.append(RB if flags & BRACE else "}")
                i += 1
            elif c == ",":
                parts.append(COMMA if flags & BRACE else ",")
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
        return (WORD, text, dyn, flags, plain, start)

    def _dq(self, i: int, parts: list[str], quoted: bool,
            heredoc: bool = False) -> tuple[int, bool]:
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
            child = self._child(s, j + 1, "$(...)", self._stdin_now(), ")")
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
        """Decode ``$'...'`` (bash "ANSI-C Quoting") whose body starts at ``i``. Bash builds the
        value as a C string, so a NUL (``\\0``, ``\\x00``, ``\\u0000``, ``\\c@``, ``\\400``)
        ends it: the rest of the quoted text is dropped, the word goes on after the quote."""
        s = self.s
        n = self.n
        out: list[str] = []
        while i < n:
            c = s[i]
            if c == "'":
                text = "".join(out)
                cut = text.find("\0")
                return i + 1, text if cut < 0 else text[:cut]
            if c != "\\" or i + 1 >= n:
                out.append(c)
                i += 1
                continue
            e = s[i + 1]
            i += 2
            if e in _ANSI_SIMPLE:
                out.append(_ANSI_SIMPLE[e])
            elif e in "01234567":
                m = _OCTAL.match(s, i)
                digits = e + (m.group() if m else "")
                i += len(digits) - 1
                out.append(chr(int(digits, 8) & 0xFF))
            elif e in "xuU":
                m = _HEX[e].match(s, i)
                if m:
                    i = m.end()
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
        """Read the bodies of the here-documents whose operators this line held. An unquoted
        body is what the command receives after the outer shell's expansion (bash manual, "Here
        Documents"): backslash-newline removed, ``\\$``, ``\\```, ``\\\\`` unescaped, command
        substitutions analyzed (they run in the outer shell); expansions only known at run time
        stay as their source text and mark the body dynamic."""
        s = self.s
        n = self.n
        pending = self.pending
        self.pending = []
        for r, delim, strip, quoted in pending:
            # the first line that is the delimiter (after leading tabs, for <<-) ends the body
            end_re = re.compile(("^\t*" if strip else "^") + re.escape(delim) + "$", re.M)
            start = self.i
            m = end_re.search(s, start)
            stop = n if m is None else m.start()
            text = s[start:stop]
            self.i = n if m is None else min(m.end() + 1, n)
            if text.endswith("\n"):
                text = text[:-1]    # the newline that ends the last body line
            lines = text.split("\n") if stop > start else []
            if strip:
                lines = [line.lstrip("\t") for line in lines]
            body = "\n".join(lines) + ("\n" if lines else "")
            if not quoted and ("$" in body or "`" in body or "\\" in body):
                parts: list[str] = []
                sub = self._child(body, 0, "<<", "", None)
                _, r.body_dynamic = sub._dq(0, parts, True, heredoc=True)
                body = "".join(parts)
            r.body = body
            for cb in r.callbacks:
                cb(r)

    def _stdin_now(self) -> str:
        return "pipe" if self.pipe_next else self.base_stdin
