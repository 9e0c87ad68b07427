"""What particular commands do with their arguments, for the shell analyzer and the named checks.

Pure functions over one simple command's ``argv`` (a list of unquoted words) and ``dyn`` (a
parallel list of booleans: the word holds an expansion whose value is only known at run time).
Nothing here touches the file system.

- :func:`getopt`: GNU ``getopt_long`` argument splitting (clusters ``-rf``, ``--name=value``,
  unambiguous long-option prefixes, ``--``, option permutation), as in the GNU C library manual,
  "Parsing Long Options with getopt_long".
- :func:`unwrap`: command wrappers that run another command (``sudo``, ``env``, ``xargs``,
  ``timeout``, ``nohup``, ...), with the option grammars of their man pages (coreutils, findutils,
  sudo(8), util-linux su(1)/runuser(1)/flock(1)/script(1)/setsid(1)/taskset(1)/setarch(8)/
  prlimit(1)/chrt(1), procps watch(1), numactl(8), fakeroot(1), faketime(1), valgrind(1), ...).
- :func:`interpreter_program`: where a shell (bash(1) "Invocation"), Python (python(1)), Perl,
  Ruby, Node, PHP, Lua, awk (POSIX, gawk(1)), sed (GNU) or make (GNU) process takes its program
  from; :func:`descriptor_path`: paths that read an open descriptor (``/dev/stdin``,
  ``/proc/self/fd/0``, ``/dev/fd/3``).
- :func:`parse_git`: git(1) global options before the sub-command, ``-c`` configuration and
  aliases (git-config(1) ``alias.*``; a value starting with ``!`` is a shell command).
- :func:`parse_find`: find(1) starting points and actions (``-exec``, ``-execdir``, ``-ok``,
  ``-okdir``, ``-delete``, ``-L``/``-follow``).
- :func:`parse_rm`, :func:`deleted_operands`, :func:`parse_pip`, :func:`parse_kill`: the operands
  of deleting, installing and signalling commands (what commands write is
  :mod:`fak.policy.writes`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

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


# ---------------------------------------------------------------------------------------------
# Wrappers: commands that run another command


@dataclass(frozen=True)
class _Wrapper:
    short_arg: str = ""
    short_opt: str = ""
    long_arg: frozenset[str] = frozenset()
    fixed: int = 0                      # operands before the command (timeout DURATION, chroot DIR)
    default: tuple[str, ...] = ()       # command run when none is given (sudo -s → a shell)
    program_opts: frozenset[str] = frozenset()   # options whose value is a shell program (su -c)
    split_opts: frozenset[str] = frozenset()     # options whose value is split into words (env -S)
    chdir_opts: frozenset[str] = frozenset()     # options that change the directory (env -C)
    no_command_opts: frozenset[str] = frozenset()  # options that mean "no command follows"
    shell_opts: frozenset[str] = frozenset()     # options that run the command through a shell
    unknown_operands: bool = False      # operands appended at run time (xargs)
    skip_assignments: bool = False      # NAME=VALUE operands before the command (env)
    join_program: bool = False          # the command words are joined and run by sh -c (watch)
    repeats: bool = False               # the command runs repeatedly (watch)


def _f(*names: str) -> frozenset[str]:
    return frozenset(names)


_SUDO = _Wrapper(
    short_arg="CDghpRrtTuU",
    long_arg=_f("close-from", "chdir", "group", "host", "prompt", "chroot", "role", "type",
                "command-timeout", "user", "other-user"),
    default=("sh",), chdir_opts=_f("-D", "--chdir"), shell_opts=_f("-s", "--shell"),
    no_command_opts=_f("-e", "--edit", "-l", "--list", "-v", "--validate", "-k", "-K",
                       "--reset-timestamp", "--remove-timestamp", "-V", "--version", "-h"))

WRAPPERS: dict[str, _Wrapper] = {
    "sudo": _SUDO,
    "doas": _Wrapper(short_arg="aCu", default=("sh",), no_command_opts=_f("-C", "-L")),
    "pkexec": _Wrapper(long_arg=_f("user"), default=("sh",)),
    "env": _Wrapper(short_arg="uCS", long_arg=_f("unset", "chdir", "split-string"),
                    split_opts=_f("-S", "--split-string"), chdir_opts=_f("-C", "--chdir"),
                    skip_assignments=True),
    "command": _Wrapper(),
    "builtin": _Wrapper(),
    "exec": _Wrapper(short_arg="a"),
    "nohup": _Wrapper(),
    "setsid": _Wrapper(),
    "unbuffer": _Wrapper(),
    "chronic": _Wrapper(),
    "eatmydata": _Wrapper(),
    "nocache": _Wrapper(),
    "catchsegv": _Wrapper(),
    "time": _Wrapper(short_arg="fo", long_arg=_f("format", "output")),
    "nice": _Wrapper(short_arg="n", long_arg=_f("adjustment")),
    "ionice": _Wrapper(short_arg="cn", long_arg=_f("class", "classdata"),
                       no_command_opts=_f("-p", "-P", "-u", "--pid", "--pgid", "--uid")),
    "timeout": _Wrapper(short_arg="sk", long_arg=_f("signal", "kill-after"), fixed=1),
    "stdbuf": _Wrapper(short_arg="ioe", long_arg=_f("input", "output", "error")),
    "chroot": _Wrapper(long_arg=_f("userspec", "groups"), fixed=1, default=("sh",)),
    "taskset": _Wrapper(long_arg=_f("cpu-list"), fixed=1, no_command_opts=_f("-p", "--pid")),
    "xargs": _Wrapper(short_arg="adEILnPs", short_opt="eil",
                      long_arg=_f("arg-file", "delimiter", "eof", "replace", "max-lines",
                                  "max-args", "max-procs", "max-chars", "process-slot-var"),
                      default=("echo",), unknown_operands=True),
    "strace": _Wrapper(short_arg="abeEIoOpPsSuUX", long_arg=_f("output", "expr", "user")),
    "ltrace": _Wrapper(short_arg="aAbDeEFlnoOpsSu", long_arg=_f("output")),
    "watch": _Wrapper(short_arg="n", short_opt="d", long_arg=_f("interval"),
                      join_program=True, repeats=True),
    "su": _Wrapper(short_arg="cCgGsw", long_arg=_f("command", "session-command", "group",
                                                   "supp-group", "shell", "whitelist-environment"),
                   program_opts=_f("-c", "--command", "-C", "--session-command"),
                   default=("sh",)),
    "runuser": _Wrapper(short_arg="cgGsuw", long_arg=_f("command", "session-command", "group",
                                                        "supp-group", "shell", "user")),
    "script": _Wrapper(short_arg="cEIoOBT", long_arg=_f("command", "echo", "log-in", "log-out",
                                                        "log-io", "log-timing", "output-limit"),
                       program_opts=_f("-c", "--command")),
    # util-linux prlimit(1): every limit takes an optional value attached (-n100, --nofile=100);
    # --pid changes another process and runs nothing
    "prlimit": _Wrapper(short_opt="cdefilmnqrstuvxy", no_command_opts=_f("-p", "--pid")),
    # util-linux chrt(1): chrt [options] PRIORITY COMMAND; -p works on an existing process
    "chrt": _Wrapper(short_arg="TPD", long_arg=_f("sched-runtime", "sched-period",
                                                  "sched-deadline"),
                     fixed=1, no_command_opts=_f("-p", "--pid", "-m", "--max")),
    "numactl": _Wrapper(short_arg="CNmpiP", long_arg=_f(
        "physcpubind", "cpunodebind", "membind", "preferred", "interleave", "preferred-many"),
        no_command_opts=_f("-s", "--show", "-H", "--hardware")),
    "fakeroot": _Wrapper(short_arg="lsib", long_arg=_f("lib", "faked", "unknown-is-real")),
    "fakechroot": _Wrapper(short_arg="lsce", long_arg=_f("lib", "config-dir", "environment")),
    "faketime": _Wrapper(short_arg="mfp", fixed=1),
    "valgrind": _Wrapper(),
    "dbus-run-session": _Wrapper(long_arg=_f("config-file", "dbus-daemon")),
    "xvfb-run": _Wrapper(short_arg="efnpsw", long_arg=_f(
        "error-file", "auth-file", "server-num", "xauth-protocol", "server-args", "wait")),
    "ifne": _Wrapper(),
    "rlwrap": _Wrapper(short_arg="aAbcCDeEfFgHiIlmMnNoOpPqrRsStTUvwWz"),
    "linux32": _Wrapper(), "linux64": _Wrapper(), "i386": _Wrapper(), "x86_64": _Wrapper(),
    "i686": _Wrapper(), "uname26": _Wrapper(), "aarch64": _Wrapper(), "arm64": _Wrapper(),
}
# setarch(8): `setarch [ARCH] [options] [PROGRAM [ARGS]]`; without a program it runs a shell
_SETARCH = _Wrapper(short_arg="", default=("sh",))


@dataclass
class Unwrapped:
    """The command a wrapper runs.

    ``start``: index in ``argv`` where the inner command begins (``None``: none given, use
    ``default``); ``programs``: indices of words that are shell programs (``su -c``);
    ``split``: indices of words that are split into words and prepended to the command
    (``env -S``); ``chdirs``: indices of directory words the inner command runs in
    (``env -C``); ``unknown_operands``: the wrapper appends operands at run time (``xargs``);
    ``replace``: the ``xargs -I`` replacement string (words holding it are unknown at run time);
    ``dynamic``: an unknown word stood where the wrapper's grammar needed a known one;
    ``values``: for an index in ``programs``/``split``/``chdirs`` whose value is attached to
    its option (``-S'cmd'``, ``--chdir=DIR``), the value alone.
    """

    start: int | None
    default: tuple[str, ...] = ()
    programs: list[int] = field(default_factory=list)
    split: list[int] = field(default_factory=list)
    chdirs: list[int] = field(default_factory=list)
    values: dict[int, str] = field(default_factory=dict)
    unknown_operands: bool = False
    replace: str | None = None
    join_program: bool = False
    repeats: bool = False
    dynamic: bool = False


def unwrap(name: str, argv: list[str], dyn: list[bool]) -> Unwrapped | None:
    """The inner command of the wrapper ``name`` (``argv[0]``'s basename), or ``None`` when
    ``name`` is not a wrapper this module knows or no command follows (``sudo -l``)."""
    if name == "busybox" or name == "toybox":
        return Unwrapped(start=1) if len(argv) > 1 else None
    if name == "setarch":
        first = 2 if len(argv) > 1 and (dyn[1] or not argv[1].startswith("-")) else 1
        _, operands = getopt(argv, dyn, first, permute=False)
        return Unwrapped(start=operands[0] if operands else None, default=_SETARCH.default)
    if name == "flock":
        return _unwrap_flock(argv, dyn)
    if name == "sg":
        # sg GROUP [-c] COMMAND: the command is a string run by /bin/sh -c.
        ops = [i for i in range(2, len(argv)) if argv[i] != "-c"]
        if not ops:
            return None
        return Unwrapped(start=None, programs=ops[:1], dynamic=dyn[ops[0]])
    spec = WRAPPERS.get(name)
    if spec is None:
        return None
    su_like = name == "su" or (name == "runuser" and not any(
        a == "-u" or a.startswith("--user") for a in argv[1:]))
    if name == "runuser" and su_like:
        spec = WRAPPERS["su"]
    opts, operands = getopt(argv, dyn, 1, short_arg=spec.short_arg, short_opt=spec.short_opt,
                            long_arg=spec.long_arg, permute=su_like or name == "script")
    out = Unwrapped(start=None, default=spec.default, unknown_operands=spec.unknown_operands,
                    join_program=spec.join_program, repeats=spec.repeats)
    for oname, value, idx in opts:
        if oname in spec.no_command_opts:
            return None
        if oname in ("-i", "-I", "--replace") and name == "xargs":
            out.replace = value or "{}"
        if value is None or idx < 0:
            continue
        if value != argv[idx]:
            out.values[idx] = value
        if oname in spec.program_opts:
            out.programs.append(idx)
        elif oname in spec.split_opts:
            out.split.append(idx)
        elif oname in spec.chdir_opts:
            out.chdirs.append(idx)
        else:
            continue
        if dyn[idx]:
            out.dynamic = True
    if su_like:
        if out.programs:
            return out
        # su [-] [user [args]]: the operands are a user and arguments for the user's shell.
        rest = [i for i in operands if argv[i] != "-"]
        out.default = ("sh", *[argv[i] for i in rest[1:]])
        return out
    if out.programs:
        return out
    skipped = 0
    for i in operands:
        if spec.skip_assignments and skipped == 0 and not dyn[i] and "=" in argv[i] \
                and not argv[i].startswith("="):
            continue
        if skipped < spec.fixed:
            skipped += 1
            continue
        out.start = i
        break
    if out.start is None:
        if spec.fixed and skipped < spec.fixed:
            return None
        if not out.default and not out.split:
            return None
    elif any(o[0] in spec.shell_opts for o in opts):
        # sudo -s CMD: the command and its arguments are run by the user's shell with -c
        out.programs = [out.start]
        out.join_program = True
    return out


def _unwrap_flock(argv: list[str], dyn: list[bool]) -> Unwrapped | None:
    _, operands = getopt(argv, dyn, 1, short_arg="wE", long_arg=_f("timeout", "conflict-exit-code"),
                         permute=False)
    if len(operands) < 2:
        return None
    nxt = operands[1]
    if argv[nxt] in ("-c", "--command") and len(operands) > 2:
        return Unwrapped(start=None, programs=[operands[2]])
    return Unwrapped(start=nxt)


_TAR_COMMAND_OPTS = ("--to-command", "--use-compress-program", "--rsh-command", "--info-script",
                     "--new-volume-script", "-I", "-F")


def tar_programs(argv: list[str], dyn: list[bool]) -> list[tuple[str, bool]]:
    """Shell commands GNU tar runs from its options (``--to-command=CMD``,
    ``--checkpoint-action=exec=CMD``, ``--use-compress-program``/``-I``, ``--rsh-command``,
    ``--info-script``/``-F``, ``--new-volume-script``): ``[(command, dynamic)]``."""
    out: list[tuple[str, bool]] = []
    for i in range(1, len(argv)):
        a = argv[i]
        if a.startswith("--checkpoint-action="):
            action = a.split("=", 1)[1]
            if action.startswith("exec="):
                out.append((action[5:], dyn[i]))
            continue
        for opt in _TAR_COMMAND_OPTS:
            if a == opt and i + 1 < len(argv):
                out.append((argv[i + 1], dyn[i + 1]))
            elif opt.startswith("--") and a.startswith(opt + "="):
                out.append((a[len(opt) + 1:], dyn[i]))
    return out


# ---------------------------------------------------------------------------------------------
# Interpreters

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


# ---------------------------------------------------------------------------------------------
# git

_GIT_ARG_OPTS = _f("-C", "-c", "--git-dir", "--work-tree", "--namespace", "--super-prefix",
                   "--config-env", "--exec-path", "--list-cmds", "--attr-source")
# configuration keys whose value git runs as a shell command (git-config(1))
GIT_COMMAND_KEYS = re.compile(
    r"(?:core\.(?:pager|editor|sshcommand|fsmonitor|askpass)|sequence\.editor|diff\.external"
    r"|pager\.[^.]+|gpg(?:\.[^.]+)?\.program|credential(?:\..+)?\.helper"
    r"|filter\.[^.]+\.(?:clean|smudge|process)|diff\.[^.]+\.(?:textconv|command)"
    r"|merge\.[^.]+\.driver|interactive\.difffilter|uploadpack\.packobjectshook"
    r"|remote\.[^.]+\.(?:receivepack|uploadpack)|protocol\..*)\Z", re.IGNORECASE)


@dataclass
class GitCall:
    """A parsed git invocation: ``sub`` is the index of the sub-command word (``None`` if
    absent); ``config`` holds ``(key, value, dynamic)`` from ``-c``/``--config-env``;
    ``aliases`` maps alias names to their (possibly dynamic: ``None``) values."""

    sub: int | None
    config: list[tuple[str, str, bool]] = field(default_factory=list)
    aliases: dict[str, str | None] = field(default_factory=dict)


def parse_git(argv: list[str], dyn: list[bool]) -> GitCall:
    """Split ``git [global options] <command> [args]`` (git(1) "OPTIONS")."""
    call = GitCall(sub=None)
    i = 1
    n = len(argv)
    while i < n:
        a = argv[i]
        if dyn[i]:
            call.sub = i
            return call
        if not a.startswith("-"):
            call.sub = i
            return call
        if a == "--":
            i += 1
            continue
        name, eq, value = a.partition("=")
        vdyn = False
        if name in _GIT_ARG_OPTS and not eq:
            if name in ("--exec-path", "--list-cmds"):
                i += 1
                continue
            if i + 1 >= n:
                return call
            value = argv[i + 1]
            vdyn = dyn[i + 1]
            i += 1
        elif name.startswith("-c") and len(name) > 2 and not name.startswith("--"):
            value = a[2:]
            name = "-c"
        if name == "-c":
            key, _, val = value.partition("=")
            call.config.append((key, val, vdyn))
            if key.lower().startswith("alias."):
                call.aliases[key[6:].lower()] = None if vdyn else val
        elif name == "--config-env":
            key = value.partition("=")[0]
            call.config.append((key, "", True))
            if key.lower().startswith("alias."):
                call.aliases[key[6:].lower()] = None
        i += 1
    return call


# ---------------------------------------------------------------------------------------------
# find


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


# ---------------------------------------------------------------------------------------------
# deleting, writing and installing commands

_RM_LONG = ("force", "interactive", "one-file-system", "no-preserve-root", "preserve-root",
            "recursive", "dir", "verbose", "help", "version")


def parse_rm(argv: list[str], dyn: list[bool]) -> tuple[bool, bool, list[int], bool]:
    """``rm`` options (GNU coreutils): ``(recursive, force, operands, unknown)``; ``unknown``
    when a dynamic word could be an option."""
    opts, operands = getopt(argv, dyn, 1, long_names=_RM_LONG)
    recursive = force = False
    for name, _, _ in opts:
        if name in ("-r", "-R", "--recursive"):
            recursive = True
        elif name in ("-f", "--force"):
            force = True
    unknown = any(dyn[i] for i in operands)
    return recursive, force, operands, unknown


DELETERS = frozenset({"rm", "unlink", "shred", "rmdir"})


def deleted_operands(name: str, argv: list[str], dyn: list[bool]) -> list[int]:
    """Indices of the paths ``rm``/``unlink``/``shred``/``rmdir`` delete or destroy."""
    if name == "rm":
        return parse_rm(argv, dyn)[2]
    if name == "shred":
        return getopt(argv, dyn, 1, short_arg="ns", long_arg=_f("iterations", "size",
                                                                 "random-source"))[1]
    if name == "rmdir":
        return getopt(argv, dyn, 1)[1]
    if name == "unlink":
        return getopt(argv, dyn, 1)[1]
    return []


_PIP_REMOTE_OPTS = _f("-i", "--index-url", "--extra-index-url", "-f", "--find-links",
                      "--trusted-host", "-r", "--requirement", "-c", "--constraint", "--proxy")
_LOCAL_REQ = re.compile(r"(?:\.{1,2}|\.{0,2}/[^\s\[]*|[^\s/:@\[]+\.(?:whl|tar\.gz|zip))"
                        r"(?:\[[A-Za-z0-9_,.\- ]*\])?\Z")


def parse_pip(argv: list[str], dyn: list[bool], start: int) -> tuple[str, str] | None:
    """For ``pip install|download`` whose arguments begin at ``start`` (after the sub-command),
    ``(what, why)`` when it would fetch from the network: a requirement that is not a local path
    or archive (a PyPI name, a URL, a ``git+`` spec) or an index/requirements option; ``None``
    when everything it installs is local (``pip install -e .``)."""
    opts, ops = getopt(argv, dyn, start, short_arg="ifrcCe",
                       long_arg=_f("index-url", "extra-index-url", "find-links", "trusted-host",
                                   "requirement", "constraint", "proxy", "config-settings",
                                   "root-user-action", "target", "prefix", "root", "src",
                                   "editable"))
    for name, value, idx in opts:
        if name in _PIP_REMOTE_OPTS:
            return name, "fetches from an index, a URL or a requirements file"
        if name in ("-e", "--editable"):
            if value is None or (idx >= 0 and dyn[idx]):
                return name, "requirement computed at run time"
            if not _LOCAL_REQ.match(value):
                return value, "not a local path"
    for i in ops:
        if dyn[i]:
            return argv[i], "requirement computed at run time"
        if not _LOCAL_REQ.match(argv[i]):
            return argv[i], "not a local path"
    return None


def parse_kill(argv: list[str], dyn: list[bool]) -> list[int] | None:
    """The process operands of ``kill`` (bash builtin and util-linux kill(1)): indices after
    the signal (``-9``, ``-KILL``, ``-s SIG``, ``-n NUM``, ``--signal SIG``) and ``--``;
    ``None`` when it sends nothing (``-l``, ``-L``, ``--list``, ``--table``)."""
    i = 1
    n = len(argv)
    if i < n and not dyn[i]:
        a = argv[i]
        if a in ("-l", "-L", "--list", "--table") or a.startswith("--list="):
            return None
        if a in ("-s", "-n", "--signal", "-q", "--queue") and i + 1 < n:
            i += 2
        elif a.startswith("--signal=") or (a.startswith("-") and a != "--"):
            i += 1
    if i < n and argv[i] == "--" and not dyn[i]:
        i += 1
    return list(range(i, n))

