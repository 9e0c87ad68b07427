"""GNU ``getopt_long`` argument splitting for the command grammars of the policy (GNU C library
manual, "Parsing Long Options with getopt_long"): :func:`getopt`."""

from __future__ import annotations

Opts = list[tuple[str, "str | None", int]]


def getopt(args: list[str], dyn: list[bool], start: int = 1, *, short_arg: str = "",
           short_opt: str = "", long_arg: frozenset[str] = frozenset(),
           long_names: tuple[str, ...] = (), permute: bool = True,
           plus: bool = False) -> tuple[Opts, list[int]]:
    """Split ``args[start:]`` into options and operands like GNU ``getopt_long``.

    Returns ``(opts, operands)``: ``opts`` is a list of ``(name, value, index)`` with ``name``
    spelled ``-r`` or ``--recursive`` (a long prefix is resolved against ``long_names`` when
    unambiguous), ``value`` the option argument or ``None`` and ``index`` the word that carries
    the value (``-1`` when there is none); ``operands`` holds indices into ``args``.

    ``short_arg``: short options that take an argument (rest of the cluster or the next word);
    ``short_opt``: short options with an optional argument attached in the same cluster (``-i{}``);
    ``long_arg``: long options that take an argument (``--name=v`` or ``--name v``; others accept
    only ``--name=v``); ``permute``: options may follow operands (GNU) instead of ending at the
    first operand (POSIX, and every command that runs another command); ``plus``: ``+x`` clusters
    are options too (shells). ``--`` ends options; a lone ``-`` is an operand. A dynamic word is
    always an operand: callers decide what an unknown word may stand for.
    """
    opts: Opts = []
    operands: list[int] = []
    i = start
    n = len(args)
    while i < n:
        a = args[i]
        if dyn[i] or len(a) < 2 or (a[0] != "-" and not (plus and a[0] == "+")):
            operands.append(i)
            i += 1
            if not permute:
                operands.extend(range(i, n))
                break
            continue
        if a == "--":
            operands.extend(range(i + 1, n))
            break
        if a.startswith("--"):
            name, eq, value = a[2:].partition("=")
            if long_names and name not in long_names:
                hits = [ln for ln in long_names if ln.startswith(name)]
                if len(hits) == 1:
                    name = hits[0]
            if eq:
                opts.append(("--" + name, value, i))
            elif name in long_arg and i + 1 < n:
                opts.append(("--" + name, args[i + 1], i + 1))
                i += 1
            else:
                opts.append(("--" + name, None, -1))
            i += 1
            continue
        # a short-option cluster
        prefix = a[0]
        j = 1
        while j < len(a):
            c = a[j]
            if c in short_arg:
                if j + 1 < len(a):
                    opts.append((prefix + c, a[j + 1:], i))
                elif i + 1 < n:
                    opts.append((prefix + c, args[i + 1], i + 1))
                    i += 1
                else:
                    opts.append((prefix + c, None, -1))
                break
            if c in short_opt:
                opts.append((prefix + c, a[j + 1:] or None, i if a[j + 1:] else -1))
                break
            opts.append((prefix + c, None, -1))
            j += 1
        i += 1
    return opts, operands


def names(*names: str) -> frozenset[str]:
    """``frozenset(names)``: option name sets, spelled briefly."""
    return frozenset(names)
