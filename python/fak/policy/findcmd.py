"""find(1) (GNU findutils): starting points, actions (``-exec``, ``-execdir``, ``-ok``,
``-okdir``, ``-delete``, ``-fprint``), ``-L``/``-follow``, and which actions a positive name or
path test guards (:func:`parse_find`, :func:`find_of`). Pure functions over one command's
``argv``/``dyn``."""

from __future__ import annotations

import re
from dataclasses import dataclass, field



@dataclass
class FindCall:
    """A parsed find(1) command: ``starts`` (indices of the starting points), ``follow``
    (symlinks followed: ``-L``/``-follow``), ``delete`` (``-delete`` appears), ``execs``: each
    ``-exec``-family action as ``(action, first, end)`` (the command is ``argv[first:end]``),
    ``delete_guarded`` / ``exec_guarded`` (per action in ``execs``): a positive name or path
    test (``-name '*.pyc'``, ``-path './build/*'``) is evaluated before the action on every
    branch that reaches it, so the action cannot apply to every file; ``writes``: indices of
    the files ``-fprint``/``-fprint0``/``-fls``/``-fprintf`` write."""

    starts: list[int]
    follow: bool = False
    delete: bool = False
    execs: list[tuple[str, int, int]] = field(default_factory=list)
    delete_guarded: bool = True
    exec_guarded: list[bool] = field(default_factory=list)
    writes: list[int] = field(default_factory=list)


# primaries that take one argument (GNU findutils "find" manual, "Primary Index")
_FIND_ONE_ARG = frozenset({
    "-name", "-iname", "-path", "-ipath", "-wholename", "-iwholename", "-regex", "-iregex",
    "-lname", "-ilname", "-type", "-xtype", "-user", "-group", "-uid", "-gid", "-perm", "-size",
    "-mtime", "-mmin", "-atime", "-amin", "-ctime", "-cmin", "-newer", "-anewer", "-cnewer",
    "-inum", "-links", "-samefile", "-fstype", "-used", "-context", "-maxdepth", "-mindepth",
    "-printf", "-fprint", "-fprint0", "-fls", "-regextype", "-files0-from"})
# tests that select files by name: a positive one before an action keeps it off the rest
_FIND_NAME_TESTS = frozenset({"-name", "-iname", "-path", "-ipath", "-wholename", "-iwholename",
                              "-regex", "-iregex", "-lname", "-ilname"})
_FIND_EVERYTHING = re.compile(r"[*?./]*|\.\*|\.\*\.\*")


def parse_find(argv: list[str], dyn: list[bool]) -> FindCall:
    """Split ``find [-H|-L|-P] [-D x] [-Ox] [start...] [expression]`` (GNU findutils) and read
    its expression: ``( )``, ``!``/``-not``, ``-a``/``-and`` (implied), ``-o``/``-or`` and
    ``,``, in find's precedence, to tell which actions a name test guards."""
    i = 1
    n = len(argv)
    follow = False
    while i < n and not dyn[i] and argv[i] in ("-H", "-L", "-P", "-D") or (
            i < n and argv[i].startswith("-O") and len(argv[i]) > 2):
        if argv[i] == "-L":
            follow = True
        i += 2 if argv[i] == "-D" else 1
    starts = []
    while i < n and (dyn[i] or not (argv[i].startswith("-") or argv[i] in ("(", "!", ")", ","))):
        starts.append(i)
        i += 1
    call = FindCall(starts=starts, follow=follow)
    # tokens: ("op", text) or ("prim", name, first_arg_index, word_index)
    tokens: list[tuple] = []
    while i < n:
        a = argv[i]
        if a in ("-exec", "-execdir", "-ok", "-okdir"):
            j = i + 1
            while j < n and argv[j] not in (";", "+"):
                j += 1
            # `{} +` ends only after `{}`; `+` elsewhere is an argument, but find requires it last
            call.execs.append((a, i + 1, j))
            tokens.append(("prim", a, i + 1, i))
            i = j + 1
            continue
        if a in ("(", ")", "!", "-not", "-a", "-and", "-o", "-or", ","):
            tokens.append(("op", a))
            i += 1
            continue
        if a == "-delete":
            call.delete = True
        elif a == "-follow":
            call.follow = True
        elif a in ("-fprint", "-fprint0", "-fls", "-fprintf") and i + 1 < n:
            call.writes.append(i + 1)
        width = 2 if a in _FIND_ONE_ARG else 3 if a == "-fprintf" else 1
        tokens.append(("prim", a, i + 1 if width > 1 else -1, i))
        i += width
    tree, _ = _find_or(tokens, 0)
    guards: dict[int, bool] = {}
    _find_guards(tree, False, argv, dyn, guards)
    call.delete_guarded = all(guards.get(t[3], False) for t in tokens
                              if t[0] == "prim" and t[1] == "-delete")
    call.exec_guarded = [guards.get(first - 1, False) for _, first, _ in call.execs]
    return call


