"""Named semantic checks over an analyzed shell command (the ``"check"`` rules of a policy).

Each check reads the simple commands :func:`fak.policy.shell.analyze` found and returns ``None``
(nothing found) or a short description of the offending command, which the verdict's reason
quotes. Checks fail closed: a word whose value is only known at run time counts as the worst case
(``rm $x`` may be ``rm -rf /``), and so does a relative path when the directory is unknown.

===========================  ==================================================================
check                        matches
===========================  ==================================================================
``rm_recursive_force``       ``rm`` with both a recursive (``-r``, ``-R``, ``--recursive``) and a
                             force (``-f``, ``--force``) flag, in any spelling or order
                             (``-rf``, ``-fr``, ``-r -f``, ``--recursive --force``, ``--rec``)
``rm_outside_workspace``     ``rm``/``unlink``/``shred``/``rmdir`` of a path not strictly inside
                             the workspace (``/``, ``~``, ``..``, absolute paths elsewhere,
                             symlinks out, the workspace root itself, globs whose matches leave
                             it), ``find -delete`` from a starting point outside it, and
                             deletions whose operands are only known at run time (``xargs rm``)
``write_outside_workspace``  output redirections (``>``, ``>>``, ``&>``, ``>|``, ``<>``) and the
                             destinations of ``tee``, ``cp``, ``mv`` (sources too), ``install``,
                             ``ln``, ``touch``, ``mkdir``, ``truncate``, ``dd of=``, ``sed -i``,
                             ``chmod``/``chown``/``chgrp``, ``rsync`` outside the workspace
                             (``/dev/null``, ``/dev/stdout``, ``/dev/stderr`` are always fine)
``pipe_to_interpreter``      a shell or interpreter (python, perl, ruby, node, php, lua) that
                             reads its program from a pipe or a process substitution
                             (``curl … | sh``, ``base64 -d | bash``, ``bash <(curl …)``,
                             ``source <(…)``, ``xargs bash``)
``git_push``                 ``git push``/``git send-pack`` behind any global options
                             (``-C``, ``-c``, ``--git-dir=…``), aliases (``-c alias.p=push``),
                             or a sub-command computed at run time
``dynamic_command``          a command whose name or program is only known at run time:
                             ``$cmd``, ``$(…)`` or a glob as the command name, ``eval "$x"``,
                             ``bash -c "$x"``, ``source "$f"``, ``find -exec {}``, ``xargs sh -c``
``pip_install_remote``       ``pip``/``python -m pip``/``uv pip`` ``install``/``download`` of
                             anything but local paths (PyPI names, URLs, ``git+`` specs,
                             ``-r`` files, ``--index-url``/``--find-links``)
===========================  ==================================================================

Checks that take paths (``uses_paths``) accept ``extra_roots``: absolute directories treated like
the workspace (``/tmp`` for scratch files, say).
"""

from __future__ import annotations

import glob as _glob
import os
from collections.abc import Callable
from dataclasses import dataclass

from fak.policy import commands as _cmds
from fak.policy.paths import HARMLESS_WRITE_TARGETS, resolve, within
from fak.policy.shell import GLOB, Analysis, SimpleCommand

MAX_GLOB_MATCHES = 1000

CheckFn = Callable[[Analysis, "str | None", "tuple[str, ...]"], "str | None"]


@dataclass(frozen=True)
class Check:
    """A named check: ``fn(analysis, workspace_root_real | None, extra_roots_real)`` returns
    ``None`` or what it found; ``uses_paths``: it resolves paths (accepts ``extra_roots``)."""

    name: str
    fn: CheckFn
    description: str
    uses_paths: bool


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def rm_recursive_force(a: Analysis, root: str | None, extra: tuple[str, ...]) -> str | None:
    """``rm`` with recursive and force flags (a dynamic word may be either)."""
    for c in a.commands:
        if c.name == "rm":
            r, f, _, unknown = _cmds.parse_rm(c.argv, c.dyn)
            unknown = unknown or c.unknown_operands
            if (r or unknown) and (f or unknown):
                return _short(c.line)
    return None


