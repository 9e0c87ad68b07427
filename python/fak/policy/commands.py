"""What particular commands do with their arguments, for the shell analyzer and the named checks.

Pure functions over one simple command's ``argv`` (a list of unquoted words) and ``dyn`` (a
parallel list of booleans: the word holds an expansion whose value is only known at run time).
Nothing here touches the file system.

- :func:`getopt` (:mod:`fak.policy.options`): GNU ``getopt_long`` argument splitting (clusters
  ``-rf``, ``--name=value``, unambiguous long-option prefixes, ``--``, option permutation), as in
  the GNU C library manual, "Parsing Long Options with getopt_long".
- :func:`unwrap`: command wrappers that run another command (``sudo``, ``env``, ``xargs``,
  ``timeout``, ``nohup``, ...), with the option grammars of their man pages (coreutils, findutils,
  sudo(8), util-linux su(1)/runuser(1)/flock(1)/script(1)/setsid(1)/taskset(1)/setarch(8)/
  prlimit(1)/chrt(1), procps watch(1), numactl(8), fakeroot(1), faketime(1), valgrind(1), ...).
- :func:`interpreter_program` (:mod:`fak.policy.interpreters`): where a shell, Python, Perl,
  Ruby, Node, PHP, Lua, awk, sed or make process takes its program from.
- :func:`parse_git`: git(1) global options before the sub-command, ``-c`` configuration and
  aliases (git-config(1) ``alias.*``; a value starting with ``!`` is a shell command).
- :func:`parse_find` (:mod:`fak.policy.findcmd`): find(1) starting points, actions and the
  name tests that guard them.
- :func:`parse_rm`, :func:`deleted_operands`, :func:`parse_pip`, :func:`parse_kill`: the operands
  of deleting, installing and signalling commands (what commands write is
  :mod:`fak.policy.writes`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# the grammars that live in their own modules, importable from here as before
from fak.policy.findcmd import FindCall, find_of, parse_find  # noqa: F401
from fak.policy.interpreters import (AWK_RE, SHELL_RE, STDIN_PATHS, awk_source,  # noqa: F401
                                     descriptor_path, interpreter_program, is_awk,
                                     is_interpreter, is_opaque_language, is_shell, sed_scripts)
from fak.policy.options import Opts, getopt  # noqa: F401
from fak.policy.options import names as _f

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

