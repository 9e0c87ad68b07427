"""What a git command runs and writes, beyond its global options (those are
:func:`fak.policy.commands.parse_git`).

Pure functions over one git command's ``argv``/``dyn`` and the index of its sub-command, from
the git manual pages: git-rebase(1) ``--exec``, git-bisect(1) ``run``, git-submodule(1)
``foreach``, git-filter-branch(1) filters, git-difftool(1)/git-mergetool(1) ``--extcmd``,
git-grep(1) ``--open-files-in-pager``, git-config(1) (setting keys, ``--global``/``--file``),
git-worktree(1), git-archive(1), git-format-patch(1), git-bundle(1), git-init(1) and the
``--output`` option of the diff family.
"""

from __future__ import annotations

import re

from fak.policy.commands import getopt

# configuration keys whose value names files git runs or reads configuration from
GIT_PATH_KEYS = re.compile(r"core\.hookspath|include\.path|includeif\..*\.path", re.IGNORECASE)
# sub-commands the analyzer reads beyond the global options
FOLLOWED_SUBCOMMANDS = frozenset({
    "rebase", "bisect", "submodule", "filter-branch", "difftool", "mergetool", "grep", "config",
    "worktree", "archive", "format-patch", "bundle", "diff", "log", "show", "init"})

_FILTERS = ("--env-filter", "--tree-filter", "--index-filter", "--parent-filter", "--msg-filter",
            "--commit-filter", "--tag-name-filter", "--setup")


def sub_programs(argv: list[str], dyn: list[bool], sub: int) -> list[tuple]:
    """Commands the sub-command at ``argv[sub]`` runs: ``("shell", index)`` for a word that is
    a shell command string (``rebase -x CMD``, ``filter-branch --tree-filter CMD``, ``difftool
    --extcmd=CMD``, ``grep -OCMD``; the text is ``argv[index]`` after any ``--opt=`` prefix, see
    :func:`option_value`), ``("joined", index)`` for words from ``index`` on joined and run by
    a shell (``submodule foreach``), ``("argv", index)`` for a command given as words from
    ``index`` on (``bisect run``)."""
    name = argv[sub]
    n = len(argv)
    out: list[tuple] = []
    if name == "rebase":
        for i in range(sub + 1, n):
            a = argv[i]
            if a in ("-x", "--exec") and i + 1 < n:
                out.append(("shell", i + 1))
            elif a.startswith("--exec=") or (a.startswith("-x") and len(a) > 2):
                out.append(("shell", i))
    elif name == "bisect":
        if sub + 2 < n and argv[sub + 1] == "run":
            out.append(("argv", sub + 2))
    elif name == "submodule":
        i = sub + 1
        while i < n and argv[i].startswith("-") and not dyn[i]:
            i += 1
        if i < n and argv[i] == "foreach":
            i += 1
            while i < n and argv[i] in ("--recursive", "-q", "--quiet"):
                i += 1
            if i < n:
                out.append(("joined", i))
    elif name == "filter-branch":
        for i in range(sub + 1, n):
            a = argv[i]
            if a in _FILTERS and i + 1 < n:
                out.append(("shell", i + 1))
            elif any(a.startswith(f + "=") for f in _FILTERS):
                out.append(("shell", i))
    elif name in ("difftool", "mergetool"):
        for i in range(sub + 1, n):
            a = argv[i]
            if a in ("-x", "--extcmd") and i + 1 < n:
                out.append(("shell", i + 1))
            elif a.startswith("--extcmd=") or (a.startswith("-x") and len(a) > 2):
                out.append(("shell", i))
    elif name == "grep":
        for i in range(sub + 1, n):
            a = argv[i]
            if a == "--":
                break
            if a.startswith("--open-files-in-pager=") or (a.startswith("-O") and len(a) > 2):
                out.append(("shell", i))
    return out


def option_value(word: str) -> str:
    """The value of an option word: ``--exec=CMD`` → ``CMD``, ``-xCMD`` → ``CMD``, ``-OCMD`` →
    ``CMD``; a word without an option prefix is returned as it is."""
    if word.startswith("--") and "=" in word:
        return word.split("=", 1)[1]
    if word.startswith("-") and len(word) > 2 and word[1] in "xO":
        return word[2:]
    return word


