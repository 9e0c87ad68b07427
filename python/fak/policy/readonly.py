"""Which tool calls only read: :func:`command_reads_only` for a shell command line, and
:class:`ReadTools` for a call of one of the tools a request offers.

A command line only reads when :func:`fak.policy.shell.analyze` reads it and every simple command
it would run (those inside ``$(...)``, ``<(...)``, pipelines and ``find -exec`` included) is a
reading program (``cat``, ``grep``, ``ls``, ``find``, ``sed``, ``awk``, ``git``, ...) that
:func:`fak.policy.writes.paths_of` finds writing nothing (``sort -o``, ``uniq IN OUT``, ``sed -i``
or ``w``, ``awk`` ``print > FILE``, ``find -fprint``, ``git --output`` / ``-C``, ...), with no
redirection that writes a file, no word known only at run time, and per program:

- ``find``: no ``-delete`` (its ``-exec`` commands are judged like the others);
- ``sed`` and ``awk``: the program is on the command line and runs no command
  (:func:`fak.policy.programs.sed_effects` / ``awk_effects``); an awk program has no ``>`` at all
  (``awk_effects`` lists literal ``print > "FILE"`` targets only), gawk's ``-i``/``-l`` (``-i
  inplace``) and ``sed -f`` are refused;
- ``git``: a sub-command that shows (``diff``, ``status``, ``log``, ``show``, ``blame``, ``grep``,
  ``ls-files``, ...; ``branch`` and ``tag`` only listing), no ``-c`` configuration, no command it
  runs (:func:`fak.policy.gitcmd.sub_programs`: ``grep -O``);
- the output options of readers: ``sort --compress-program``, ``rg --pre``, ``tree -o``, ``xxd
  IN OUT``, ``file -C``.

Which tools read comes from the tools themselves (their names and, when the request offers them,
their schemas), not from a list of agents: a tool whose name says it reads (a word ``read``,
``list``/``ls``, ``search``, ``grep``, ``glob``, ``find``, ``view``, ``cat``: ``read``,
``Read``, ``read_file``, ``list_directory``, ``Glob``, ``grep_search``, ``NotebookRead``) and
nothing else (no ``write``, ``edit``, ``replace``, ``run``, ``web``, ``fetch``, ``output``, ...),
with no parameter that carries text to write (``content``, ``new_string``, ``edits``, ...); a
shell tool (a name with ``bash``, ``shell``, ``sh``, ``zsh``, ``exec`` or ``terminal``: ``bash``,
``Bash``, ``run_shell_command``, Codex's ``shell``/``local_shell``/``exec_command``) whose
``command``/``cmd`` (a line, or an argv; Codex's ``["bash", "-lc", SCRIPT]`` is ``SCRIPT``) or
``commands`` (lines) only read; and a tool whose schema makes ``command`` a choice (an ``enum``:
OpenHands' ``str_replace_editor``) when the chosen word reads (``view``).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from fak.policy import gitcmd
from fak.policy.commands import find_of, parse_git
from fak.policy.interpreters import awk_source, interpreter_program, sed_scripts
from fak.policy.programs import awk_effects, sed_effects
from fak.policy.shell import ShellSyntaxError, SimpleCommand, analyze
from fak.policy.writes import paths_of

__all__ = ["ReadTools", "command_reads_only"]

#: Programs that only read, unless an option or operand below makes them write or run something.
_READERS = frozenset({
    "cat", "head", "tail", "grep", "egrep", "fgrep", "rg", "ag", "ls", "ll", "tree", "wc", "nl", "cut", "tr",
    "sort", "uniq", "diff", "cmp", "comm", "file", "stat", "du", "pwd", "echo", "printf", "true", "basename",
    "dirname", "realpath", "readlink", "which", "type", "find", "sed", "git", "cd", "column", "fold", "expand",
    "od", "hexdump", "xxd", "md5sum", "sha1sum", "sha256sum", "less", "more", "strings", "awk",
})
#: git sub-commands that only show (``branch``/``tag`` only without operands: listing).
_GIT_SHOW = frozenset({"diff", "status", "log", "show", "blame", "grep", "ls-files", "rev-parse", "describe",
                       "shortlog", "cat-file", "ls-tree", "branch", "tag"})
_GIT_LIST_CHANGES = ("--unset-upstream", "--edit-description")
_SINKS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})


def _writes_or_runs(cmd: SimpleCommand) -> bool:
    """What a reading program does beyond reading, from its options (see the module doc)."""
    name, argv, dyn = cmd.name, cmd.argv, cmd.dyn
    rest = argv[1:]
    if name == "find":
        return find_of(cmd).delete
    if name == "sed":
        scripts = sed_scripts(argv, dyn)
        return interpreter_program(name, argv, dyn)[0] != "string" or any(sed_effects(t)[0] for t, _ in scripts)
    if name == "awk":
        source = awk_source(argv, dyn)
        if source is None or any(a.startswith(("-i", "-l", "--include", "--load")) for a in rest):
            return True
        runs, writes, _ = awk_effects(source[0])
        return bool(runs or writes) or ">" in source[0]
    if name == "git":
        call = parse_git(argv, dyn)
        sub = call.sub
        if sub is None or dyn[sub] or argv[sub] not in _GIT_SHOW or call.config:
            return True
        if gitcmd.sub_programs(argv, dyn, sub):
            return True
        if argv[sub] in ("branch", "tag"):
            after = argv[sub + 1:]
            return any(not a.startswith("-") or a in _GIT_LIST_CHANGES for a in after)
        return False
    if name == "sort":
        return any(a.startswith("--compress-program") for a in rest)
    if name == "rg":
        return any(a == "--pre" or a.startswith("--pre=") for a in rest)
    if name == "tree":
        return "-o" in rest
    if name == "file":
        return any(a == "-C" or a == "--compile" for a in rest)
    if name == "xxd":
        return len([a for a in rest if not a.startswith("-")]) > 1
    return False


def _command_reads_only(cmd: SimpleCommand) -> bool:
    if any(r.writes and r.target not in _SINKS for r in cmd.redirects):
        return False
    if not cmd.argv:
        return True
    if any(cmd.dyn) or cmd.name not in _READERS or paths_of(cmd):
        return False
    return not _writes_or_runs(cmd)


def command_reads_only(command: str) -> bool:
    """Whether the shell command line ``command`` only reads files (see the module doc): its
    result cannot change until something writes. A line the analysis refuses
    (``ShellSyntaxError``) or an empty one does not."""
    if not command.strip():
        return False
    try:
        analysis = analyze(command)
    except ShellSyntaxError:
        return False
    return bool(analysis.commands) and all(_command_reads_only(c) for c in analysis.commands)


# ------------------------------------------------------------------------------------------ tools

_NAME_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_READ_WORDS = frozenset({"read", "list", "ls", "search", "grep", "glob", "find", "view", "cat"})
#: words of a tool name that say it does more than read the workspace's files
_OTHER_WORDS = frozenset({
    "write", "edit", "create", "delete", "remove", "replace", "patch", "apply", "insert", "update", "move",
    "rename", "copy", "run", "execute", "kill", "command", "web", "url", "http",
    "fetch", "browser", "output", "todo", "memory", "task", "submit", "save", "set", "put", "post", "send",
})
_SHELL_WORDS = frozenset({"bash", "shell", "sh", "zsh", "exec", "terminal"})
#: parameters that carry text to write
_CONTENT_PARAMETERS = frozenset({"content", "contents", "new", "new_string", "new_str", "old_string", "old_str",
                                 "file_text", "edits", "patch", "diff", "replacement", "insert_line"})
#: where a shell tool holds its command: a line (or an argv), or a list of lines
_COMMAND_ARGUMENTS = ("command", "cmd")
_LINES_ARGUMENT = "commands"
_SHELLS = frozenset({"bash", "sh", "zsh", "/bin/bash", "/bin/sh", "/usr/bin/bash", "/bin/zsh"})


def _name_words(name: str) -> frozenset[str]:
    return frozenset(w.lower() for w in _NAME_WORD.findall(name))


def _shell_line(value: Any, argument: str) -> str | None:
    """The command line a shell tool's argument holds: a string as it is, command lines joined
    by newlines, an argv joined as the shell quotes it (``[SHELL, "-c", SCRIPT]`` is ``SCRIPT``)."""
    if isinstance(value, str):
        return value
    if not (isinstance(value, list) and value and all(isinstance(v, str) for v in value)):
        return None
    if argument == _LINES_ARGUMENT:
        return "\n".join(value)
    if len(value) == 3 and value[0] in _SHELLS and value[1] in ("-c", "-lc", "-cl"):
        return value[2]
    return shlex.join(value)


class ReadTools:
    """Which calls of a request's tools only read (see the module doc).

    Build with :meth:`from_openai` from the request's ``tools`` (OpenAI form: ``[{"type":
    "function", "function": {"name", "parameters"}}]``); ``None`` (no tools known) judges a call
    by its tool's name and its arguments alone. When tools are known, a call of a tool not among
    them does not read only.
    """

    def __init__(self, schemas: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        #: offered tool name → its ``parameters.properties`` (``{}`` without a schema); ``None``:
        #: the tools are not known
        self.properties = schemas

    @classmethod
    def from_openai(cls, tools: Sequence[Mapping[str, Any]] | None) -> ReadTools:
        """The judge for the OpenAI ``tools`` of a request (``None``: not known)."""
        if tools is None:
            return cls()
        props: dict[str, Mapping[str, Any]] = {}
        for tool in tools:
            fn = tool.get("function") or {}
            params = fn.get("parameters")
            found = params.get("properties") if isinstance(params, Mapping) else None
            props[str(fn.get("name") or "")] = found if isinstance(found, Mapping) else {}
        return cls(props)

    def reads_only(self, name: str, arguments: str | Mapping[str, Any]) -> bool:
        """Whether the call ``name(arguments)`` (a JSON text or a decoded object) only reads the
        workspace, so that its result cannot change until a call that does not read only runs.
        Anything that does not decode to an object does not read only."""
        properties: Mapping[str, Any] = {}
        if self.properties is not None:
            if name not in self.properties:
                return False
            properties = self.properties[name]
        try:
            args = json.loads(arguments) if isinstance(arguments, str) else arguments
        except (ValueError, RecursionError):
            return False
        if not isinstance(args, Mapping):
            return False
        words = _name_words(name)
        choice = properties.get("command")
        if isinstance(choice, Mapping) and isinstance(choice.get("enum"), list):
            return isinstance(args.get("command"), str) and args["command"] in _READ_WORDS
        if words & _SHELL_WORDS:
            return self._shell_reads_only(args)
        if not words & _READ_WORDS or words & _OTHER_WORDS:
            return False
        return not (_CONTENT_PARAMETERS & (set(properties) | set(args)))

    @staticmethod
    def _shell_reads_only(args: Mapping[str, Any]) -> bool:
        lines = [_shell_line(args.get(a), a) for a in (*_COMMAND_ARGUMENTS, _LINES_ARGUMENT) if a in args]
        return bool(lines) and all(line is not None and command_reads_only(line) for line in lines)
