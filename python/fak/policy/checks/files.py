"""Checks on the files a command deletes, writes or reads: ``rm_recursive_force``,
``rm_outside_workspace``, ``write_outside_workspace``, ``git_hooks``, ``credential_files``.

Paths are resolved as the kernel will (:func:`fak.policy.paths.resolve`), from every directory
the command may run in; a word only known at run time counts as the worst case."""

from __future__ import annotations

import glob as _glob
import os
import re

from fak.gitsafe import names_git_metadata
from fak.policy import commands as _cmds
from fak.policy import writes as _writes
from fak.policy.checks.base import cached_resolve, is_root, path_problem, short
from fak.policy.paths import HARMLESS_WRITE_TARGETS, resolve, within
from fak.policy.shell import GLOB, Analysis, SimpleCommand


def rm_recursive_force(a: Analysis, root: str | None, extra: tuple[str, ...]) -> str | None:
    """``rm`` with recursive and force flags (a dynamic word may be either)."""
    for c in a.commands:
        if c.name == "rm":
            r, f, _, unknown = _cmds.parse_rm(c.argv, c.dyn)
            unknown = unknown or c.unknown_operands
            if (r or unknown) and (f or unknown):
                return short(c.line)
    return None


def rm_outside_workspace(a: Analysis, root: str | None, extra: tuple[str, ...]) -> str | None:
    """Deletions (``rm``, ``unlink``, ``shred``, ``rmdir``, ``find -delete``, ``find -exec rm``)
    outside the workspace, of the workspace root itself, of paths only known at run time, and
    ``find`` deletions from the workspace root that no name or path test selects (``find .
    -delete``, ``find . -type f -exec rm {} +``: the whole workspace)."""
    for c in a.commands:
        name = c.name
        if name in _cmds.DELETERS:
            if c.unknown_operands:
                return f"{short(c.line)}: operands come from data read at run time"
            for i in _cmds.deleted_operands(name, c.argv, c.dyn):
                word = c.argv[i]
                if c.find_roots is not None and "{}" in word:
                    for start in c.find_roots:
                        why = path_problem(c, start, False, False, root, extra, False)
                        if why:
                            return f"{short(c.line)}: find starting point {why}"
                        if not c.find_guarded and is_root(c, start, root):
                            return (f"{short(c.line)}: find from the workspace root without a "
                                    f"-name or -path test deletes everything in it")
                    continue
                why = path_problem(c, word, c.dyn[i], bool(c.flags[i] & GLOB), root, extra, True)
                if why:
                    return f"{short(c.line)}: {why}"
        elif name == "find":
            call = _cmds.find_of(c)
            if call.delete and call.follow:
                return (f"{short(c.line)}: -delete while following symlinks (-L) may leave the "
                        f"workspace")
            if call.delete:
                starts = [(c.argv[i], c.dyn[i]) for i in call.starts] or [(".", False)]
                for word, dyn in starts:
                    why = path_problem(c, word, dyn, False, root, extra, False)
                    if why:
                        return f"{short(c.line)}: {why}"
                    if not call.delete_guarded and is_root(c, word, root):
                        return (f"{short(c.line)}: -delete from the workspace root without a "
                                f"-name or -path test deletes everything in it")
    return None


def _written(c: SimpleCommand):
    """``(word, dynamic, globbed)`` for every path ``c`` writes: redirection targets and the
    files its words name (:func:`fak.policy.writes.written_paths`)."""
    for r in c.redirects:
        if r.writes and not r.procsub and r.target not in HARMLESS_WRITE_TARGETS:
            yield r.target, r.dynamic, False, r
    for i, path in _writes.paths_of(c):
        yield path, c.dyn[i], bool(c.flags[i] & GLOB), None


def write_outside_workspace(a: Analysis, root: str | None, extra: tuple[str, ...]) -> str | None:
    """Files written outside the workspace by redirections or writing commands."""
    for c in a.commands:
        if c.name == "ln":
            why = _link_targets(c, root, extra)
            if why:
                return why
        for word, dyn, globbed, r in _written(c):
            if word in HARMLESS_WRITE_TARGETS:
                continue
            if r is None and c.unknown_operands and c.name != "tee":
                return f"{short(c.line)}: operands come from data read at run time"
            if c.find_roots is not None and "{}" in word:
                continue
            why = path_problem(c, word, dyn, globbed, root, extra, False)
            if why:
                if r is not None:
                    return f"{short(c.line or 'redirection')} {r.op}{short(r.target, 60)}: {why}"
                return f"{short(c.line)}: {why}"
    return None


