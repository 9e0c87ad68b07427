"""Following commands into the commands they run: wrappers (``sudo``, ``env``, ``timeout``,
``xargs``, ``setarch``, ...), ``bash -c`` strings and other interpreters' programs (awk
``system()``, sed ``e``), ``eval``, ``source``, ``trap``, ``alias``, ``find -exec``, GNU
``parallel``, ``gdb``/``vim`` shell escapes, tar's command options, and ``cd``.

:class:`Follow` is a mixin of :class:`~fak.policy.shell.parser.Parser`: ``_emit`` receives every
simple command the grammar completes, records it, and starts child parsers for what it runs.
"""

from __future__ import annotations

import itertools

from fak.policy import commands as _cmds
from fak.policy import programs as _programs
from fak.policy.shell.base import Ctx, ParserBase
from fak.policy.shell.brace import brace_expand
from fak.policy.shell.lexer import WORD
from fak.policy.shell.model import (BRACE, GLOB, MAX_COMMANDS, MAX_CWDS, PROCSUB, Redirect,
                                    SimpleCommand)

_ENV_SETTERS = frozenset({"export", "declare", "typeset", "readonly", "local"})
_EDITORS = frozenset({"vim", "vi", "nvim", "ex", "view", "vimdiff", "gvim", "rvim"})
_MAX_PARALLEL_JOBS = 64
_PARALLEL_ARG_OPTS = frozenset({
    "-j", "-P", "--jobs", "-S", "--sshlogin", "--slf", "--sshloginfile", "-a", "--arg-file",
    "-d", "--delimiter", "-E", "--eof", "-I", "-n", "--max-args", "-N", "--max-replace-args",
    "-L", "--max-lines", "--colsep", "-C", "--joblog", "--results", "--res", "--tmpdir",
    "--workdir", "--wd", "--timeout", "--delay", "--memfree", "--load", "--basefile", "--bf",
    "--return", "--transfer", "--env", "--halt", "--retries", "--tagstring", "--arg-sep",
    "--arg-file-sep", "--shebang-wrap", "--rpl", "--sem", "--semaphore-timeout", "--id"})


