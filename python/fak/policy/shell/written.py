"""What one command line leaves for its own later commands: files it writes and then runs, and
environment variables it sets.

- Files: every file a command writes is remembered with what is known of its content: a copy of
  another file (``cp``, ``install``, ``ln``, ``mv``, ``dd``, ``cat FILE >``), a text
  (``cat > f <<EOF``, ``echo``, ``printf``), or unknown. Running it later in the same line by
  path (``./del -rf ~``), through a ``PATH`` that reaches it, or as a shell script (``bash x.sh``,
  ``source x.sh``) is analyzed as what it is: the copied program (``rm -rf ~``), the script's
  text, or a command only known at run time. A file run by path that this line did not write is
  looked up on disk when the workspace root is known (:func:`fak.policy.binaries.real_program`:
  a symlink, or a byte-identical copy of a system program).
- Environment: variables whose value programs run as commands (``GIT_PAGER``, ``EDITOR``, ...),
  prompt strings, exported functions (``BASH_FUNC_f%%``), files that shells or the loader read
  at start (``BASH_ENV``, ``LD_PRELOAD``, ...), ``PATH`` and git's configuration variables.

:class:`WrittenFiles` is a mixin of :class:`~fak.policy.shell.parser.Parser`.
"""

from __future__ import annotations

import posixpath
import re

from fak.policy import binaries as _binaries
from fak.policy import commands as _cmds
from fak.policy import writes as _writes
from fak.policy.paths import resolve, within
from fak.policy.shell.base import ParserBase
from fak.policy.shell.model import Redirect, SimpleCommand

# environment variables whose value a program runs as a shell command
COMMAND_VARS = frozenset({
    "GIT_PAGER", "PAGER", "GIT_EDITOR", "EDITOR", "VISUAL", "GIT_SSH_COMMAND", "GIT_SSH",
    "GIT_ASKPASS", "SSH_ASKPASS", "GIT_EXTERNAL_DIFF", "MANPAGER", "PROMPT_COMMAND",
    "GIT_SEQUENCE_EDITOR", "LESSOPEN", "LESSCLOSE", "BROWSER", "SUDO_ASKPASS", "GIT_PROXY_COMMAND",
})
# prompt strings: their command substitutions run when the prompt is shown (PS4: under set -x)
_PROMPT_VARS = frozenset({"PS0", "PS1", "PS2", "PS3", "PS4"})
# files that a shell, the dynamic loader or git reads code or configuration from at start
_FILE_VARS = frozenset({"BASH_ENV", "ENV", "LD_PRELOAD", "LD_AUDIT", "GIT_EXEC_PATH",
                        "GIT_TEMPLATE_DIR", "GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM", "GIT_CONFIG"})
_COPIERS = frozenset({"cp", "install", "ln", "mv"})
_CONTENT_KEEPERS = frozenset({"chmod", "chown", "chgrp", "touch"})
_SHEBANG = re.compile(r"#!\s*(\S+)(?:\s+(\S+))?")
_MAX_CHAIN = 8


class Written:
    """What is known of a file this line wrote: ``source`` (the path it is a copy of),
    ``content`` (its text), ``pending`` (a here-document whose body is not read yet), or none
    of them (unknown)."""

    __slots__ = ("source", "content", "pending")

    def __init__(self, source: str | None = None, content: str | None = None,
                 pending: Redirect | None = None):
        self.source = source
        self.content = content
        self.pending = pending


def path_key(cwd: str | None, word: str) -> str | None:
    """A lexical name for the file ``word`` names from ``cwd`` (``""``: the workspace root),
    the same for every spelling of it (``./x``, ``x``, ``src/../x``); ``None`` when ``cwd`` is
    unknown and ``word`` relative."""
    if word.startswith(("/", "~")):
        return posixpath.normpath(word)
    if cwd is None:
        return None
    return posixpath.normpath(posixpath.join(cwd, word) if cwd else word)


def _decode_printf(fmt: str) -> str | None:
    if "%" in fmt.replace("%%", ""):
        return None
    return (fmt.replace("%%", "%").replace("\\n", "\n").replace("\\t", "\t")
            .replace("\\\\", "\\"))