def _link_targets(c: SimpleCommand, root: str | None, extra: tuple[str, ...]) -> str | None:
    """``ln``: a link whose target resolves outside the workspace is a way out of it (a later
    ``rm -rf link/`` in the same command would follow it before this check could see it)."""
    opts, ops = _cmds.getopt(c.argv, c.dyn, 1, short_arg="tS",
                             long_arg=frozenset({"target-directory", "suffix"}))
    has_target_dir = any(o[0] in ("-t", "--target-directory") for o in opts)
    targets = ops if has_target_dir else ops[:-1] if len(ops) >= 2 else ops
    symbolic = any(o[0] in ("-s", "--symbolic") for o in opts)
    dest = ops[-1] if len(ops) >= 2 and not has_target_dir else None
    for i in targets:
        word = c.argv[i]
        why = path_problem(c, word, c.dyn[i], False, root, extra, False)
        if why is None and symbolic and dest is not None and not word.startswith(("/", "~")):
            # a relative symlink target is resolved from the link's own folder
            base = os.path.dirname(c.argv[dest].rstrip("/")) or "."
            why = path_problem(c, os.path.join(base, word), c.dyn[i] or c.dyn[dest], False,
                               root, extra, False)
        if why:
            return f"{short(c.line)}: link target {why}"
    return None


def _git_metadata_text(real: str, root: str | None) -> bool:
    """Whether the real path ``real`` is git metadata: a ``.git`` component
    (:func:`fak.gitsafe.names_git_metadata`) in its part below the workspace root, or anywhere
    in it when it is outside the root."""
    if root is not None and within(real, root, strict=True):
        real = real[len(root):]
    return names_git_metadata(real)


def git_hooks(a: Analysis, root: str | None, extra: tuple[str, ...]) -> str | None:
    """Writes into git metadata: ``.git`` and everything under it (hooks, ``config``,
    ``info/attributes``, ...), a nested repository's ``.git`` folder or ``gitdir:`` file, as
    written or once symlinks are resolved. Git runs the hooks, and its configuration names
    commands (aliases, ``core.pager``, ``core.fsmonitor``, filter drivers, ...)."""
    for c in a.commands:
        for word, dyn, _, r in _written(c):
            if dyn:
                continue
            if names_git_metadata(os.path.normpath(word)):
                return f"{short(c.line or 'redirection')}: writes `{short(word, 80)}`"
            for cwd in c.cwds:
                real = cached_resolve(c, word, cwd, root)
                if real is not None and _git_metadata_text(real, root):
                    return f"{short(c.line or 'redirection')}: writes `{short(word, 80)}`"
    return None


# ------------------------------------------------------------------------------ credentials

_HOME_SECRETS = (r"\.ssh|\.aws|\.azure|\.gnupg|\.netrc|\.git-credentials|\.pypirc|\.npmrc"
                 r"|\.docker/config\.json|\.kube|\.config/gh|\.config/hub|\.config/gcloud"
                 r"|\.cargo/credentials(?:\.toml)?|\.password-store|\.local/share/keyrings"
                 r"|\.huggingface/token|\.cache/huggingface/token|\.config/openai|\.vault-token"
                 r"|\.terraform\.d/credentials\.tfrc\.json")
_SECRET_PATH = re.compile(
    r"/proc/[^/]+/(?:task/[^/]+/)?environ"
    r"|/(?:root|home/[^/]+)/(?:" + _HOME_SECRETS + r")(?:/.*)?"
    r"|/etc/(?:shadow|gshadow|sudoers|sudoers\.d(?:/.*)?|ssh/ssh_host_[^/]*key)")
_KEY_FILE = re.compile(r"[^/]*(?:\.pem|\.key|\.p12|\.pfx|\.jks|\.keystore)"
                       r"|id_(?:rsa|dsa|ecdsa|ed25519)[^/]*")
# words worth resolving: only these can name a secret (a cheap filter before any system call;
# substring tests, linear in the text, where an alternation regex is not)
_HINTS = ("environ", ".ssh", ".aws", ".azure", ".gnupg", "netrc", "credential", "pypirc", "npmrc",
          ".docker", ".kube", ".config/", "password-store", "keyring", "huggingface", "token",
          "shadow", "sudoers", ".pem", ".key", ".p12", ".pfx", ".jks", "keystore", "id_rsa",
          "id_dsa", "id_ecdsa", "id_ed25519", "vault", "terraform")


_HINT_RE = re.compile("|".join(re.escape(h) for h in _HINTS))
_PATH_MAX = 4096    # bytes in a path the kernel opens (linux/limits.h PATH_MAX)