class Follow(ParserBase):
    """Semantic methods of the parser (see the module docstring)."""

    def _parse_string(self, text: str, via: str, stdin: str, deferred: bool = False) -> None:
        """Analyze ``text`` as a shell program run by this one (``bash -c``, ``eval``, ...);
        ``deferred``: it runs later or repeatedly (the directory it runs in is unknown)."""
        p = self._child(text, 0, via, stdin, None)
        if deferred:
            self.ctx.loop_depth += 1
            try:
                p.run()
            finally:
                self.ctx.loop_depth -= 1
        else:
            p.run()

    def _split_words(self, text: str, via: str) -> list[tuple[str, bool, int]]:
        """The words of ``text`` (``env -S`` strings, git alias values), expansions analyzed."""
        p = self._child(text, 0, via, "", None)
        out: list[tuple[str, bool, int]] = []
        while True:
            t = p._next_tok()
            if t[0] != WORD:
                return out
            if t[3] & BRACE:
                out.extend((w, t[2], t[3] & GLOB) for w in brace_expand(t[1]))
            else:
                out.append((t[1], t[2], t[3]))

    def _note(self, why: str) -> None:
        """Record that something runs that is only known at run time, outside any command."""
        cmd = SimpleCommand([], [], [], [], "", tuple(self.ctx.cwds), self.via)
        cmd.note = why
        self.ctx.commands.append(cmd)

    def _emit(self, argv: list[str], dyn: list[bool], flags: list[int],
              redirects: list[Redirect], stdin: str, via: str, cwds: tuple | None,
              unknown_operands: bool, find_roots: tuple | None, hops: int,
              find_guarded: bool = False) -> None:
        cmd = SimpleCommand(argv, dyn, flags, redirects, stdin,
                            tuple(self.ctx.cwds) if cwds is None else cwds, via, unknown_operands,
                            find_roots)
        cmd.find_guarded = find_guarded
        self._emit_command(cmd, hops)

    def _emit_command(self, cmd: SimpleCommand, hops: int) -> None:
        """Record ``cmd`` (built by :meth:`_emit` or by a fast path) and follow what it runs."""
        ctx = self.ctx
        if len(ctx.commands) >= MAX_COMMANDS:
            raise self._err(f"more than {MAX_COMMANDS} commands")
        if ctx.func_stack:
            cmd.func = ctx.func_stack[-1]
        ctx.commands.append(cmd)
        self._record_writes(cmd)
        argv, dyn, flags, find_roots = cmd.argv, cmd.dyn, cmd.flags, cmd.find_roots
        if not argv:
            return
        if dyn[0] or flags[0] & (GLOB | PROCSUB):
            cmd.note = "the command name is only known at run time"
            return
        name = cmd.name
        if find_roots is not None and "{}" in argv[0]:
            cmd.note = "find runs the found files as commands"
            return
        if name == "cd" or name == "pushd" or name == "popd":
            apply_cd(ctx, cmd)
            return
        if hops > 16:
            raise self._err("more than 16 nested command wrappers")
        if self._run_file(cmd, hops):
            return
        w = _cmds.unwrap(name, argv, dyn)
        if w is not None:
            self._emit_unwrapped(cmd, w, hops)
            return
        if name == "git":
            self._git(cmd, hops)
        elif name == "tar":
            for prog, pdyn in _cmds.tar_programs(argv, dyn):
                if pdyn:
                    cmd.note = "tar runs a command computed at run time"
                else:
                    self._parse_string(prog, "tar", "", deferred=True)
        elif name == "find":
            self._find(cmd, hops)
        elif name == "eval":
            if any(dyn[1:]):
                cmd.program = "dynamic"
                cmd.note = "eval of text computed at run time"
            elif len(argv) > 1:
                cmd.program = "string"
                self._parse_string(" ".join(argv[1:]), "eval", cmd.stdin)
        elif name == "source" or name == ".":
            self._source(cmd)
        elif name == "trap":
            ops = [i for i in range(1, len(argv)) if not argv[i].startswith("-")]
            if ops and len(ops) >= 2:
                i = ops[0]
                if dyn[i]:
                    cmd.note = "trap of a command computed at run time"
                else:
                    self._parse_string(argv[i], "trap", "", deferred=True)
        elif name == "alias":
            for i in range(1, len(argv)):
                if "=" in argv[i]:
                    if dyn[i]:
                        cmd.note = "alias of a command computed at run time"
                    else:
                        self._parse_string(argv[i].split("=", 1)[1], "alias", "", deferred=True)
        elif name in _ENV_SETTERS:
            for i in range(1, len(argv)):
                a = argv[i]
                if "=" in a and not a.startswith(("-", "+", "=")):
                    var, value = a.split("=", 1)
                    self._env_assign(var.rstrip("+"), value, dyn[i])
        elif name == "parallel":
            self._parallel(cmd)
        elif name == "gdb":
            self._gdb(cmd, hops)
        elif name in _EDITORS:
            self._editor(cmd)
        elif name == "split":
            for i, a in enumerate(argv):
                if a.startswith("--filter="):
                    self._run_text(cmd, a[9:], dyn[i], "split --filter")
        elif _cmds.is_interpreter(name):
            self._interpreter(cmd)

    def _run_text(self, cmd: SimpleCommand, text: str, dynamic: bool, via: str,
                  stdin: str = "") -> None:
        """``text`` is a shell command that ``cmd`` runs later (a filter, a hook, ...)."""
        if dynamic:
            cmd.note = f"{via} runs a command computed at run time"
        else:
            self._parse_string(text, via, stdin, deferred=True)

    def _emit_unwrapped(self, cmd: SimpleCommand, w: _cmds.Unwrapped, hops: int) -> None:
        argv, dyn, flags = cmd.argv, cmd.dyn, cmd.flags
        name = cmd.name
        if w.dynamic:
            cmd.note = f"{name} runs a command computed at run time"
        if name == "env":
            for i in range(1, w.start if w.start is not None else len(argv)):
                a = argv[i]
                if "=" in a and not a.startswith(("-", "=")):
                    var, value = a.split("=", 1)
                    self._env_assign(var, value, dyn[i])
        for idx in w.programs:
            if dyn[idx]:
                cmd.note = f"{name} runs a command computed at run time"
                continue
            text = " ".join(argv[idx:]) if w.join_program else w.values.get(idx, argv[idx])
            self._parse_string(text, name, cmd.stdin, deferred=w.repeats)
        if w.programs:
            return
        inner: list[tuple[str, bool, int]] = []
        for idx in w.split:
            if dyn[idx]:
                cmd.note = f"{name} runs a command computed at run time"
                return
            inner.extend(self._split_words(w.values.get(idx, argv[idx]), name))
        if w.start is not None:
            inner.extend(zip(argv[w.start:], dyn[w.start:], flags[w.start:]))
        elif not inner:
            inner.extend((a, False, 0) for a in w.default)
        if not inner:
            return
        if w.join_program:
            if any(d for _, d, _ in inner[:1]):
                cmd.note = f"{name} runs a command computed at run time"
                return
            self._parse_string(" ".join(t for t, _, _ in inner), name, cmd.stdin,
                               deferred=w.repeats)
            return
        if w.replace:
            inner = [(t, d or w.replace in t, f) for t, d, f in inner]
        cwds = cmd.cwds
        for idx in w.chdirs:
            cwds = tuple(combine_cwd(c, w.values.get(idx, argv[idx]), dyn[idx]) for c in cwds)
        self._emit([t for t, _, _ in inner], [d for _, d, _ in inner], [f for _, _, f in inner],
                   [], cmd.stdin, name, cwds, w.unknown_operands or cmd.unknown_operands,
                   cmd.find_roots, hops + 1, cmd.find_guarded)

    def _interpreter(self, cmd: SimpleCommand) -> None:
        name, argv, dyn = cmd.name, cmd.argv, cmd.dyn
        kind, found = _cmds.interpreter_program(name, argv, dyn)
        cmd.program_index = found
        idx = -1 if found is None else found
        shell = _cmds.is_shell(name)
        if kind == "string":
            if dyn[idx]:
                cmd.program = "dynamic"
                cmd.note = f"{name} runs a program computed at run time"
            else:
                cmd.program = "string"
                if shell:
                    self._parse_string(argv[idx], f"{name} -c", cmd.stdin)
                elif _cmds.is_awk(name):
                    self._awk(cmd, argv[idx])
                elif name.endswith("sed"):
                    for text, tdyn in _cmds.sed_scripts(argv, dyn):
                        if tdyn:
                            cmd.note = f"{name} runs a script computed at run time"
                        else:
                            for run in _programs.sed_effects(text)[0]:
                                self._program_runs(cmd, run, False)
        elif kind == "stdin":
            if cmd.unknown_operands:
                cmd.program = "dynamic"
                cmd.note = f"{name} runs a program named by data read at run time"
            elif cmd.stdin in ("heredoc", "herestring"):
                cmd.program = cmd.stdin
                if shell:
                    self._feed_body(cmd, name, 0)
            else:
                cmd.program = "stdin"
        elif kind == "descriptor":
            self._descriptor_program(cmd, idx, shell)
        elif kind == "file":
            if found is not None and cmd.flags[idx] & PROCSUB:
                cmd.program = "procsub"
            else:
                cmd.program = "file"
                if shell and found is not None and not dyn[idx]:
                    self._run_script(cmd, argv[idx])
        elif kind == "module":
            cmd.program = "module"
        else:
            if cmd.unknown_operands:
                cmd.program = "dynamic"
                cmd.note = f"{name} runs a program named by data read at run time"
            else:
                cmd.program = "none"

    def _descriptor_program(self, cmd: SimpleCommand, idx: int, shell: bool) -> None:
        """A program read from ``/dev/fd/N``: a here-document or file on that descriptor, or
        something the policy cannot see (a pipe, a process substitution, an inherited one)."""
        fd = _cmds.descriptor_path(cmd.argv[idx])
        for r in reversed(cmd.redirects):
            if r.fd == fd and r.op in ("<<", "<<-", "<<<"):
                cmd.program = "heredoc" if r.op != "<<<" else "herestring"
                if shell:
                    self._feed_body(cmd, cmd.name, fd)
                return
            if r.fd == fd and r.op in ("<", "<>") and not r.procsub:
                cmd.program = "file"
                return
        cmd.program = "descriptor"

    def _awk(self, cmd: SimpleCommand, prog: str) -> None:
        runs, _, _ = _programs.awk_effects(prog)
        for run, fed in runs:
            self._program_runs(cmd, run, fed)

    def _program_runs(self, cmd: SimpleCommand, run: str | None, fed: bool) -> None:
        if run is None:
            cmd.note = f"{cmd.name} runs a command computed at run time"
        else:
            self._parse_string(run, f"{cmd.name} command", "pipe" if fed else "", deferred=True)

    def _feed_body(self, cmd: SimpleCommand, name: str, fd: int | None) -> None:
        """Analyze the here-document/here-string a shell reads its program from (on descriptor
        ``fd``; 0 or ``None`` for standard input)."""
        fds = (None, 0) if fd in (None, 0) else (fd,)
        for r in reversed(cmd.redirects):
            if r.fd in fds and r.op in ("<<", "<<-", "<<<"):
                if r.op == "<<<" and r.dynamic:
                    cmd.program = "dynamic"
                    cmd.note = f"{name} runs a here-string computed at run time"
                    return
                if r.body is not None:
                    self._run_body(cmd, r, name)
                else:
                    r.callbacks.append(lambda r, cmd=cmd, name=name: self._run_body(cmd, r, name))
                return

    def _run_body(self, cmd: SimpleCommand, r: Redirect, name: str) -> None:
        if r.body_dynamic:
            cmd.program = "dynamic"
            cmd.note = f"{name} runs a here-document whose text is computed at run time"
            return
        self._parse_string(r.body or "", f"{name} <<", "")

    def _source(self, cmd: SimpleCommand) -> None:
        argv, dyn = cmd.argv, cmd.dyn
        ops = [i for i in range(1, len(argv)) if argv[i] != "--"]
        if not ops:
            return
        i = ops[0]
        self.ctx.deferred = True    # a sourced file may cd; treat later directories as unknown
        fd = None if dyn[i] else _cmds.descriptor_path(argv[i])
        if cmd.flags[i] & PROCSUB:
            cmd.program = "procsub"
        elif dyn[i]:
            cmd.program = "dynamic"
            cmd.note = "source of a file computed at run time"
        elif fd is not None:
            if fd == 0 and cmd.stdin in ("heredoc", "herestring"):
                cmd.program = cmd.stdin
                self._feed_body(cmd, cmd.name, 0)
            elif fd == 0:
                cmd.program = "stdin"
            else:
                self._descriptor_program(cmd, i, True)
        else:
            cmd.program = "file"
            self._run_script(cmd, argv[i])

    def _find(self, cmd: SimpleCommand, hops: int) -> None:
        argv, dyn = cmd.argv, cmd.dyn
        call = _cmds.find_of(cmd)
        if not call.execs:
            return
        if call.follow or any(dyn[i] for i in call.starts):
            roots = None
        else:
            roots = tuple(argv[i] for i in call.starts) or (".",)
        for k, (action, a, b) in enumerate(call.execs):
            if a >= b:
                continue
            words = argv[a:b]
            wdyn = list(dyn[a:b])
            if roots is None:
                wdyn = [d or "{}" in t for t, d in zip(words, wdyn)]
            cwds = (None,) if action in ("-execdir", "-okdir") else cmd.cwds
            self._emit(list(words), wdyn, list(cmd.flags[a:b]), [], "", f"find {action}", cwds,
                       cmd.unknown_operands, roots, hops + 1, call.exec_guarded[k])

    def _parallel(self, cmd: SimpleCommand) -> None:
        """GNU parallel: ``parallel [options] [command] ::: args ...``; each job is the command
        with ``{}`` (or the end) replaced by an argument, run by a shell; without a command,
        each argument is a command. Arguments from ``::::`` files, ``-a`` or standard input are
        only known at run time."""
        argv, dyn = cmd.argv, cmd.dyn
        n = len(argv)
        i = 1
        unknown = False
        while i < n and argv[i].startswith("-") and not dyn[i] and argv[i] not in (":::", "::::"):
            a = argv[i]
            if a in ("-a", "--arg-file") or a.startswith("--arg-file="):
                unknown = True
            i += 2 if a in _PARALLEL_ARG_OPTS else 1
        k = i
        while k < n and argv[k] not in (":::", "::::", ":::+", "::::+"):
            k += 1
        template = list(zip(argv[i:k], dyn[i:k]))
        groups: list[list[tuple[str, bool]]] = []
        while k < n:
            sep = argv[k]
            j = k + 1
            while j < n and argv[j] not in (":::", "::::", ":::+", "::::+"):
                j += 1
            if sep.startswith("::::"):
                unknown = True
            else:
                groups.append(list(zip(argv[k + 1:j], dyn[k + 1:j])))
            k = j
        if not groups:
            unknown = True
        if any(d for _, d in template):
            cmd.note = "parallel runs a command computed at run time"
            return
        text = " ".join(t for t, _ in template)
        jobs: list[list[tuple[str, bool]]] = []
        if not unknown:
            total = 1
            for g in groups:
                total *= max(len(g), 1)
            if total > _MAX_PARALLEL_JOBS:
                unknown = True
            else:
                jobs = [list(c) for c in itertools.product(*groups)]
        if unknown:
            if not text:
                cmd.note = "parallel runs commands read at run time"
                return
            jobs = [[("$PARALLEL_ARG", True)]]
        for job in jobs:
            args = [a if not d else "$PARALLEL_ARG" for a, d in job]
            if not text:
                line = " ".join(args)
            elif "{" in text:
                line = text
                for r in ("{}", "{.}", "{/}", "{//}", "{/.}"):
                    line = line.replace(r, args[0])
                for m, a in enumerate(args, 1):
                    line = line.replace("{%d}" % m, a)
            else:
                line = text + " " + " ".join(args)
            self._parse_string(line, "parallel", "")

    def _gdb(self, cmd: SimpleCommand, hops: int) -> None:
        """gdb: ``-ex``/``-iex``/``--eval-command`` commands starting with ``shell``/``!`` run
        a shell command, ``python``/``pi`` run Python; ``--args PROG ...`` names the program."""
        argv, dyn = cmd.argv, cmd.dyn
        for i in range(1, len(argv)):
            a = argv[i]
            value: str | None = None
            vdyn = False
            if a in ("-ex", "-iex", "--eval-command", "--init-eval-command", "-eval-command") \
                    and i + 1 < len(argv):
                value, vdyn = argv[i + 1], dyn[i + 1]
            elif a.startswith(("--eval-command=", "--init-eval-command=")):
                value, vdyn = a.split("=", 1)[1], dyn[i]
            elif a == "--args" and i + 1 < len(argv):
                self._emit(argv[i + 1:], dyn[i + 1:], cmd.flags[i + 1:], [], cmd.stdin, "gdb",
                           cmd.cwds, cmd.unknown_operands, cmd.find_roots, hops + 1)
                return
            if value is None:
                continue
            if vdyn:
                cmd.note = "gdb runs a command computed at run time"
                continue
            v = value.strip()
            if v.startswith("!"):
                self._parse_string(v[1:], "gdb shell", "", deferred=True)
            elif v.split(" ", 1)[0] in ("shell", "pipe", "|"):
                self._parse_string(v.split(" ", 1)[1] if " " in v else "", "gdb shell", "",
                                   deferred=True)
            elif v.split(" ", 1)[0] in ("python", "pi", "py", "python-interactive"):
                cmd.note = "gdb runs Python code the policy cannot read"

    def _editor(self, cmd: SimpleCommand) -> None:
        """vim and friends: ``-c CMD``, ``--cmd CMD`` and ``+CMD`` commands starting with ``!``
        run a shell command."""
        argv, dyn = cmd.argv, cmd.dyn
        for i in range(1, len(argv)):
            a = argv[i]
            if a in ("-c", "--cmd") and i + 1 < len(argv):
                value, vdyn = argv[i + 1], dyn[i + 1]
            elif a.startswith("+") and len(a) > 1:
                value, vdyn = a[1:], dyn[i]
            else:
                continue
            v = value.lstrip(":").strip()
            if vdyn:
                cmd.note = f"{cmd.name} runs a command computed at run time"
            elif v.startswith("!"):
                self._parse_string(v[1:], f"{cmd.name} !", "", deferred=True)


