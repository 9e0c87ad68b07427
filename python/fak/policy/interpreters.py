"""Where an interpreter takes its program from: a shell (bash(1) "Invocation"), Python (python(1)),
Perl, Ruby, Node, PHP, Lua, awk (POSIX, gawk(1)), sed (GNU) or make (GNU);
:func:`interpreter_program`, :func:`descriptor_path` (paths that read an open descriptor:
``/dev/stdin``, ``/proc/self/fd/0``, ``/dev/fd/3``), :func:`sed_scripts` and :func:`awk_source`
(the program texts). Pure functions over one command's ``argv``/``dyn``."""

from __future__ import annotations

import re

from fak.policy.options import getopt
from fak.policy.options import names as _f


SHELL_RE = re.compile(r"(?:sh|bash|dash|zsh|ksh|mksh|ash|yash|posh|fish|csh|tcsh|rbash|ksh93)"
                      r"(?:[0-9.]+)?\Z")
_PYTHON_RE = re.compile(r"(?:python|pypy)(?:[0-9.]*)(?:-dbg|m)?\Z")
_OTHER_INTERPRETERS = {
    # name: (options whose value is the program, options taking an argument (the rest of the
    # cluster or the next word), options taking optional digits in the cluster)
    "perl": ("eE", "IMmxCdD", "l0"),
    "ruby": ("e", "IrCEFK", "0"),
    "node": ("ep", "r", ""),
    "nodejs": ("ep", "r", ""),
    "php": ("r", "cdfz", ""),
    "lua": ("e", "l", ""),
    "luajit": ("e", "lbj", ""),
}
STDIN_PATHS = frozenset({"-", "/dev/stdin", "/dev/fd/0", "/proc/self/fd/0",
                         "/proc/thread-self/fd/0"})
# a path that names an open file descriptor: /dev/fd/N, /dev/stdin, /proc/<pid>/fd/N,
# /proc/<pid>/task/<tid>/fd/N (<pid> may be self, thread-self or a run-time $$)
_FD_PATH = re.compile(r"/dev/(?:stdin|fd/([0-9]+))|/proc/+[^/]+/+(?:task/+[^/]+/+)?fd/+([0-9]+)"
                      r"|/proc/+thread-self/+fd/+([0-9]+)")
AWK_RE = re.compile(r"(?:g|m|n|busybox-|original-)?awk\Z")
_SED_RE = re.compile(r"g?sed\Z")
_MAKE_RE = re.compile(r"(?:g|b|p)?make\Z")


def descriptor_path(word: str) -> int | None:
    """The file descriptor a path names when a program opens it (``-`` and ``/dev/stdin``:
    0; ``/dev/fd/3``, ``/proc/self/fd/3``, ``/proc/$$/fd/3``: 3), or ``None`` for other
    paths. Such a path reads whatever the descriptor holds: a pipe, a here-document, a
    process substitution (proc(5), "/proc/pid/fd")."""
    if word == "-" or word == "/dev/stdin":
        return 0
    m = _FD_PATH.fullmatch(word)
    if m is None:
        return None
    digits = m.group(1) or m.group(2) or m.group(3)
    return int(digits) if digits else 0


def is_shell(name: str) -> bool:
    """True for shell interpreters (sh, bash, dash, zsh, ksh, ..., with a version suffix)."""
    return SHELL_RE.match(name) is not None


_INTERPRETER_RE = re.compile(
    r"(?:sh|bash|dash|zsh|ksh|mksh|ash|yash|posh|fish|csh|tcsh|rbash|ksh93)(?:[0-9.]+)?\Z"
    r"|(?:python|pypy)(?:[0-9.]*)(?:-dbg|m)?\Z"
    r"|(?:perl|ruby|node|nodejs|php|lua|luajit)(?:[0-9.]+)?\Z"
    r"|(?:g|m|n|busybox-|original-)?awk\Z|g?sed\Z|(?:g|b|p)?make\Z")