_CONFIG_ARG_OPTS = frozenset({"-f", "--file", "--blob", "--type", "--default", "--comment",
                              "--value"})
_CONFIG_NO_SET = frozenset({"--get", "--get-all", "--get-regexp", "--get-urlmatch", "-l",
                            "--list", "--unset", "--unset-all", "--remove-section",
                            "--rename-section", "-e", "--edit", "--get-color",
                            "--get-colorbool", "--show-origin", "--show-scope", "--name-only"})


def config_setting(argv: list[str], dyn: list[bool],
                   sub: int) -> tuple[str, bool, str, bool] | None:
    """For ``git config [options] KEY VALUE`` (or ``git config set KEY VALUE``), ``(key,
    key_dynamic, value, value_dynamic)``; ``None`` when the command sets nothing."""
    i = sub + 1
    n = len(argv)
    if i < n and argv[i] in ("set", "get", "unset", "list", "edit", "rename-section",
                             "remove-section"):
        if argv[i] != "set":
            return None
        i += 1
    ops: list[int] = []
    while i < n:
        a = argv[i]
        if dyn[i] or not a.startswith("-"):
            ops.append(i)
        elif a in _CONFIG_NO_SET:
            return None
        elif a in _CONFIG_ARG_OPTS:
            i += 1
        i += 1
    if len(ops) < 2:
        return None
    k, v = ops[0], ops[1]
    return argv[k], dyn[k], argv[v], dyn[v]


def written_paths(argv: list[str], dyn: list[bool], sub: int | None) -> list[tuple[int, str]]:
    """Paths a git command writes, as ``(word index, path)``: the repository and work tree of
    ``-C``/``--git-dir``/``--work-tree``; ``worktree add PATH``; ``archive -o``;
    ``format-patch -o``; ``--output=`` of the diff family; ``bundle create FILE``; ``config
    --global`` (``~/.gitconfig``), ``--system`` (``/etc/gitconfig``), ``--file F``; ``init
    [DIR]`` and ``--separate-git-dir``."""
    out: list[tuple[int, str]] = []
    end = sub if sub is not None else len(argv)
    i = 1
    while i < end:
        a = argv[i]
        if a in ("-C", "--git-dir", "--work-tree") and i + 1 < end:
            out.append((i + 1, argv[i + 1]))
            i += 1
        elif a.startswith(("--git-dir=", "--work-tree=")):
            out.append((i, a.split("=", 1)[1]))
        i += 1
    if sub is None or dyn[sub]:
        return out
    name = argv[sub]
    n = len(argv)
    if name == "worktree" and sub + 1 < n and argv[sub + 1] == "add":
        _, ops = getopt(argv, dyn, sub + 2, short_arg="bB", long_arg=frozenset({"reason"}))
        if ops:
            out.append((ops[0], argv[ops[0]]))
    elif name in ("archive", "format-patch", "diff", "log", "show", "bundle", "config", "init"):
        for i in range(sub + 1, n):
            a = argv[i]
            if a == "--":
                break
            if name in ("archive", "format-patch") and a in ("-o", "--output",
                                                             "--output-directory") and i + 1 < n:
                out.append((i + 1, argv[i + 1]))
            elif a.startswith(("--output=", "--output-directory=", "--separate-git-dir=")):
                out.append((i, a.split("=", 1)[1]))
            elif name == "init" and a == "--separate-git-dir" and i + 1 < n:
                out.append((i + 1, argv[i + 1]))
            elif name == "config" and a in ("-f", "--file") and i + 1 < n:
                out.append((i + 1, argv[i + 1]))
            elif name == "config" and a == "--global":
                out.append((i, "~/.gitconfig"))
            elif name == "config" and a == "--system":
                out.append((i, "/etc/gitconfig"))
        if name == "bundle" and sub + 2 < n and argv[sub + 1] == "create":
            _, ops = getopt(argv, dyn, sub + 2)
            if ops:
                out.append((ops[0], argv[ops[0]]))
        if name == "init":
            _, ops = getopt(argv, dyn, sub + 1, long_arg=frozenset(
                {"template", "separate-git-dir", "object-format", "ref-format", "shared",
                 "initial-branch"}), short_arg="b")
            if ops:
                out.append((ops[0], argv[ops[0]]))
    return out