def combine_cwd(c: str | None, target: str, dynamic: bool) -> str | None:
    """The directory ``cd target`` reaches from ``c`` (``""``: the workspace root; ``None``:
    unknown)."""
    if dynamic:
        return None
    if target.startswith(("/", "~")):
        return target
    if c is None:
        return None
    if c == "":
        return target
    return c + "/" + target


def apply_cd(ctx: Ctx, cmd: SimpleCommand) -> None:
    """Record the directories a ``cd``/``pushd``/``popd`` may move to (``ctx.cwds`` only
    grows: every later command may run in any of them)."""
    ctx.cd_seen = True
    if ctx.loop_depth > 0:
        ctx.cwd_unknown = True
    if cmd.name == "popd":
        return      # back to a directory already tracked
    argv, dyn = cmd.argv, cmd.dyn
    ops = [i for i in range(1, len(argv)) if dyn[i] or not (
        argv[i] in ("-L", "-P", "-e", "-@", "-n", "--"))]
    if not ops:
        targets = [("~", False)]
    else:
        t = argv[ops[0]]
        if not dyn[ops[0]] and (t == "-" or (cmd.name == "pushd" and t[:1] in "+-"
                                               and t[1:].isdigit())):
            targets = [("", True)]
        else:
            targets = [(t, dyn[ops[0]])]
    new = list(ctx.cwds)
    for t, d in targets:
        for c in ctx.cwds:
            v = combine_cwd(c, t, d)
            if v not in new:
                new.append(v)
    if len(new) > MAX_CWDS:
        new = new[:MAX_CWDS] + [None]
    ctx.cwds = new
