"""What sed scripts and awk programs do outside their text stream: the shell commands they run
and the files they write.

- :func:`sed_effects` reads a sed script with the GNU sed grammar (GNU sed manual, "sed scripts":
  addresses, ``!``, ``{}``, ``s///`` with any delimiter and its flags, ``y``, ``a``/``i``/``c``
  text, labels, ``r``/``R``/``w``/``W`` file names to the end of the line): the ``e COMMAND``
  command and the ``e`` flag of ``s`` run shell commands; ``w FILE``, ``W FILE`` and the ``w``
  flag of ``s`` write files.
- :func:`awk_effects` scans an awk program with the lexical rules of POSIX awk (strings, regular
  expression literals where an operand cannot stand, comments): ``system(...)``, ``... |
  getline``, ``print ... | CMD`` and ``|&`` run shell commands; ``print ... > FILE`` /
  ``>> FILE`` write files; ``ENVIRON`` reads the environment.

Both return what is known from the text: a command or a file name given as a literal, or
``None`` for one computed at run time. Neither runs anything or touches the file system; both
are memoized per text (the analyzer and several checks ask about the same program; callers
must not modify the returned lists).
"""

from __future__ import annotations

import re
from functools import lru_cache

_SED_LABEL_END = re.compile(r"[;\n]")


@lru_cache(maxsize=512)
def sed_effects(script: str) -> tuple[list[str | None], list[str]]:
    """``(runs, writes)`` of a sed script: ``runs`` holds the shell commands it executes
    (``None``: the pattern space, known only at run time), ``writes`` the files it writes."""
    runs: list[str | None] = []
    writes: list[str] = []
    i = 0
    n = len(script)
    while i < n:
        c = script[i]
        if c in " \t\n;{}!":
            i += 1
            continue
        if c == "#":
            i = _eol(script, i)
            continue
        i = _sed_address(script, i)
        while i < n and script[i] in " \t":
            i += 1
        if i < n and script[i] == ",":
            i = _sed_address(script, _skip_blank(script, i + 1))
        while i < n and script[i] in " \t!":
            i += 1
        if i >= n:
            break
        c = script[i]
        i += 1
        if c == ":":
            i = _eol(script, i)
        elif c in "aic":
            i = _sed_text(script, i)
        elif c in "btTv":
            m = _SED_LABEL_END.search(script, i)
            i = n if m is None else m.start()
        elif c in "rRwW":
            end = _eol(script, i)
            name = script[i:end].strip()
            if c in "wW" and name:
                writes.append(name)
            i = end
        elif c == "e":
            end = _eol(script, i)
            cmd = script[i:end].strip()
            runs.append(cmd or None)
            i = end
        elif c == "s" and i < n:
            delim = script[i]
            i = _sed_part(script, i + 1, delim)
            i = _sed_part(script, i, delim)
            while i < n and script[i] not in ";\n}":
                f = script[i]
                if f == "e":
                    runs.append(None)
                elif f == "w":
                    end = _eol(script, i + 1)
                    name = script[i + 1:end].strip()
                    if name:
                        writes.append(name)
                    i = end
                    break
                i += 1
        elif c == "y" and i < n:
            delim = script[i]
            i = _sed_part(script, _sed_part(script, i + 1, delim), delim)
    return runs, writes


def _eol(s: str, i: int) -> int:
    j = s.find("\n", i)
    return len(s) if j < 0 else j


def _skip_blank(s: str, i: int) -> int:
    while i < len(s) and s[i] in " \t":
        i += 1
    return i


def _sed_part(s: str, i: int, delim: str) -> int:
    """The index after the unescaped ``delim`` that ends a regex or replacement at ``i``."""
    n = len(s)
    while i < n:
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == delim:
            return i + 1
        i += 1
    return n


def _sed_address(s: str, i: int) -> int:
    n = len(s)
    if i >= n:
        return i
    c = s[i]
    if c == "/" or (c == "\\" and i + 1 < n):
        if c == "\\":
            delim = s[i + 1]
            i += 2
        else:
            delim = "/"
            i += 1
        i = _sed_part(s, i, delim)
        while i < n and s[i] in "IM":
            i += 1
        return i
    if c == "$":
        return i + 1
    if c in "+~":
        i += 1
    while i < n and (s[i].isdigit() or s[i] == "~"):
        i += 1
    return i