# languages whose inline programs (-c, -e, here-documents) the policy cannot read
_INLINE_RE = re.compile(r"(?:python|pypy)(?:[0-9.]*)(?:-dbg|m)?\Z"
                        r"|(?:perl|ruby|node|nodejs|php|lua|luajit)(?:[0-9.]+)?\Z"
                        r"|(?:g|b|p)?make\Z")


def is_interpreter(name: str) -> bool:
    """True for programs that run a program of their own language: shells, Python, Perl,
    Ruby, Node, PHP, Lua, awk, sed and make."""
    return _INTERPRETER_RE.match(name) is not None


def is_opaque_language(name: str) -> bool:
    """True for interpreters whose programs the policy does not read (Python, Perl, Ruby, Node,
    PHP, Lua, make); shells, awk and sed programs are analyzed instead."""
    return _INLINE_RE.match(name) is not None


def is_awk(name: str) -> bool:
    """True for awk, gawk, mawk, nawk."""
    return AWK_RE.match(name) is not None


def _from_path(argv: list[str], i: int) -> tuple[str, int | None]:
    fd = descriptor_path(argv[i])
    if fd is None:
        return "file", i
    return ("stdin", None) if fd == 0 else ("descriptor", i)


def interpreter_program(name: str, argv: list[str], dyn: list[bool]) -> tuple[str, int | None]:
    """Where the interpreter ``name`` takes its program from: ``("string", i)`` (``-c``/``-e``
    word ``i``, an awk or sed program operand, ``make --eval``), ``("file", i)`` (script operand
    ``i``; ``i`` is ``None`` for make's default makefile), ``("stdin", None)`` (no program
    given, ``-s``, or a path naming descriptor 0: ``-``, ``/dev/stdin``, ``/proc/self/fd/0``),
    ``("descriptor", i)`` (a path naming another descriptor: ``/dev/fd/3``), ``("module", i)``
    (``python -m``) or ``("none", None)``. A dynamic script operand is ``("file", i)``; the
    caller sees ``dyn[i]``."""
    if AWK_RE.match(name):
        return _awk_program(argv, dyn)
    if _SED_RE.match(name):
        return _sed_program(argv, dyn)
    if _MAKE_RE.match(name):
        return _make_program(argv, dyn)
    if SHELL_RE.match(name):
        opts, operands = getopt(argv, dyn, 1, short_arg="oO", long_arg=_f("rcfile", "init-file"),
                                permute=False, plus=True)
        flags = "".join(o[0][1:] for o in opts if not o[0].startswith("--"))
        if "c" in flags:
            return ("string", operands[0]) if operands else ("none", None)
        if "s" in flags or not operands:
            return "stdin", None
        return _from_path(argv, operands[0])
    if _PYTHON_RE.match(name):
        i = 1
        while i < len(argv):
            a = argv[i]
            if dyn[i] or not a.startswith("-") or a == "-":
                break
            if a == "--":
                i += 1
                break
            body = a[1:]
            if a.startswith("--"):
                i += 2 if a == "--check-hash-based-pycs" else 1
                continue
            for j, c in enumerate(body):
                if c in "cm":
                    val = body[j + 1:]
                    kind = "string" if c == "c" else "module"
                    if val:
                        return kind, i
                    return (kind, i + 1) if i + 1 < len(argv) else ("none", None)
                if c in "WX":
                    if not body[j + 1:]:
                        i += 1
                    break
            i += 1
        if i >= len(argv):
            return "stdin", None
        return _from_path(argv, i)
    spec = _OTHER_INTERPRETERS.get(name.rstrip("0123456789."))
    if spec is None:
        return "none", None
    prog, with_arg, with_digits = spec
    i = 1
    while i < len(argv):
        a = argv[i]
        if dyn[i] or not a.startswith("-") or a == "-":
            break
        if a == "--":
            i += 1
            break
        if a in ("--eval", "--print"):
            return ("string", i + 1) if i + 1 < len(argv) else ("none", None)
        took_next = False
        j = 1
        while j < len(a):
            c = a[j]
            if c in prog:
                if a[j + 1:]:
                    return "string", i
                return ("string", i + 1) if i + 1 < len(argv) else ("none", None)
            if c in with_arg:
                took_next = not a[j + 1:]
                break
            j += 1
            if c in with_digits:
                while j < len(a) and a[j] in "0123456789abcdefABCDEFx":
                    j += 1
        i += 2 if took_next else 1
    if i >= len(argv):
        return "stdin", None
    return _from_path(argv, i)