def _path_problem(c: SimpleCommand, word: str, dyn: bool, globbed: bool, root: str | None,
                  extra: tuple[str, ...], strict: bool) -> str | None:
    """Why ``word`` (an operand of ``c``) is not inside the workspace or an extra root, or
    ``None`` when it is, for every directory ``c`` may run in."""
    if dyn:
        return f"`{_short(word, 80)}` is only known at run time"
    for cwd in c.cwds:
        real = resolve(word, cwd, root)
        if real is None:
            if root is None and not word.startswith(("/", "~")):
                return f"`{_short(word, 80)}` is relative and no workspace root is known"
            return f"`{_short(word, 80)}` cannot be resolved"
        if not _contained(real, root, extra, strict):
            return _outside_message(word, real, root, strict)
        if globbed:
            base = resolve(".", cwd, root) or "/"
            pattern = word if word.startswith("/") else os.path.join(base, word)
            for k, match in enumerate(_glob.iglob(os.path.expanduser(pattern))):
                if k >= MAX_GLOB_MATCHES:
                    return f"`{_short(word, 80)}` matches more than {MAX_GLOB_MATCHES} paths"
                mreal = os.path.realpath(match)
                if not _contained(mreal, root, extra, strict):
                    return _outside_message(match, mreal, root, strict)
    return None


def _contained(real: str, root: str | None, extra: tuple[str, ...], strict: bool) -> bool:
    if root is not None and within(real, root, strict):
        return True
    return any(within(real, e, strict) for e in extra)


def _outside_message(word: str, real: str, root: str | None, strict: bool) -> str:
    if root is None:
        return f"`{_short(word, 80)}` resolves to {_short(real, 80)} and no workspace root is known"
    if strict and real == root:
        return f"`{_short(word, 80)}` is the workspace root itself"
    return f"`{_short(word, 80)}` resolves to {_short(real, 80)}, outside the workspace"


def rm_outside_workspace(a: Analysis, root: str | None, extra: tuple[str, ...]) -> str | None:
    """Deletions (``rm``, ``unlink``, ``shred``, ``rmdir``, ``find -delete``) outside the
    workspace, of the workspace root itself, or of paths only known at run time."""
    for c in a.commands:
        name = c.name
        if name in _cmds.DELETERS:
            if c.unknown_operands:
                return f"{_short(c.line)}: operands come from data read at run time"
            for i in _cmds.deleted_operands(name, c.argv, c.dyn):
                word = c.argv[i]
                if c.find_roots is not None and "{}" in word:
                    for start in c.find_roots:
                        why = _path_problem(c, start, False, False, root, extra, False)
                        if why:
                            return f"{_short(c.line)}: find starting point {why}"
                    continue
                why = _path_problem(c, word, c.dyn[i], bool(c.flags[i] & GLOB), root, extra,
                                    True)
                if why:
                    return f"{_short(c.line)}: {why}"
        elif name == "find":
            call = _cmds.parse_find(c.argv, c.dyn)
            if call.delete and call.follow:
                return f"{_short(c.line)}: -delete while following symlinks (-L) may leave the workspace"
            if call.delete:
                for i in call.starts or []:
                    why = _path_problem(c, c.argv[i], c.dyn[i], False, root, extra, False)
                    if why:
                        return f"{_short(c.line)}: {why}"
                if not call.starts:
                    why = _path_problem(c, ".", False, False, root, extra, False)
                    if why:
                        return f"{_short(c.line)}: {why}"
    return None


def write_outside_workspace(a: Analysis, root: str | None, extra: tuple[str, ...]) -> str | None:
    """Files written outside the workspace by redirections or writing commands."""
    for c in a.commands:
        for r in c.redirects:
            if r.writes and not r.procsub and r.target not in HARMLESS_WRITE_TARGETS:
                why = _path_problem(c, r.target, r.dynamic, False, root, extra, False)
                if why:
                    return f"{_short(c.line or 'redirection')} {r.op}{_short(r.target, 60)}: {why}"
        name = c.name
        if name in _cmds.WRITERS:
            if name == "ln":
                why = _link_targets(c, root, extra)
                if why:
                    return why
            ops = _cmds.written_operands(name, c.argv, c.dyn)
            if ops and c.unknown_operands and name != "tee":
                return f"{_short(c.line)}: operands come from data read at run time"
            for i in ops:
                word = _cmds.dd_target(c.argv[i])
                if word in HARMLESS_WRITE_TARGETS:
                    continue
                if c.find_roots is not None and "{}" in word:
                    continue
                why = _path_problem(c, word, c.dyn[i], bool(c.flags[i] & GLOB), root, extra,
                                    False)
                if why:
                    return f"{_short(c.line)}: {why}"
    return None