def _sed_text(s: str, i: int) -> int:
    """End of the text of an ``a``/``i``/``c`` command (lines continued by a backslash)."""
    n = len(s)
    while i < n:
        j = _eol(s, i)
        if j > i and s[j - 1] == "\\" and j < n:
            i = j + 1
            continue
        if j == i + 1 and s[i] == "\\":
            i = j + 1
            continue
        return j
    return n


# ------------------------------------------------------------------------------------------ awk

_AWK_TOKEN = re.compile(r"""
    (?P<space>[ \t\r]+|\\\n)
  | (?P<comment>\#[^\n]*)
  | (?P<str>"(?:[^"\\\n]|\\.)*")
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<num>[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9]+)
  | (?P<op>\|\||&&|\|&|>>|>=|<=|==|!=|\+\+|--|[-+*/%^!<>=~?:,;{}()\[\]$|&\n])
""", re.X)
_OPERAND_END = frozenset({"name", "num", "str", ")", "]", "$", "++", "--", "re"})
_STATEMENT_END = frozenset({";", "\n", "}", "{"})


def _awk_tokens(prog: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    i = 0
    n = len(prog)
    while i < n:
        if prog[i] == "/" and (not out or out[-1][0] not in _OPERAND_END):
            j = i + 1
            in_bracket = False
            while j < n and prog[j] != "\n":
                c = prog[j]
                if c == "\\":
                    j += 2
                    continue
                if c == "[":
                    in_bracket = True
                elif c == "]":
                    in_bracket = False
                elif c == "/" and not in_bracket:
                    break
                j += 1
            out.append(("re", prog[i:j + 1]))
            i = j + 1
            continue
        m = _AWK_TOKEN.match(prog, i)
        if m is None:
            out.append(("op", prog[i]))
            i += 1
            continue
        kind = m.lastgroup or "op"
        text = m.group()
        i = m.end()
        if kind in ("space", "comment"):
            continue
        if kind == "str":
            out.append(("str", _awk_unescape(text[1:-1])))
        elif kind == "op":
            out.append((text, text))
        else:
            out.append((kind, text))
    return out


_AWK_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "/": "/", "a": "\a", "b": "\b",
                "f": "\f", "r": "\r", "v": "\v"}


def _awk_unescape(s: str) -> str:
    return re.sub(r"\\(.)", lambda m: _AWK_ESCAPES.get(m.group(1), "\\" + m.group(1)), s)


@lru_cache(maxsize=512)
def awk_effects(prog: str) -> tuple[list[tuple[str | None, bool]], list[str], bool]:
    """``(runs, writes, reads_environ)`` of an awk program: ``runs`` holds the shell commands
    it starts as ``(command, fed)`` (``command`` ``None``: computed at run time; ``fed``: the
    command reads what awk prints into it, ``print | CMD``), ``writes`` the literal files its
    ``print``/``printf`` redirections write, ``reads_environ`` whether it reads ``ENVIRON``."""
    toks = _awk_tokens(prog)
    runs: list[tuple[str | None, bool]] = []
    writes: list[str] = []
    environ = False
    in_print = False
    print_depth = 0
    depth = 0
    n = len(toks)
    for k, (kind, text) in enumerate(toks):
        if kind == "name":
            if text == "ENVIRON":
                environ = True
            elif text == "system" and k + 1 < n and toks[k + 1][0] == "(":
                if k + 3 < n and toks[k + 2][0] == "str" and toks[k + 3][0] == ")":
                    runs.append((toks[k + 2][1], False))
                else:
                    runs.append((None, False))
            elif text in ("print", "printf"):
                in_print = True
                print_depth = depth
        elif kind in ("(", "["):
            depth += 1
        elif kind in (")", "]"):
            depth -= 1
        elif kind in _STATEMENT_END:
            in_print = False
        elif kind in ("|", "|&"):
            if k + 1 < n and toks[k + 1] == ("name", "getline"):
                prev = toks[k - 1] if k > 0 else ("", "")
                before = toks[k - 2][0] if k > 1 else ""
                literal = prev[0] == "str" and before not in _OPERAND_END
                runs.append((prev[1] if literal else None, False))
            else:
                nxt = toks[k + 1] if k + 1 < n else ("", "")
                after = toks[k + 2][0] if k + 2 < n else ";"
                literal = nxt[0] == "str" and (after in _STATEMENT_END or after == ")")
                runs.append((nxt[1] if literal else None, True))
        elif kind in (">", ">>") and in_print and depth == print_depth:
            nxt = toks[k + 1] if k + 1 < n else ("", "")
            if nxt[0] == "str":
                writes.append(nxt[1])
    return runs, writes, environ
