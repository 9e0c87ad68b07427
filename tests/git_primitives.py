"""Every git execution primitive the wall must hold against, as data (``tests/test_git_wall.py``).

A ``Primitive`` plants files into a workspace: ``config`` is appended to ``.git/config``,
``files`` maps workspace-relative paths to their text (a path under ``.git`` is git metadata; the
others are ordinary work-tree files a model may write), ``executable`` lists the files that get
mode 0755, ``links`` maps paths to symlink targets (relative to the link's folder). In every text
``{fire}`` stands for the planted command: the absolute path of ``evil-bin/<id>``, a work-tree
script the suite plants with every primitive, whose one action is to create the canary file
``CANARY_DIR/<id>`` (``{canary}``; ``touch``); ``{ws}`` is the workspace root and ``{base}`` the
base commit. The suite checks
that no canary file ever appears while fak runs its own git commands.

``control`` is a plain ``git`` invocation (argv after ``git``; ``tty``: with a terminal as its
output) that does run the primitive when git reads the repository's configuration as git
normally does: the suite runs it on a copy of the planted workspace and checks that the canary
appears there, so every plant here is live on the git versions tested. ``control=None`` for a
primitive that no command of a non-interactive clone fires on its own (named with the reason).

To add a primitive, add a ``Primitive`` to ``PRIMITIVES`` (with a control when one exists).
Nothing here is ever put on a shell command line of the host: the texts are written into files,
and git (inside the control, or never) runs them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: every hook git knows (githooks(5)); each runs ``{fire}`` when planted
HOOKS = ("applypatch-msg", "pre-applypatch", "post-applypatch", "pre-commit", "pre-merge-commit",
         "prepare-commit-msg", "commit-msg", "post-commit", "pre-rebase", "post-checkout",
         "post-merge", "pre-push", "pre-receive", "update", "proc-receive", "post-receive",
         "post-update", "reference-transaction", "push-to-checkout", "pre-auto-gc",
         "post-rewrite", "sendemail-validate", "fsmonitor-watchman", "p4-changelist",
         "p4-prepare-changelist", "p4-post-changelist", "p4-pre-submit", "post-index-change")
HOOK = "#!/bin/sh\nexec {fire}\n"


@dataclass(frozen=True)
class Primitive:
    """One way to make git run a command (see the module docstring)."""

    id: str
    config: str = ""
    files: dict[str, str] = field(default_factory=dict)
    executable: tuple[str, ...] = ()
    links: dict[str, str] = field(default_factory=dict)
    control: tuple[str, ...] | None = None
    tty: bool = False
    why_no_control: str = ""
    #: fak refuses to run git at all on such a workspace (``GitError``): the root's ``.git``
    #: itself was replaced
    refused: bool = False


def _hooks(prefix: str) -> dict[str, str]:
    return {f"{prefix}/{h}": HOOK for h in HOOKS}


_NESTED_GITDIR = {  # a complete git folder, for nested repositories and gitdir pointers
    "HEAD": "{base}\n",
    "config": "[core]\n\trepositoryformatversion = 0\n\tbare = false\n\tfsmonitor = {fire}\n",
}

PRIMITIVES: tuple[Primitive, ...] = (
    Primitive("fsmonitor", config="[core]\n\tfsmonitor = {fire}\n", control=("status",)),
    Primitive("hooks", files=_hooks(".git/hooks"), executable=tuple(f".git/hooks/{h}" for h in HOOKS),
              control=("commit", "--allow-empty", "-qm", "x")),
    Primitive("hooks-path", config="[core]\n\thooksPath = evil-hooks\n",
              files=_hooks("evil-hooks"), executable=tuple(f"evil-hooks/{h}" for h in HOOKS),
              control=("commit", "--allow-empty", "-qm", "x")),
    Primitive("diff-external", config="[diff]\n\texternal = {fire}\n", control=("diff",)),
    Primitive("filter-clean", config='[filter "evil"]\n\tclean = {fire}\n',
              files={".gitattributes": "* filter=evil\n"}, control=("add", "-A")),
    Primitive("filter-smudge", config='[filter "evil"]\n\tsmudge = {fire}\n',
              files={".gitattributes": "* filter=evil\n"}, control=("reset", "--hard", "-q")),
    Primitive("filter-process", config='[filter "evil"]\n\tprocess = {fire}\n',
              files={".gitattributes": "* filter=evil\n"}, control=("add", "-A")),
    Primitive("filter-info-attributes", config='[filter "evil"]\n\tclean = {fire}\n',
              files={".git/info/attributes": "* filter=evil\n"}, control=("add", "-A")),
    Primitive("textconv", config='[diff "evil"]\n\ttextconv = {fire}\n',
              files={".gitattributes": "*.py diff=evil\n"}, control=("diff",)),
    Primitive("diff-driver-command", config='[diff "evil"]\n\tcommand = {fire}\n',
              files={".gitattributes": "*.py diff=evil\n"}, control=("diff",)),
    Primitive("merge-driver", config='[merge "evil"]\n\tdriver = {fire}\n',
              files={".gitattributes": "* merge=evil\n"},
              why_no_control="runs only in a merge with a conflict; fak never merges"),
    Primitive("pager", config="[core]\n\tpager = {fire}\n", control=("log", "-1"), tty=True),
    Primitive("pager-command", config="[pager]\n\tlog = {fire}\n", control=("log", "-1"), tty=True),
    Primitive("editor", config="[core]\n\teditor = {fire}\n",
              control=("commit", "--allow-empty")),
    Primitive("sequence-editor", config="[sequence]\n\teditor = {fire}\n",
              control=("rebase", "-i", "--autostash", "HEAD")),
    Primitive("ssh-command", config='[core]\n\tsshCommand = {fire}\n'
                                    '[remote "evil"]\n\turl = ssh://example.invalid/x\n',
              control=("fetch", "evil")),
    Primitive("git-proxy", config='[core]\n\tgitProxy = {fire}\n'
                                  '[remote "evil"]\n\turl = git://example.invalid/x\n',
              control=("fetch", "evil")),
    Primitive("remote-uploadpack", config='[remote "evil"]\n\turl = .\n\tuploadpack = {fire}\n',
              control=("fetch", "evil")),
    Primitive("remote-receivepack", config='[remote "evil"]\n\turl = .\n\treceivepack = {fire}\n',
              control=("push", "evil", "HEAD:refs/heads/evil")),
    Primitive("credential-helper", config="[credential]\n\thelper = !{fire}\n",
              control=("credential", "fill")),
    Primitive("askpass", config="[core]\n\taskPass = {fire}\n", control=("credential", "fill")),
    Primitive("gpg-program", config="[gpg]\n\tprogram = {fire}\n[commit]\n\tgpgSign = true\n",
              control=("commit", "--allow-empty", "-qm", "x")),
    Primitive("alias", config="[alias]\n\tst = !{fire}\n", control=("st",)),
    Primitive("trace2-target", config="[trace2]\n\tnormalTarget = {canary}\n",
              why_no_control="git reads trace2.* from system and global configuration only (a "
                             "write, not a command: GIT_TRACE2 in the environment is tested)"),
    Primitive("alternate-refs-command",
              config="[core]\n\talternateRefsCommand = {fire}\n",
              why_no_control="runs for the alternates of a repository being pushed into"),
    Primitive("uploadpack-hook", config="[uploadpack]\n\tpackObjectsHook = {fire}\n",
              why_no_control="git reads it from protected (system/global/command-line) "
                             "configuration only, never from a repository's"),
    Primitive("include-path", config="[include]\n\tpath = ../evil-include.cfg\n",
              files={"evil-include.cfg": "[core]\n\tfsmonitor = {fire}\n"}, control=("status",)),
    Primitive("include-if", config='[includeIf "gitdir:/"]\n\tpath = ../evil-includeif.cfg\n',
              files={"evil-includeif.cfg": "[core]\n\tfsmonitor = {fire}\n"},
              control=("status",)),
    Primitive("worktree-config",
              config="[core]\n\trepositoryformatversion = 1\n[extensions]\n\tworktreeConfig = true\n",
              files={".git/config.worktree": "[core]\n\tfsmonitor = {fire}\n"},
              control=("status",)),
    Primitive("commondir",
              files={".git/commondir": "../evil-common\n",
                     "evil-common/config": "[core]\n\trepositoryformatversion = 0\n"
                                           "\tbare = false\n\tfsmonitor = {fire}\n"},
              links={"evil-common/objects": "../.git/objects", "evil-common/refs": "../.git/refs"},
              control=("status",)),
    Primitive("submodule-gitdir-file",  # the base tracks vendor/lib as a gitlink
              files={"vendor/lib/.git": "gitdir: ../../evil-subgit\n",
                     **{f"evil-subgit/{k}": v for k, v in _NESTED_GITDIR.items()}},
              links={"evil-subgit/objects": "../.git/objects", "evil-subgit/refs": "../.git/refs"},
              control=("status",)),
    Primitive("submodule-repo",
              files={f"vendor/lib/.git/{k}": v for k, v in _NESTED_GITDIR.items()},
              links={"vendor/lib/.git/objects": "../../../.git/objects",
                     "vendor/lib/.git/refs": "../../../.git/refs"},
              control=("status",)),
    Primitive("submodule-update-command",
              config='[submodule "vendor/lib"]\n\tupdate = !{fire}\n',
              why_no_control="runs at `git submodule update`, which fak never runs"),
    Primitive("nested-gitdir-file",
              files={"pkg/.git": "gitdir: ../evil-nested\n",
                     **{f"evil-nested/{k}": v for k, v in _NESTED_GITDIR.items()}},
              links={"evil-nested/objects": "../.git/objects", "evil-nested/refs": "../.git/refs"},
              why_no_control="an untracked nested repository: git runs its configuration only "
                             "when started inside it, which fak never does"),
    Primitive("nested-repo",
              files={f"pkg/.git/{k}": v for k, v in _NESTED_GITDIR.items()},
              links={"pkg/.git/objects": "../../.git/objects", "pkg/.git/refs": "../../.git/refs"},
              why_no_control="as nested-gitdir-file"),
    Primitive("dotgit-symlink", refused=True,
              files={f"evil-git/{k}": v for k, v in _NESTED_GITDIR.items()},
              links={"evil-git/objects": "../real-git/objects", "evil-git/refs": "../real-git/refs",
                     ".git": "evil-git"},
              control=("status",)),
    Primitive("dotgit-file", refused=True,
              files={**{f"evil-git/{k}": v for k, v in _NESTED_GITDIR.items()},
                     ".git": "gitdir: evil-git\n"},
              links={"evil-git/objects": "../real-git/objects", "evil-git/refs": "../real-git/refs"},
              control=("status",)),
)

#: environment variables a hostile parent process could leave for fak's git (``{fire}``,
#: ``{canary}``, ``{ws}`` as above); the control is ``git status`` with them set
HOSTILE_ENV: dict[str, str] = {
    "GIT_CONFIG_PARAMETERS": "'core.fsmonitor'='{fire}'",
    "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "core.hooksPath", "GIT_CONFIG_VALUE_0": "evil-hooks",
    "GIT_EXTERNAL_DIFF": "{fire}", "GIT_PAGER": "{fire}", "PAGER": "{fire}", "GIT_EDITOR": "{fire}",
    "EDITOR": "{fire}", "VISUAL": "{fire}", "GIT_SSH_COMMAND": "{fire}", "GIT_ASKPASS": "{fire}",
    "SSH_ASKPASS": "{fire}", "GIT_PROXY_COMMAND": "{fire}", "GIT_TRACE2": "{canary}",
    "GIT_TRACE": "{canary}.trace", "GIT_DIR": "/nonexistent-fak-test", "GIT_WORK_TREE": "/",
    "GIT_INDEX_FILE": "/nonexistent-fak-test/index", "GIT_CONFIG_GLOBAL": "{ws}/evil-global.cfg",
    "GIT_CONFIG_SYSTEM": "{ws}/evil-global.cfg",
}
#: what ``HOSTILE_ENV``'s configuration files hold (written into the workspace)
HOSTILE_GLOBAL_CONFIG = "[core]\n\tfsmonitor = {fire}\n"
#: the variables left out of the plain-git control (they make git fail before it runs anything)
HOSTILE_ENV_NOT_IN_CONTROL = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")
