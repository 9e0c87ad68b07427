"""Checks on processes: ``other_processes`` (signalling or changing processes the command did
not start) and ``fork_bomb`` (a shell function that starts itself in the background or a
pipeline)."""

from __future__ import annotations

import re

from fak.policy import commands as _cmds
from fak.policy.checks.base import short
from fak.policy.shell import Analysis

_NEGATIVE = re.compile(r"-[0-9]+")
_BY_NAME = re.compile(r"pgrep|pidof|\bps\b|pkill|killall")
# commands that signal processes by name, user or terminal: other processes of the user
_NAME_KILLERS = frozenset({"killall", "killall5", "pkill", "skill", "snice", "slay"})
# options of these commands that point them at an existing process instead of a new command
_PID_OPTIONS = {"prlimit": ("-p", "--pid"), "chrt": ("-p", "--pid"), "taskset": ("-p", "--pid"),
                "ionice": ("-p", "-P", "-u", "--pid", "--pgid", "--uid"),
                "renice": ("-p", "-g", "-u", "--pid", "--pgrp", "--user")}


def other_processes(a: Analysis, root: str | None, extra: tuple[str, ...]) -> str | None:
    """``kill`` of every process (``-1``), of a process group (a negative operand, literal or
    computed), or of processes found by name (``kill $(pgrep x)``); ``killall``, ``killall5``,
    ``pkill``, ``skill``; and ``prlimit``/``chrt``/``taskset``/``ionice``/``renice`` pointed
    at an existing process. ``kill %1``, ``kill $!`` and ``kill PID`` are fine."""
    for c in a.commands:
        name = c.name
        if not c.argv or c.dyn[0]:
            continue
        if name in _NAME_KILLERS:
            return f"{short(c.line)}: signals processes by name or user"
        if name == "kill":
            ops = _cmds.parse_kill(c.argv, c.dyn)
            for i in ops or ():
                word = c.argv[i]
                if not c.dyn[i] and _NEGATIVE.fullmatch(word):
                    what = "every process" if word == "-1" else "a process group"
                    return f"{short(c.line)}: signals {what}"
                if c.dyn[i] and (word.startswith("-") or _BY_NAME.search(word)):
                    return f"{short(c.line)}: signals processes chosen at run time ({word})"
        elif name in _PID_OPTIONS:
            opts = _PID_OPTIONS[name]
            if any(w in opts or any(w.startswith(o + "=") for o in opts if o.startswith("--"))
                   for w in c.argv[1:]):
                return f"{short(c.line)}: changes another process"
    return None


def fork_bomb(a: Analysis, root: str | None, extra: tuple[str, ...]) -> str | None:
    """A shell function that calls itself in the background or in a pipeline (``:(){ :|:&
    };:``, ``f(){ f & f & }``): every call starts at least two more processes."""
    for c in a.commands:
        if c.func is not None and c.argv and c.name == c.func and not c.dyn[0] \
                and (c.concurrent or c.stdin == "pipe"):
            return f"function `{short(c.func, 40)}` starts itself in the background or a pipeline"
    return None