class WrittenFiles(ParserBase):
    """File and environment methods of the parser (see the module docstring)."""

    # ------------------------------------------------------------------------- environment

    def _env_assign(self, var: str, value: str, dyn: bool) -> None:
        """``var=value`` is set for the commands that follow (prefix assignments, ``export``,
        ``declare``, ``env``; an over-approximation: for the rest of the line)."""
        ctx = self.ctx
        ctx.env[var] = (value, dyn)
        if var in COMMAND_VARS:
            if dyn:
                self._note(f"{var} holds a command computed at run time")
            elif value:
                self._parse_string(value, f"{var}=", "", deferred=True)
        elif var in _PROMPT_VARS:
            if "$(" in value or "`" in value:
                ctx.loop_depth += 1
                try:
                    self._child(value, 0, f"{var}=", "", None)._dq(0, [], True, heredoc=True)
                finally:
                    ctx.loop_depth -= 1
        elif var in _FILE_VARS:
            if dyn or value not in ("", "/dev/null"):
                self._note(f"{var}={value} makes programs run or read code from a file the "
                           f"policy cannot see")
        elif var.startswith("BASH_FUNC_"):
            body = value[2:] if value.startswith("()") else value
            if dyn:
                self._note(f"{var} exports a function computed at run time")
            else:
                self._parse_string(body, "exported function", "", deferred=True)
        elif var == "PATH":
            for comp in value.split(":"):
                if comp in ("$PATH", "${PATH}") or comp.startswith("$"):
                    continue
                if not comp.startswith(("/usr/", "/bin", "/sbin", "/opt/", "/snap/")) \
                        or comp == "":
                    ctx.path_dirs.append(comp or ".")
        elif var.startswith(("GIT_CONFIG_KEY_", "GIT_CONFIG_VALUE_")) \
                or var == "GIT_CONFIG_PARAMETERS":
            self._git_env(var)

    # ------------------------------------------------------------------------- files written

    def _record_writes(self, cmd: SimpleCommand) -> None:
        """Remember the files ``cmd`` writes, with what is known of their content."""
        argv, dyn = cmd.argv, cmd.dyn
        name = cmd.name
        written = self.ctx.written
        for r in cmd.redirects:
            if not r.writes or r.procsub or r.dynamic or r.fd not in (None, 1):
                continue
            rec = self._stdout_of(cmd)
            if r.op == ">>":
                rec = Written()
            for cwd in cmd.cwds:
                key = path_key(cwd, r.target)
                if key is not None:
                    written[key] = rec
        if not argv or dyn[0]:
            return
        if name in _COPIERS or name == "dd":
            self._record_copies(cmd)
        elif name == "tee":
            rec = self._stdout_of(cmd, tee=True)
            for i in range(1, len(argv)):
                if not argv[i].startswith("-") and not dyn[i]:
                    for cwd in cmd.cwds:
                        key = path_key(cwd, argv[i])
                        if key is not None:
                            written[key] = rec
        elif name not in _CONTENT_KEEPERS:
            for _, path in _writes.paths_of(cmd):
                for cwd in cmd.cwds:
                    key = path_key(cwd, path)
                    if key is not None:
                        written[key] = Written()

    def _stdout_of(self, cmd: SimpleCommand, tee: bool = False) -> Written:
        """What ``cmd`` prints, when it is known from its words: ``cat``/``tee`` of a
        here-document, ``cat FILE``, ``echo``, ``printf`` without conversions."""
        argv, dyn = cmd.argv, cmd.dyn
        if not argv or any(dyn):
            return Written()
        name = cmd.name
        ops = [a for a in argv[1:] if not a.startswith("-") or a == "-"]
        if name == "cat" or tee:
            if name == "cat" and len(ops) == 1 and ops[0] != "-":
                return Written(source=ops[0])
            if name == "cat" and ops:
                return Written()
            for r in reversed(cmd.redirects):
                if r.fd in (None, 0) and r.op in ("<<", "<<-", "<<<"):
                    if r.body is None:
                        return Written(pending=r)
                    if r.body_dynamic:
                        return Written()
                    return Written(content=r.body if r.op != "<<<" else r.body + "\n")
            return Written()
        if name == "echo":
            words = argv[1:]
            newline = True
            while words and words[0] in ("-n", "-e", "-E", "-ne", "-en"):
                if "n" in words[0]:
                    newline = False
                if "e" in words[0][1:] and any("\\" in w for w in words):
                    return Written()
                words = words[1:]
            return Written(content=" ".join(words) + ("\n" if newline else ""))
        if name == "printf" and len(argv) >= 2:
            fmt = argv[1]
            if fmt.count("%s") == 1 and "%" not in fmt.replace("%s", "").replace("%%", ""):
                parts = [_decode_printf(fmt.replace("%s", a.replace("%", "%%")))
                         for a in argv[2:] or [""]]
                return Written(content="".join(p or "" for p in parts))
            if len(argv) == 2:
                text = _decode_printf(fmt)
                if text is not None:
                    return Written(content=text)
        return Written()

    def _record_copies(self, cmd: SimpleCommand) -> None:
        argv, dyn = cmd.argv, cmd.dyn
        name = cmd.name
        pairs: list[tuple[str | None, str]] = []   # (source word or None: unknown, destination)
        if name == "dd":
            src = next((a[3:] for a, d in zip(argv, dyn) if a.startswith("if=") and not d), None)
            for a, d in zip(argv, dyn):
                if a.startswith("of=") and not d:
                    pairs.append((src, a[3:]))
        else:
            opts, ops = _cmds.getopt(argv, dyn, 1, short_arg="tSmogB" if name == "install"
                                     else "tS", long_arg=frozenset({"target-directory", "suffix",
                                                                    "mode", "owner", "group"}))
            target = [o for o in opts if o[0] in ("-t", "--target-directory")]
            if any(o[0] in ("-d", "--directory") for o in opts) and name == "install":
                return
            srcs = ops if target else ops[:-1]
            dest_dir = target[-1][1] if target else (argv[ops[-1]] if ops else None)
            if dest_dir is None:
                return
            for i in srcs:
                src = None if dyn[i] else argv[i]
                base = posixpath.basename(argv[i].rstrip("/"))
                if not target and len(srcs) == 1:
                    pairs.append((src, dest_dir))
                pairs.append((src, posixpath.join(dest_dir, base)))
        written = self.ctx.written
        for cwd in cmd.cwds:
            for src, dest in pairs:
                key = path_key(cwd, dest)
                if key is None:
                    continue
                if src is None:
                    written[key] = Written()
                    continue
                skey = path_key(cwd, src)
                known = written.get(skey) if skey is not None else None
                written[key] = known if known is not None else Written(source=src)

    def _lookup_written(self, cmd: SimpleCommand, word: str) -> Written | None:
        written = self.ctx.written
        if not written:
            return None
        for cwd in cmd.cwds:
            if "/" in word:
                key = path_key(cwd, word)
                if key is not None and key in written:
                    return written[key]
            else:
                for d in self.ctx.path_dirs:
                    key = path_key(cwd, posixpath.join(d, word))
                    if key is not None and key in written:
                        return written[key]
        return None

    def _run_file(self, cmd: SimpleCommand, hops: int) -> bool:
        """``cmd`` runs a program by path (or through a ``PATH`` this line changed): when that
        is a file this line wrote, or a workspace file that is another program, analyze what it
        really runs and return True."""
        word = cmd.argv[0]
        if "/" not in word and not self.ctx.path_dirs:
            return False
        rec = self._lookup_written(cmd, word)
        if rec is not None:
            self._run_written(cmd, rec, hops, as_program=True)
            return True
        root = self.ctx.root
        if root is None or (word.startswith("/") and not word.startswith(root + "/")):
            return False        # an absolute path elsewhere is the system's program
        candidates = [word] if "/" in word else [posixpath.join(d, word)
                                                 for d in self.ctx.path_dirs]
        for cwd in cmd.cwds:
            for cand in candidates:
                head, base = posixpath.split(cand.rstrip("/"))
                parent = resolve(head or ".", cwd, root)
                if parent is None or not base or not within(parent, root):
                    continue        # a system program is what it is named
                prog = _binaries.real_program(posixpath.join(parent, base))
                if prog is not None:
                    self._emit([prog, *cmd.argv[1:]], [False, *cmd.dyn[1:]],
                               [0, *cmd.flags[1:]], [], cmd.stdin, f"copy of {prog}", cmd.cwds,
                               cmd.unknown_operands, cmd.find_roots, hops + 1, cmd.find_guarded)
                    return True
        return False

    def _run_written(self, cmd: SimpleCommand, rec: Written, hops: int, as_program: bool) -> None:
        for _ in range(_MAX_CHAIN):
            if rec.source is None:
                break
            nxt = self._lookup_written(cmd, rec.source) if "/" in rec.source else None
            if nxt is None or nxt is rec:
                break
            rec = nxt
        if rec.source is not None:
            if as_program:
                self._emit([rec.source, *cmd.argv[1:]], [False, *cmd.dyn[1:]],
                           [0, *cmd.flags[1:]], [], cmd.stdin, f"copy of {rec.source}",
                           cmd.cwds, cmd.unknown_operands, cmd.find_roots, hops + 1,
                           cmd.find_guarded)
            return
        if rec.pending is not None:
            r = rec.pending
            if r.body is None:
                r.callbacks.append(lambda r, cmd=cmd: self._run_script_text(
                    cmd, None if r.body_dynamic else r.body))
                return
            self._run_script_text(cmd, None if r.body_dynamic else r.body)
            return
        self._run_script_text(cmd, rec.content)

    def _run_script_text(self, cmd: SimpleCommand, text: str | None) -> None:
        if text is None:
            cmd.note = "runs a file this command wrote, whose content is only known at run time"
            return
        m = _SHEBANG.match(text)
        if m is not None:
            interp = posixpath.basename(m.group(1))
            if interp == "env" and m.group(2):
                interp = m.group(2)
            if not _cmds.is_shell(interp):
                return      # a script of another language: a program file, as `python x.py`
        self._parse_string(text, f"script {cmd.argv[0]}", "")

    def _run_script(self, cmd: SimpleCommand, word: str) -> None:
        """A shell runs the script file ``word`` (``bash x.sh``, ``source x.sh``)."""
        rec = self._lookup_written(cmd, word if "/" in word else "./" + word)
        if rec is None or rec.source is not None:
            return      # a file of the workspace, not written by this line: a program file
        if rec.pending is not None or rec.content is not None:
            self._run_written(cmd, rec, 0, as_program=False)
        else:
            cmd.note = "runs a script this command wrote, whose content is only known at run time"