def _hinted(text: str) -> bool:
    t = text.lower()
    if len(t) < 512:
        return _HINT_RE.search(t) is not None
    return any(h in t for h in _HINTS)
_DYNAMIC_PART = re.compile(r"\$\{[^}]*\}|\$\([^)]*\)|\$[A-Za-z_][A-Za-z0-9_]*|\$[$!#?@*0-9-]"
                           r"|`[^`]*`")


def _home() -> str:
    return os.path.expanduser("~")


def _is_secret(real: str, root: str | None) -> bool:
    home = _home()
    if _SECRET_PATH.fullmatch(real):
        return True
    if home and home != "/" and real.startswith(home + "/"):
        rest = real[len(home) + 1:]
        if re.match(r"(?:" + _HOME_SECRETS + r")(?:/|$)", rest):
            return True
    if _KEY_FILE.fullmatch(os.path.basename(real)) and (root is None or not within(real, root)):
        return True
    return False


def _candidates(word: str, dyn: bool) -> list[str]:
    """The path texts a word may stand for: itself, the value after ``=`` of an option, and
    with run-time parts replaced (``$HOME`` by the home folder, anything else by ``X``)."""
    out = [word]
    if "=" in word and word.startswith("-"):
        out.append(word.split("=", 1)[1])
    if dyn:
        home = _home()
        texts = []
        for w in out:
            w = w.replace("${HOME}", home).replace("$HOME", home)
            texts.append(_DYNAMIC_PART.sub("X", w))
        out = texts
    return out


def credential_files(a: Analysis, root: str | None, extra: tuple[str, ...]) -> str | None:
    """Commands that name credential files or other processes' environments, after quote
    removal and path resolution (``cat ~/.s''sh/id_rsa``, ``cd ~/.ssh && cat id_rsa``, ``cat
    /proc/self/../self/environ``): ``~/.ssh``, ``~/.aws``, ``~/.netrc``, ``~/.config/gh``,
    ``~/.git-credentials``, ``~/.docker/config.json``, ``~/.kube``, ``/etc/shadow``, any
    ``/proc/*/environ``, and key files (``*.pem``, ``*.key``, ``id_rsa``, ...) outside the
    workspace. Globs are matched as patterns and expanded (at most 64 matches)."""
    for c in a.commands:
        for cwd in c.cwds:
            if cwd is not None and cwd != "":
                real = cached_resolve(c, ".", cwd, root)
                if real is not None and _is_secret(real, None) and c.argv:
                    return f"{short(c.line)}: runs in `{short(real, 80)}`"
        dirs = "/".join(cw for cw in c.cwds if cw)     # a word may be read from any of them
        if len(c.line) <= _PATH_MAX:
            hinted = _hinted(dirs + "/" + c.line)
        else:   # a word longer than PATH_MAX cannot be opened (ENAMETOOLONG)
            hinted = any(_hinted(dirs + "/" + w) for w in c.argv if len(w) <= _PATH_MAX)
        if not hinted and not any(_hinted(r.target) for r in c.redirects
                                  if r.op in ("<", "<>") and len(r.target) <= _PATH_MAX):
            continue
        words = [(c.argv[i], c.dyn[i], bool(c.flags[i] & GLOB)) for i in range(1, len(c.argv))]
        words.extend((r.target, r.dynamic, False) for r in c.redirects if r.op in ("<", "<>"))
        for word, dyn, globbed in words:
            if len(word) > _PATH_MAX or (not _hinted(word) and not (
                    dirs and not word.startswith("/") and _hinted(dirs + "/" + word))):
                continue
            for text in _candidates(word, dyn):
                for cwd in c.cwds:
                    real = cached_resolve(c, text, cwd, root)
                    if real is None:
                        continue
                    pattern_hit = (globbed or "*" in text) and _SECRET_PATH.fullmatch(
                        real.replace("*", "X").replace("?", "X")) is not None
                    if pattern_hit or _is_secret(real, root):
                        return f"{short(c.line)}: `{short(word, 80)}` is {short(real, 80)}"
                    if globbed and _hinted(text.replace("*", "").replace("?", "")):
                        pattern = text if text.startswith("/") else os.path.join(
                            resolve(".", cwd, root) or "/", text)
                        for k, match in enumerate(_glob.iglob(os.path.expanduser(pattern))):
                            if k >= 64:
                                break
                            if _is_secret(os.path.realpath(match), root):
                                return (f"{short(c.line)}: `{short(word, 80)}` matches "
                                        f"{short(match, 80)}")
    return None