def _awk_program(argv: list[str], dyn: list[bool]) -> tuple[str, int | None]:
    # POSIX awk: -F fs, -v assignment, -f progfile; gawk: -e/--source program, -i/-l libraries,
    # -E/--exec progfile, and many flags
    opts, operands = getopt(argv, dyn, 1, short_arg="FvfeilEW", short_opt="dDoOp",
                            long_arg=_f("field-separator", "assign", "file", "source", "include",
                                        "load", "exec"), permute=False)
    for oname, value, idx in opts:
        if oname in ("-f", "--file", "-E", "--exec") and idx >= 0:
            return _from_path(argv, idx)
        if oname in ("-e", "--source") and idx >= 0:
            return "string", idx
    if not operands:
        return "none", None
    return "string", operands[0]


def _sed_program(argv: list[str], dyn: list[bool]) -> tuple[str, int | None]:
    opts, operands = getopt(argv, dyn, 1, short_arg="efl", short_opt="i",
                            long_arg=_f("expression", "file", "line-length"))
    for oname, value, idx in opts:
        if oname in ("-f", "--file") and idx >= 0:
            kind, i = _from_path(argv, idx)
            if kind != "file":
                return kind, i
    for oname, value, idx in opts:
        if oname in ("-e", "--expression") and idx >= 0:
            return "string", idx
    if any(o[0] in ("-f", "--file") for o in opts):
        return "file", None
    if not operands:
        return "none", None
    return "string", operands[0]


def _make_program(argv: list[str], dyn: list[bool]) -> tuple[str, int | None]:
    opts, _ = getopt(argv, dyn, 1, short_arg="CfIjloWE",
                     long_arg=_f("directory", "file", "makefile", "include-dir", "jobs",
                                 "load-average", "old-file", "assume-old", "what-if", "new-file",
                                 "assume-new", "eval"))
    for oname, value, idx in opts:
        if oname in ("-E", "--eval") and idx >= 0:
            return "string", idx
    for oname, value, idx in opts:
        if oname in ("-f", "--file", "--makefile") and idx >= 0:
            kind, i = _from_path(argv, idx)
            if kind != "file":
                return kind, i
    return "file", None


def sed_scripts(argv: list[str], dyn: list[bool]) -> list[tuple[str, bool]]:
    """The sed script texts of a sed command line: every ``-e``/``--expression`` value, or the
    first operand when there is none; ``[(text, dynamic)]``. ``--sandbox`` (GNU: ``e``, ``r``,
    ``w`` refused) gives ``[]``."""
    opts, operands = getopt(argv, dyn, 1, short_arg="efl", short_opt="i",
                            long_arg=_f("expression", "file", "line-length"),
                            long_names=("sandbox", "separate", "silent", "quiet", "expression",
                                        "file", "in-place", "line-length", "null-data",
                                        "zero-terminated", "regexp-extended", "posix",
                                        "debug", "follow-symlinks", "unbuffered", "help",
                                        "version"))
    if any(o[0] == "--sandbox" for o in opts):
        return []
    scripts = [(argv[idx], dyn[idx]) for oname, _, idx in opts
               if oname in ("-e", "--expression") and idx >= 0]
    if not scripts and not any(o[0] in ("-f", "--file") for o in opts) and operands:
        scripts = [(argv[operands[0]], dyn[operands[0]])]
    return scripts


def awk_source(argv: list[str], dyn: list[bool]) -> tuple[str, bool] | None:
    """The awk program text given on the command line (an operand, or gawk ``-e``), as
    ``(text, dynamic)``; ``None`` when it comes from a file or there is none."""
    kind, idx = _awk_program(argv, dyn)
    if kind != "string" or idx is None:
        return None
    return argv[idx], dyn[idx]
