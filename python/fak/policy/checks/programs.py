"""Checks on what programs run: ``pipe_to_interpreter``, ``git_push``, ``dynamic_command``,
``inline_code``, ``pip_install_remote``."""

from __future__ import annotations

from fak.policy import commands as _cmds
from fak.policy.checks.base import short
from fak.policy.shell import Analysis, SimpleCommand


def pipe_to_interpreter(a: Analysis, root: str | None, extra: tuple[str, ...]) -> str | None:
    """An interpreter whose program arrives through a pipe, a process substitution or a file
    descriptor it inherits (``cat x | bash /dev/stdin``, ``awk -f -``, ``sh /dev/fd/3``)."""
    for c in a.commands:
        prog = c.program
        if prog == "procsub":
            return short(c.line)
        if prog == "stdin" and c.stdin in ("pipe", "procsub"):
            return f"{short(c.line)} reads its program from a pipe"
        if prog == "dynamic" and c.unknown_operands:
            return f"{short(c.line)} runs a program named by data from a pipe"
        if prog == "descriptor":
            return f"{short(c.line)} reads its program from an inherited file descriptor"
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
            return f"{short(c.line)}: the git sub-command is only known at run time"
        word = c.argv[sub]
        if word in _PUSH_SUBCOMMANDS or (word == "subtree" and "push" in c.argv[sub + 1:]):
            return short(c.line)
        if call.aliases.get(word.lower(), "") is None:
            return f"{short(c.line)}: the git alias is only known at run time"
    return None


def dynamic_command(a: Analysis, root: str | None, extra: tuple[str, ...]) -> str | None:
    """A command whose name or program is only known at run time."""
    for c in a.commands:
        if c.note is not None:
            return f"{short(c.line)}: {c.note}" if c.line else c.note
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
            return f"{short(c.line)}: the pip sub-command is only known at run time"
        if argv[start] not in ("install", "download", "wheel"):
            continue
        found = _cmds.parse_pip(argv, dyn, start + 1)
        if found is not None:
            what, why = found
            return f"{short(c.line)}: `{short(what, 60)}` {why}"
    return None


def inline_code(a: Analysis, root: str | None, extra: tuple[str, ...]) -> str | None:
    """Inline programs of languages the policy does not read: ``python -c``, ``perl -e``,
    ``node -e``/``-p``, ``ruby -e``, ``php -r``, ``lua -e``, ``make --eval``, and Python (or
    Perl, ...) reading a here-document or here-string. A program in a file (``python x.py``)
    and a module (``python -m pytest``) are not inline; shell, awk and sed programs are
    analyzed instead."""
    for c in a.commands:
        if c.program in ("string", "heredoc", "herestring") and _cmds.is_opaque_language(c.name):
            where = {"string": "inline", "heredoc": "here-document",
                     "herestring": "here-string"}[c.program]
            return f"{short(c.line)}: {where} {c.name} program"
    return None