def _link_targets(c: SimpleCommand, root: str | None, extra: tuple[str, ...]) -> str | None:
    """``ln``: a link whose target resolves outside the workspace is a way out of it (a later
    ``rm -rf link/`` in the same command would follow it before this check could see it)."""
    opts, ops = _cmds.getopt(c.argv, c.dyn, 1, short_arg="tS",
                             long_arg=frozenset({"target-directory", "suffix"}))
    has_target_dir = any(o[0] in ("-t", "--target-directory") for o in opts)
    targets = ops if has_target_dir else ops[:-1] if len(ops) >= 2 else ops
    symbolic = any(o[0] in ("-s", "--symbolic") for o in opts)
    dest = ops[-1] if len(ops) >= 2 and not has_target_dir else None
    for i in targets:
        word = c.argv[i]
        why = _path_problem(c, word, c.dyn[i], False, root, extra, False)
        if why is None and symbolic and dest is not None and not word.startswith(("/", "~")):
            # a relative symlink target is resolved from the link's own folder
            base = os.path.dirname(c.argv[dest].rstrip("/")) or "."
            why = _path_problem(c, os.path.join(base, word), c.dyn[i] or c.dyn[dest], False,
                                root, extra, False)
        if why:
            return f"{_short(c.line)}: link target {why}"
    return None


def pipe_to_interpreter(a: Analysis, root: str | None, extra: tuple[str, ...]) -> str | None:
    """An interpreter whose program arrives through a pipe or a process substitution."""
    for c in a.commands:
        prog = c.program
        if prog == "procsub":
            return _short(c.line)
        if prog == "stdin" and c.stdin in ("pipe", "procsub"):
            return f"{_short(c.line)} reads its program from a pipe"
        if prog == "dynamic" and c.unknown_operands:
            return f"{_short(c.line)} runs a program named by data from a pipe"
    return None


_PUSH_SUBCOMMANDS = frozenset({"push", "send-pack"})


def git_push(a: Analysis, root: str | None, extra: tuple[str, ...]) -> str | None:
    """``git push`` in any spelling (global options, aliases, run-time sub-command)."""
    for c in a.commands:
        if c.name != "git":
            continue
        call = _cmds.parse_git(c.argv, c.dyn)
        sub = call.sub
        if sub is None:
            continue
        if c.dyn[sub]:
            return f"{_short(c.line)}: the git sub-command is only known at run time"
        word = c.argv[sub]
        if word in _PUSH_SUBCOMMANDS or (word == "subtree" and "push" in c.argv[sub + 1:]):
            return _short(c.line)
        if call.aliases.get(word.lower(), "") is None:
            return f"{_short(c.line)}: the git alias is only known at run time"
    return None


def dynamic_command(a: Analysis, root: str | None, extra: tuple[str, ...]) -> str | None:
    """A command whose name or program is only known at run time."""
    for c in a.commands:
        if c.note is not None:
            return f"{_short(c.line)}: {c.note}"
    return None


def _python_module(c: SimpleCommand) -> tuple[str, int] | None:
    idx = c.program_index
    if idx is None:
        return None
    word = c.argv[idx]
    if word.startswith("-"):
        word = word[word.index("m") + 1:]
    return word, idx + 1


def pip_install_remote(a: Analysis, root: str | None, extra: tuple[str, ...]) -> str | None:
    """``pip install``/``download`` of anything that is not a local path."""
    for c in a.commands:
        name = c.name
        argv, dyn = c.argv, c.dyn
        start = None
        if name == "pip" or (name.startswith("pip") and name[3:].replace(".", "").isdigit()):
            start = 1
        elif name == "uv" and len(argv) > 1 and argv[1] == "pip":
            start = 2
        elif c.program == "module":
            mod = _python_module(c)
            if mod is not None and mod[0] == "pip":
                start = mod[1]
        if start is None or start >= len(argv):
            continue
        # skip pip's global options before the sub-command
        while start < len(argv) and argv[start].startswith("-") and not dyn[start]:
            start += 1
        if start >= len(argv):
            continue
        if dyn[start]:
            return f"{_short(c.line)}: the pip sub-command is only known at run time"
        if argv[start] not in ("install", "download", "wheel"):
            continue
        found = _cmds.parse_pip(argv, dyn, start + 1)
        if found is not None:
            what, why = found
            return f"{_short(c.line)}: `{_short(what, 60)}` {why}"
    return None


CHECKS: dict[str, Check] = {c.name: c for c in (
    Check("rm_recursive_force", rm_recursive_force,
          "rm with both recursive and force flags, in any spelling", False),
    Check("rm_outside_workspace", rm_outside_workspace,
          "deleting paths outside the workspace (or the workspace root itself)", True),
    Check("write_outside_workspace", write_outside_workspace,
          "writing files outside the workspace (redirections, cp/mv/tee/...)", True),
    Check("pipe_to_interpreter", pipe_to_interpreter,
          "a shell or interpreter reading its program from a pipe", False),
    Check("git_push", git_push, "git push behind any options or aliases", False),
    Check("dynamic_command", dynamic_command,
          "a command whose name or program is only known at run time", False),
    Check("pip_install_remote", pip_install_remote,
          "pip install of anything but local paths", False),
)}
