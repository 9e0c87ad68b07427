"""Static analysis of a shell command line: the simple commands it would run, normalized.

:func:`analyze` reads a POSIX/bash command string (the ``bash`` tool's ``command``) and returns
every simple command it contains, wherever it hides: after ``;``/``&&``/``||``/``|``/``&``/newlines,
inside ``$(...)``, backquotes, ``<(...)``/``>(...)``, subshells, groups, ``if``/``while``/``for``/
``case`` bodies, function bodies, ``bash -c``/``sh -c``/``su -c`` strings, ``eval`` arguments,
here-documents fed to a shell (after the outer shell's expansion), ``trap``/``alias``/``watch``
strings, git ``!`` aliases, git configuration values that git runs as commands (from ``-c``, the
``GIT_CONFIG_*`` variables and ``git config``), git sub-commands that run commands (``rebase
--exec``, ``bisect run``, ...), awk ``system()`` and sed ``e`` commands, ``find -exec`` actions,
GNU ``parallel`` jobs, scripts and copies of programs that the same line wrote and then runs,
and behind wrappers (``sudo``, ``env``, ``command``, ``exec``, ``nohup``, ``xargs``, ``timeout``,
``setarch``, ``prlimit``, ``busybox``, ...; see :mod:`fak.policy.commands`).

Each :class:`SimpleCommand` carries its words after quote removal (``r''m`` → ``rm``, ``"rm"`` →
``rm``, ``\\r\\m`` → ``rm``, ``$'\\x72m'`` → ``rm``, ``$'rm\\0x'`` → ``rm``, unquoted ``{a,b}``
brace expansion), a flag per word that says whether its value is only known at run time
(parameter expansion, command substitution, arithmetic), its redirections, where its standard
input comes from (a pipe, a file, a here-document), the directories it may run in (``cd`` is
tracked), and ``line``: the command name's basename followed by its arguments, joined by single
spaces (``/bin/rm -r -f /`` → ``rm -r -f /``) — the text that policy regexes with ``"match":
"normalized"`` see.

The grammar follows the bash manual ("Shell Syntax", "Shell Commands", "Shell Expansions",
"Redirections") and POSIX "Shell Command Language" §2.2-2.10. The parser is permissive where
bash is permissive and raises :class:`ShellSyntaxError` where bash would refuse to run the line
(unbalanced quotes, ``$(`` without ``)``, ``if`` without ``fi``) or where the analysis gives up
(nesting deeper than :data:`MAX_DEPTH`, more than :data:`MAX_SOURCE_CHARS` characters, more than
:data:`MAX_PARSE_CHARS` characters of nested strings), so that callers can fail closed. It is an
analysis, not an interpreter: it never runs anything and over-approximates (both branches of
``&&``/``||``, all loop bodies, every directory ``cd`` may have reached).

A hand-written lexer rather than :mod:`shlex`: shlex does not know ``$(...)`` nesting, backquotes,
``$'...'``, here-documents, newlines as separators or which words were quoted, all of which
decide what bash runs.

Modules: :mod:`~fak.policy.shell.model` (what the analysis produces), :mod:`~.lexer` (tokens and
words), :mod:`~.grammar` (commands, lists, compound commands), :mod:`~.follow` (wrappers,
interpreters, ``find``, ``cd``), :mod:`~.gitrun` (git), :mod:`~.written` (files and variables a
line leaves for its own later commands), :mod:`~.brace` (brace expansion), :mod:`~.base` (the
state they share), :mod:`~.parser` (entry points and fast paths).
"""

from fak.policy.shell.model import (GLOB, MAX_BRACE_WORDS, MAX_COMMANDS, MAX_CWDS, MAX_DEPTH,
                                    MAX_PARSE_CHARS, MAX_SOURCE_CHARS, PROCSUB, Analysis, Redirect,
                                    ShellSyntaxError, SimpleCommand)
from fak.policy.shell.parser import analyze, analyze_full

__all__ = [
    "analyze", "analyze_full", "Analysis", "SimpleCommand", "Redirect", "ShellSyntaxError",
    "GLOB", "PROCSUB", "MAX_DEPTH", "MAX_COMMANDS", "MAX_CWDS", "MAX_BRACE_WORDS",
    "MAX_SOURCE_CHARS", "MAX_PARSE_CHARS",
]
