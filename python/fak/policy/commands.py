"""What particular commands do with their arguments, for the shell analyzer and the named checks.

Pure functions over one simple command's ``argv`` (a list of unquoted words) and ``dyn`` (a
parallel list of booleans: the word holds an expansion whose value is only known at run time).
Nothing here touches the file system.

- :func:`getopt`: GNU ``getopt_long`` argument splitting (clusters ``-rf``, ``--name=value``,
  unambiguous long-option prefixes, ``--``, option permutation), as in the GNU C library manual,
  "Parsing Long Options with getopt_long".
- :func:`unwrap`: command wrappers that run another command (``sudo``, ``env``, ``xargs``,
  ``timeout``, ``nohup``, ...), with the option grammars of their man pages (coreutils, findutils,
  sudo(8), util-linux su(1)/runuser(1)/flock(1)/script(1)/setsid(1)/taskset(1), procps watch(1)).
- :func:`interpreter_program`: where a shell (bash(1) "Invocation"), Python (python(1)), Perl,
  Ruby, Node, PHP or Lua process takes its program from.
- :func:`parse_git`: git(1) global options before the sub-command, ``-c`` configuration and
  aliases (git-config(1) ``alias.*``; a value starting with ``!`` is a shell command).
- :func:`parse_find`: find(1) starting points and actions (``-exec``, ``-execdir``, ``-ok``,
  ``-okdir``, ``-delete``, ``-L``/``-follow``).
- :func:`parse_rm`, :func:`deleted_operands`, :func:`written_operands`, :func:`parse_pip`: the file
  operands of deleting, writing and installing commands.
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
}


@dataclass
class Unwrapped:
    """The command a wrapper runs.

    ``start``: index in ``argv`` where the inner command begins (``None``: none given, use
    ``default``); ``programs``: indices of words that are shell programs (``su -c``);
    ``split``: indices of words that are split into words and prepended to the command
    (``env -S``); ``chdirs``: indices of directory words the inner command runs in
    (``env -C``); ``unknown_operands``: the wrapper appends operands at run time (``xargs``);
    ``replace``: the ``xargs -I`` replacement string (words holding it are unknown at run time);
    ``dynamic``: an unknown word stood where the wrapper's grammar needed a known one.
    """

    start: int | None
    default: tuple[str, ...] = ()
    programs: list[int] = field(default_factory=list)
    split: list[int] = field(default_factory=list)
    chdirs: list[int] = field(default_factory=list)
    unknown_operands: bool = False
    replace: str | None = None
    join_program: bool = False
    repeats: bool = False
    dynamic: bool = False


def unwrap(name: str, argv: list[str], dyn: list[bool]) -> Unwrapped | None:
    """The inner command of the wrapper ``name`` (``argv[0]``'s basename), or ``None`` when
    ``name`` is not a wrapper this module knows or no command follows (``sudo -l``)."""
    if name == "busybox":
        return Unwrapped(start=1) if len(argv) > 1 else None
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
    # name: (options whose value is the program, options taking another argument)
    "perl": ("eE", "IMmlxC0dD"),
    "ruby": ("e", "IrCEFK"),
    "node": ("ep", "r"),
    "nodejs": ("ep", "r"),
    "php": ("r", "cdfz"),
    "lua": ("e", "l"),
    "luajit": ("e", "lbj"),
}
STDIN_PATHS = frozenset({"-", "/dev/stdin", "/dev/fd/0", "/proc/self/fd/0"})


def is_shell(name: str) -> bool:
    """True for shell interpreters (sh, bash, dash, zsh, ksh, ..., with a version suffix)."""
    return SHELL_RE.match(name) is not None


_INTERPRETER_RE = re.compile(
    r"(?:sh|bash|dash|zsh|ksh|mksh|ash|yash|posh|fish|csh|tcsh|rbash|ksh93)(?:[0-9.]+)?\Z"
    r"|(?:python|pypy)(?:[0-9.]*)(?:-dbg|m)?\Z"
    r"|(?:perl|ruby|node|nodejs|php|lua|luajit)(?:[0-9.]+)?\Z")


def is_interpreter(name: str) -> bool:
    """True for interpreters that can read a program from standard input."""
    return _INTERPRETER_RE.match(name) is not None


def interpreter_program(name: str, argv: list[str], dyn: list[bool]) -> tuple[str, int | None]:
    """Where the interpreter ``name`` takes its program from: ``("string", i)`` (``-c``/``-e``
    word ``i``), ``("file", i)`` (script operand ``i``), ``("stdin", None)`` (no program given,
    ``-s``, ``-`` or ``/dev/stdin``), ``("module", i)`` (``python -m``) or ``("none", None)``.
    A dynamic script operand is ``("file", i)``; the caller sees ``dyn[i]``."""
    if SHELL_RE.match(name):
        opts, operands = getopt(argv, dyn, 1, short_arg="oO", long_arg=_f("rcfile", "init-file"),
                                permute=False, plus=True)
        flags = "".join(o[0][1:] for o in opts if not o[0].startswith("--"))
        if "c" in flags:
            return ("string", operands[0]) if operands else ("none", None)
        if "s" in flags or not operands:
            return "stdin", None
        i = operands[0]
        return ("stdin", None) if argv[i] in STDIN_PATHS else ("file", i)
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
        return ("stdin", None) if argv[i] in STDIN_PATHS else ("file", i)
    spec = _OTHER_INTERPRETERS.get(name.rstrip("0123456789."))
    if spec is None:
        return "none", None
    prog, with_arg = spec
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
        c = a[1:2]
        if c in prog:
            if a[2:]:
                return "string", i
            return ("string", i + 1) if i + 1 < len(argv) else ("none", None)
        if c in with_arg and not a[2:]:
            i += 1
        i += 1
    if i >= len(argv):
        return "stdin", None
    return ("stdin", None) if argv[i] in STDIN_PATHS else ("file", i)


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
    """A parsed find(1) command: starting points (indices), whether symlinks are followed,
    whether ``-delete`` appears, and each ``-exec``-family action as ``(action, first, end)``
    (the command is ``argv[first:end]``)."""

    starts: list[int]
    follow: bool = False
    delete: bool = False
    execs: list[tuple[str, int, int]] = field(default_factory=list)


def parse_find(argv: list[str], dyn: list[bool]) -> FindCall:
    """Split ``find [-H|-L|-P] [-D x] [-Ox] [start...] [expression]`` (GNU findutils)."""
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
    while i < n:
        a = argv[i]
        if a in ("-exec", "-execdir", "-ok", "-okdir"):
            j = i + 1
            while j < n and argv[j] not in (";", "+"):
                j += 1
            # `{} +` ends only after `{}`; `+` elsewhere is an argument, but find requires it last
            call.execs.append((a, i + 1, j))
            i = j + 1
            continue
        if a == "-delete":
            call.delete = True
        elif a == "-follow":
            call.follow = True
        i += 1
    return call


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


WRITERS = frozenset({"tee", "cp", "mv", "install", "ln", "touch", "mkdir", "truncate", "dd", "sed",
                     "chmod", "chown", "chgrp", "rsync", "tar", "unzip", "git"})


def written_operands(name: str, argv: list[str], dyn: list[bool]) -> list[int]:
    """Indices of the paths a writing command writes or replaces (coreutils ``tee``, ``cp``,
    ``mv`` (sources too: they disappear), ``install``, ``ln``, ``touch``, ``mkdir``,
    ``truncate``, ``dd of=``, ``sed -i``, ``chmod``/``chown``/``chgrp``, the extraction
    directory of ``tar -C``/``unzip -d``, and the repository/work tree of ``git -C``/
    ``--git-dir``/``--work-tree``, which git may write)."""
    if name == "tar":
        return [i + 1 if argv[i] in ("-C", "--directory") else i
                for i in range(1, len(argv))
                if (argv[i] in ("-C", "--directory") and i + 1 < len(argv))
                or argv[i].startswith("--directory=")]
    if name == "unzip":
        return [i + 1 if argv[i] == "-d" else i for i in range(1, len(argv))
                if (argv[i] == "-d" and i + 1 < len(argv)) or (argv[i].startswith("-d")
                                                                and len(argv[i]) > 2)]
    if name == "git":
        out = []
        for i in range(1, len(argv)):
            a = argv[i]
            if not a.startswith("-") or dyn[i]:
                break
            if a in ("-C", "--git-dir", "--work-tree") and i + 1 < len(argv):
                out.append(i + 1)
            elif a.startswith(("--git-dir=", "--work-tree=")):
                out.append(i)
        return out
    if name == "tee":
        return getopt(argv, dyn, 1, long_arg=frozenset())[1]
    if name in ("cp", "mv", "install", "ln", "rsync"):
        opts, ops = getopt(argv, dyn, 1, short_arg="tSmogB" if name == "install" else "tS",
                           long_arg=_f("target-directory", "suffix", "mode", "owner", "group",
                                       "backup"))
        target = [o for o in opts if o[0] in ("-t", "--target-directory")]
        directory_mode = name == "install" and any(o[0] in ("-d", "--directory") for o in opts)
        if directory_mode:
            return ops
        if target:
            idx = target[-1][2]
            dests = [idx] if idx >= 0 else []
            return ops + dests if name == "mv" else dests
        if name == "mv":
            return ops
        if name == "ln" and len(ops) == 1:
            return []   # the link is created in the current directory, under the target's name
        return ops[-1:] if len(ops) >= 2 else []
    if name in ("touch", "mkdir"):
        return getopt(argv, dyn, 1, short_arg="dtrm" if name == "touch" else "m",
                      long_arg=_f("date", "reference", "mode", "time"))[1]
    if name == "truncate":
        return getopt(argv, dyn, 1, short_arg="sr", long_arg=_f("size", "reference"))[1]
    if name == "dd":
        return [i for i in range(1, len(argv)) if argv[i].startswith("of=") or dyn[i]]
    if name == "sed":
        if not any(a.startswith("-") and not a.startswith("--") and "i" in a
                   or a.startswith("--in-place") for a in argv[1:]):
            return []
        opts, ops = getopt(argv, dyn, 1, short_arg="efl", short_opt="i",
                           long_arg=_f("expression", "file", "line-length"))
        if not any(o[0] in ("-i", "--in-place") for o in opts):
            return []
        has_script = any(o[0] in ("-e", "-f", "--expression", "--file") for o in opts)
        return ops if has_script else ops[1:]
    if name in ("chmod", "chown", "chgrp"):
        opts, ops = getopt(argv, dyn, 1, long_arg=frozenset())
        if any(o[0] == "--reference" for o in opts):
            return ops
        return ops[1:]
    return []


def dd_target(word: str) -> str:
    """The path in an operand like ``of=PATH`` (dd), ``--directory=PATH`` (tar), ``-dPATH``
    (unzip) or ``--git-dir=PATH`` (git)."""
    for prefix in ("of=", "--directory=", "--git-dir=", "--work-tree="):
        if word.startswith(prefix):
            return word[len(prefix):]
    if word.startswith("-d") and len(word) > 2:
        return word[2:]
    return word


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
