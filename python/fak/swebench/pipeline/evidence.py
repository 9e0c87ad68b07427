"""What one run of the ``test`` stage is evidence of: an environment error, or a result about the
code (a reproduction script kept or not, a test file's statuses).

Environment errors (issue 31). A run says something about the code only if the program it was
asked to run started. ``could_not_start`` calls a run an *environment error* when it ended by
itself (not killed) with a non-zero status and one of these holds:

1. its exit status is 126 (found, not executable) or 127 (not found): what bash and the
   ``unshare`` sandbox's init (``fak.sandbox._nsinit``) return for a command they could not run
   (``bash: line 1: python: command not found``);
2. its exit status is 125 and its output has a ``fak-sandbox: `` line: the sandbox's own set-up
   failed (``fak.sandbox.launch``, ``_nsinit``);
3. the first non-empty line of its output is one that only what runs *before* the program prints:

   - ``bwrap: ...``: bubblewrap's own error, printed before it execs the command (exit 1:
     ``bwrap: execvp python: No such file or directory`` when the interpreter on ``PATH`` is
     hidden from the sandbox, a bind that failed);
   - ``INTERPRETER: No module named MOD``: ``python -m MOD`` found no module ``MOD`` — the
     harness itself missing (``python -m pytest`` with no pytest; exit 1);
   - ``INTERPRETER: can't open file 'PATH': [Errno N] ...``: the interpreter could not read the
     script it was given (exit 2).

   (``INTERPRETER`` is a path ending in ``python``, ``python3``, ``python3.11``, ...)

Everything else is evidence, whatever the exception: an ``ImportError`` or a
``ModuleNotFoundError`` raised by code — the project's, a candidate's, the script's — prints a
traceback ending ``ModuleNotFoundError: No module named 'MOD'`` (quoted, after the program
started), never one of the lines above. A broken dependency of the harness (pytest installed
without pluggy) is such a traceback too: it is read as a failure, not an environment error (a
script failing so is not kept — ``UNFIXABLE`` — and a test file's run gives no passing tests).

An environment error is never kept as a reproduction, never a regression base, and a
candidate's run that is one is no result for that candidate (not "not fixed", not "broke these
tests"); each is recorded (``env_error``) and counted in the instance's summary. Nothing gains
from one: a candidate whose runs could not start ranks as one whose runs did not happen, after
every candidate whose runs did.
"""

from __future__ import annotations

import re
from typing import Any

from fak.swebench.pipeline.execute import RunResult

#: failures of a reproduction script that no change to the repository can fix: the script is
#: not kept
UNFIXABLE = ("SyntaxError", "IndentationError", "TabError", "ModuleNotFoundError", "ImportError")
#: errors that are the script's own bug when its own frame raised them (the last frame of the
#: traceback is the script file): no change to the repository can fix them
SCRIPT_BUGS = ("NameError", "UnboundLocalError")
#: exit statuses of a command that could not be run (not executable, not found)
EXEC_FAILED = (126, 127)
#: the exit status of a sandbox whose set-up failed (with a ``fak-sandbox: `` line)
SANDBOX_SETUP_FAILED = 125
_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+')
_EXC = re.compile(r"^(?:[\w.]+\.)?([A-Z]\w*(?:Error|Exception|Exit|Failure|Warning))\b")
_INTERPRETER = r"(?:\S*/)?python[\w.]*"
#: first lines that only what runs before the program prints (rule 3 of the module docstring)
_NOT_STARTED = (
    (re.compile(r"^bwrap: "), "the sandbox could not start the command"),
    (re.compile(rf"^{_INTERPRETER}: No module named (\S+)$"), "the harness module is missing"),
    (re.compile(rf"^{_INTERPRETER}: can't open file '.*': \[Errno \d+\]"),
     "the interpreter could not open the script"),
)


def _first_line(text: str) -> str:
    for ln in text.splitlines():
        if ln.strip():
            return ln.strip()
    return ""


def could_not_start(res: RunResult) -> str | None:
    """Why run ``res`` is an environment error (one line), or ``None`` when it is evidence about
    the code; the rule is the module docstring's."""
    if res.killed or res.returncode in (0, None):
        return None
    first = _first_line(res.output)
    shown = first[:200] or "no output"
    if res.returncode in EXEC_FAILED:
        return f"could not start (exit {res.returncode}): {shown}"
    if res.returncode == SANDBOX_SETUP_FAILED:
        setup = next((ln.strip() for ln in res.output.splitlines()
                      if ln.startswith("fak-sandbox: ")), None)
        if setup is not None:
            return f"the sandbox could not be set up: {setup[:200]}"
    for pattern, why in _NOT_STARTED:
        if pattern.match(first):
            return f"{why}: {shown}"
    return None


def failure_kind(output: str) -> str | None:
    """The exception class of the last traceback line of ``output`` (``AssertionError``, ...)."""
    kind = None
    for ln in output.splitlines():
        m = _EXC.match(ln.strip())
        if m:
            kind = m.group(1)
    return kind


def raised_in(output: str) -> str | None:
    """The file of the last traceback frame in ``output`` (where the error was raised)."""
    last = None
    for ln in output.splitlines():
        m = _FRAME.match(ln)
        if m:
            last = m.group(1)
    return last


def tail(text: str, n: int = 1500) -> str:
    """The last ``n`` characters of ``text`` (a record's ``output_tail``)."""
    return text[-n:]


def script_record(sid: str, res: RunResult) -> dict[str, Any]:
    """The ``script_base`` record of script ``sid``'s run on the original code: ``kept`` when it
    fails there with an error a source change can fix, and ``why`` (``environment error: ...``,
    ``timeout``, ``passes on the original code``, ``fails with KIND``, ``fails with KIND in its
    own code``); ``env_error``: the reason when the run could not start, else ``None``."""
    kind = failure_kind(res.output) if res.returncode not in (0, None) else None
    env_error = could_not_start(res)
    if env_error is not None:
        why, keep = f"environment error: {env_error}", False
    elif res.killed:
        why, keep = "timeout", False
    elif res.returncode == 0:
        why, keep = "passes on the original code", False
    elif kind in UNFIXABLE:
        why, keep = f"fails with {kind}", False
    elif kind in SCRIPT_BUGS and (raised_in(res.output) or "").endswith(f"repro_{sid}.py"):
        why, keep = f"fails with {kind} in its own code", False
    else:
        why, keep = f"fails with {kind or f'exit status {res.returncode}'}", True
    return {"kind": "script_base", "script": sid, "returncode": res.returncode,
            "killed": res.killed, "kept": keep, "why": why, "env_error": env_error,
            "seconds": round(res.duration_s, 3), "output_tail": tail(res.output)}
