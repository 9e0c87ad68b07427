"""Following git into the commands it runs: ``-c`` configuration values git runs (``core.pager``,
``core.fsmonitor``, ``alias.x=!cmd``, ...; :data:`fak.policy.commands.GIT_COMMAND_KEYS`), the same
keys from ``GIT_CONFIG_COUNT``/``GIT_CONFIG_KEY_n``/``GIT_CONFIG_VALUE_n`` and
``GIT_CONFIG_PARAMETERS`` (git-config(1) "ENVIRONMENT") and from ``git config KEY VALUE``,
aliases (a git command's canonical form is added: ``git -c alias.p=push p`` → ``git push``),
sub-commands that run commands (``rebase --exec``, ``bisect run``, ``submodule foreach``,
``filter-branch``, ``difftool --extcmd``, ``grep -O``), and ``GIT_DIR``/``GIT_WORK_TREE``
(added to the canonical form as ``--git-dir``/``--work-tree``, which the write check reads).

:class:`GitRun` is a mixin of :class:`~fak.policy.shell.parser.Parser`.
"""

from __future__ import annotations

from fak.policy import commands as _cmds
from fak.policy import gitcmd as _git
from fak.policy.shell.base import ParserBase
from fak.policy.shell.model import SimpleCommand


class GitRun(ParserBase):
    """Git methods of the parser (see the module docstring)."""

    def _git_config(self, key: str, value: str, vdyn: bool, via: str) -> None:
        """One configuration setting git will use: analyze a command it runs, note a file it
        reads, remember an alias for the git commands that follow."""
        k = key.lower()
        if _cmds.GIT_COMMAND_KEYS.match(key) or (k.startswith("alias.") and value.startswith("!")):
            if vdyn:
                self._note(f"git {via} {key} runs a command computed at run time")
            elif value:
                v = value[1:] if value.startswith("!") else value
                self._parse_string(v, f"git {via} {key}", "", deferred=True)
        elif _git.GIT_PATH_KEYS.match(k):
            self._note(f"git {via} {key} makes git run hooks or read configuration from files "
                       f"the policy cannot see")
        if k.startswith("alias."):
            self.ctx.git_aliases[k[6:]] = None if vdyn else value

    def _git_env(self, var: str) -> None:
        """A ``GIT_CONFIG_*`` variable was assigned: apply what it configures."""
        env = self.ctx.env
        if var == "GIT_CONFIG_PARAMETERS":
            value, vdyn = env[var]
            if vdyn:
                self._note("GIT_CONFIG_PARAMETERS holds configuration computed at run time")
                return
            for item, idyn, _ in self._split_words(value, "GIT_CONFIG_PARAMETERS"):
                key, _, val = item.partition("=")
                self._git_config(key, val, idyn, "GIT_CONFIG_PARAMETERS")
            return
        for prefix in ("GIT_CONFIG_KEY_", "GIT_CONFIG_VALUE_"):
            if var.startswith(prefix):
                n = var[len(prefix):]
                k = env.get("GIT_CONFIG_KEY_" + n)
                v = env.get("GIT_CONFIG_VALUE_" + n)
                if k is None or v is None or (n, k, v) in self.ctx.git_env_done:
                    return
                self.ctx.git_env_done.add((n, k, v))
                if k[1]:
                    self._note(f"GIT_CONFIG_KEY_{n} is only known at run time")
                else:
                    self._git_config(k[0], v[0], v[1], f"GIT_CONFIG_KEY_{n}")
                return

    def _git(self, cmd: SimpleCommand, hops: int) -> None:
        argv, dyn = cmd.argv, cmd.dyn
        ctx = self.ctx
        call = _cmds.parse_git(argv, dyn)
        for key, value, vdyn in call.config:
            self._git_config(key, value, vdyn, "-c")
        sub = call.sub
        if sub is None:
            return
        aliases = dict(ctx.git_aliases)
        aliases.update(call.aliases)
        canon: list[tuple[str, bool, int]] = [("git", False, 0)]
        for var, opt in (("GIT_DIR", "--git-dir="), ("GIT_WORK_TREE", "--work-tree=")):
            if var in ctx.env:
                value, vdyn = ctx.env[var]
                canon.append((opt + value, vdyn, 0))
        name = argv[sub]
        sub_dyn = dyn[sub]
        rest = list(zip(argv[sub + 1:], dyn[sub + 1:], cmd.flags[sub + 1:]))
        seen: set[str] = set()
        while not sub_dyn and name.lower() in aliases and name.lower() not in seen:
            seen.add(name.lower())
            alias = aliases[name.lower()]
            if alias is None:
                sub_dyn = True
                break
            if alias.startswith("!"):
                return      # a shell alias: analyzed with the configuration
            words = self._split_words(alias, "git alias")
            if not words:
                break
            name, sub_dyn = words[0][0], words[0][1]
            rest = words[1:] + rest
        canon.append((name, sub_dyn, 0))
        canon.extend(rest)
        if len(canon) != len(argv) or any(c[0] != a for c, a in zip(canon, argv)):
            self._emit([c[0] for c in canon], [c[1] for c in canon], [c[2] for c in canon], [],
                       cmd.stdin, "git", cmd.cwds, cmd.unknown_operands, cmd.find_roots,
                       hops + 1)
            return
        if not sub_dyn:
            self._git_sub(cmd, sub, hops)

    def _git_sub(self, cmd: SimpleCommand, sub: int, hops: int) -> None:
        """The commands a canonical git command's sub-command runs or configures."""
        argv, dyn = cmd.argv, cmd.dyn
        name = argv[sub]
        via = f"git {name}"
        for kind, idx in _git.sub_programs(argv, dyn, sub):
            if kind == "shell":
                self._run_text(cmd, _git.option_value(argv[idx]), dyn[idx], via)
            elif kind == "joined":
                self._run_text(cmd, " ".join(argv[idx:]), any(dyn[idx:]), via)
            else:
                self._emit(argv[idx:], dyn[idx:], cmd.flags[idx:], [], "", via, cmd.cwds,
                           cmd.unknown_operands, cmd.find_roots, hops + 1)
        if name == "config":
            setting = _git.config_setting(argv, dyn, sub)
            if setting is None:
                return
            key, kdyn, value, vdyn = setting
            if kdyn:
                cmd.note = "git config of a key computed at run time"
                return
            self._git_config(key, value, vdyn, "config")
            if key.lower().startswith("alias.") and not vdyn and not value.startswith("!"):
                words = self._split_words(value, "git alias")
                if words:
                    # what the alias will run, so that rules on git commands see it now
                    self._emit(["git", *[w[0] for w in words]], [False, *[w[1] for w in words]],
                               [0, *[w[2] for w in words]], [], "", "git config alias",
                               cmd.cwds, False, None, hops + 1)