def find_of(cmd) -> FindCall:
    """:func:`parse_find` of a :class:`~fak.policy.shell.SimpleCommand`, computed once per
    command (kept in ``cmd.cache``)."""
    cache = cmd.cache
    if cache is None:
        cache = cmd.cache = {}
    call = cache.get("find")
    if call is None:
        call = cache["find"] = parse_find(cmd.argv, cmd.dyn)
    return call


def _find_or(tokens: list[tuple], k: int) -> tuple[tuple, int]:
    alts = []
    node, k = _find_and(tokens, k)
    alts.append(node)
    while k < len(tokens) and tokens[k][0] == "op" and tokens[k][1] in ("-o", "-or", ","):
        node, k = _find_and(tokens, k + 1)
        alts.append(node)
    return ("or", alts), k


def _find_and(tokens: list[tuple], k: int) -> tuple[tuple, int]:
    items = []
    while k < len(tokens):
        t = tokens[k]
        if t[0] == "op" and t[1] in ("-o", "-or", ",", ")"):
            break
        if t[0] == "op" and t[1] in ("-a", "-and"):
            k += 1
            continue
        node, k = _find_unary(tokens, k)
        items.append(node)
    return ("and", items), k


def _find_unary(tokens: list[tuple], k: int) -> tuple[tuple, int]:
    t = tokens[k]
    if t[0] == "op" and t[1] in ("!", "-not"):
        if k + 1 >= len(tokens):
            return ("not", ("and", [])), k + 1
        node, k = _find_unary(tokens, k + 1)
        return ("not", node), k
    if t[0] == "op" and t[1] == "(":
        node, k = _find_or(tokens, k + 1)
        if k < len(tokens) and tokens[k] == ("op", ")"):
            k += 1
        return node, k
    return t, k + 1


def _find_restricts(node: tuple, argv: list[str], dyn: list[bool]) -> bool:
    kind = node[0]
    if kind == "prim":
        idx = node[2]
        return (node[1] in _FIND_NAME_TESTS and 0 <= idx < len(argv) and not dyn[idx]
                and _FIND_EVERYTHING.fullmatch(argv[idx]) is None)
    if kind == "and":
        return any(_find_restricts(x, argv, dyn) for x in node[1])
    if kind == "or":
        return bool(node[1]) and all(_find_restricts(x, argv, dyn) for x in node[1])
    return False


def _find_guards(node: tuple, guarded: bool, argv: list[str], dyn: list[bool],
                 out: dict[int, bool]) -> None:
    kind = node[0]
    if kind == "prim":
        out[node[3]] = guarded
    elif kind == "and":
        g = guarded
        for item in node[1]:
            _find_guards(item, g, argv, dyn, out)
            g = g or _find_restricts(item, argv, dyn)
    elif kind == "or":
        for item in node[1]:
            _find_guards(item, guarded, argv, dyn, out)
    else:  # not: an action under ! is evaluated only where the inner test is false
        _find_guards(node[1], guarded, argv, dyn, out)
