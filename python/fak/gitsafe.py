"""fak's own git: the one function through which fak runs every git command on the host
(``git``), and the one test of whether a path is git metadata (``git_metadata``).

A model can write a workspace's files, and git reads some files as configuration that names
commands to run: ``core.fsmonitor`` runs at ``git status``, ``filter.<name>.clean`` (named by any
``.gitattributes``) at ``git add`` and ``git apply``, ``diff.external`` and textconv drivers at
``git diff``, hooks at ``git commit``/``checkout``, ``include.path`` pulls in any other file. A
deny-list of keys can never be complete (filter and diff driver names are free), so in a
workspace fak's git **never reads the repository's own configuration**:

- ``GIT_DIR`` is the work tree's ``.git`` folder (a real folder, never a symlink or a
  ``gitdir:`` file), ``GIT_WORK_TREE`` the root; no repository discovery.
- ``GIT_COMMON_DIR`` is a private folder fak makes for the one command (outside the workspace):
  its ``config`` is ``FAK_CONFIG`` (nothing that runs anything), and ``objects``, ``refs``,
  ``packed-refs``, ``logs``, ``info``, ``shallow`` are symlinks to the real ones. Git reads its
  configuration from the common folder, so ``.git/config``, its ``include.path``/``includeIf``,
  ``.git/config.worktree`` and ``.git/commondir`` are never opened; hooks are looked up in the
  private folder (none) and ``core.hooksPath`` is ``/dev/null`` on top.
- ``GIT_CONFIG_NOSYSTEM=1``, ``GIT_CONFIG_GLOBAL=/dev/null``, ``GIT_ATTR_NOSYSTEM=1``; the
  environment is built from nothing (``PATH``, ``HOME``, ``LC_ALL=C``, ``TMPDIR`` and the
  variables above; never the caller's ``GIT_*``, pager, editor or askpass variables).
- ``OVERRIDES`` (``-c``) on top, which also reach every git process git itself starts.

With every configuration source fak's own, ``.gitattributes`` is data: it can name a filter or
diff driver, but no driver is defined, so none runs. ``--no-ext-diff --no-textconv`` go on every
``diff``. Submodules are ignored (``diff.ignoreSubmodules=all``): git never starts itself inside
a nested repository, whose configuration a model may have written.

Repositories only fak writes (``mode="trusted"``: the mirrors, a clone before any model saw
it) keep their own configuration (``git remote``, ``git config`` work) with the rest of the
above, and git looks for it at ``root`` only (never in a folder above); ``mode="none"`` runs git
outside any repository (``diff --no-index`` of fak's temporary
files). See ``docs/sandbox.md`` ("fak's own git") for the reasoning and the regression suite.

Needs git >= ``MIN_VERSION`` (2.32: ``GIT_CONFIG_GLOBAL``); ``FAK_GIT`` names the binary (else
``git`` on ``PATH``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path

MIN_VERSION = (2, 32)

#: the whole repository configuration fak's git reads in a workspace
FAK_CONFIG = """\
[core]
\trepositoryformatversion = 0
\tfilemode = true
\tbare = false
\tlogallrefupdates = true
[user]
\tname = fak agent
\temail = agent@fak.invalid
"""

#: ``-c`` settings on every command (they also reach the git processes git starts, through
#: ``GIT_CONFIG_PARAMETERS``): nothing that runs a program, no submodule recursion, no gc
OVERRIDES: tuple[str, ...] = (
    "core.fsmonitor=false", "core.hooksPath=/dev/null", "core.pager=cat", "core.editor=:",
    "sequence.editor=:", "core.askPass=", "credential.helper=", "core.attributesFile=/dev/null",
    "core.excludesFile=/dev/null", "core.untrackedCache=false", "protocol.ext.allow=never",
    "submodule.recurse=false", "diff.ignoreSubmodules=all", "status.submoduleSummary=false",
    "fetch.recurseSubmodules=false", "gc.auto=0", "maintenance.auto=false", "color.ui=false",
    "commit.gpgSign=false", "tag.gpgSign=false", "log.showSignature=false",
    "advice.detachedHead=false",
)
#: more ``-c`` settings in a workspace: no transport at all (no lazy fetch of missing objects)
WORKSPACE_OVERRIDES: tuple[str, ...] = ("protocol.allow=never",)

#: entries of the real ``.git`` the private common folder links to (data, never configuration)
COMMON_LINKS = ("objects", "refs", "packed-refs", "logs", "info", "shallow")

#: variables a caller may set for one command (fak's own private index, commit identity)
CALLER_ENV = frozenset({"GIT_INDEX_FILE", "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_AUTHOR_DATE",
                        "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "GIT_COMMITTER_DATE"})
#: host variables passed on in trusted mode only (fetches of the mirrors)
_NETWORK_ENV = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
                "ALL_PROXY", "all_proxy", "SSL_CERT_FILE", "SSL_CERT_DIR")
MODES = ("workspace", "trusted", "none")


class GitError(RuntimeError):
    """A git command fak ran failed (the message carries git's stderr), or git cannot be run
    safely here (too old, a workspace whose ``.git`` is not a real folder)."""


@lru_cache(maxsize=8)
def _version_of(binary: str) -> tuple[int, ...]:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30,
                             env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"},
                             check=False).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        raise GitError(f"cannot run {binary}: {e}") from None
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", out)
    if m is None:
        raise GitError(f"cannot read the version of {binary} ({out.strip()!r})")
    return tuple(int(x or 0) for x in m.groups())


def git_binary() -> str:
    """The git fak runs: ``$FAK_GIT``, else ``git`` on ``PATH`` (absolute path). Raises
    ``GitError`` when there is none or it is older than ``MIN_VERSION``."""
    name = os.environ.get("FAK_GIT") or "git"
    path = shutil.which(name)
    if path is None:
        raise GitError(f"git not found ({name!r}); install git >= "
                       f"{'.'.join(map(str, MIN_VERSION))} or set FAK_GIT")
    version = _version_of(path)
    if version[:2] < MIN_VERSION:
        raise GitError(f"{path} is git {'.'.join(map(str, version))}; fak needs git >= "
                       f"{'.'.join(map(str, MIN_VERSION))} (GIT_CONFIG_GLOBAL) to keep a "
                       "repository's configuration from running commands")
    return path


def git_version() -> tuple[int, ...]:
    """``(major, minor, patch)`` of ``git_binary()``."""
    return _version_of(git_binary())


def _environment(mode: str, env: Mapping[str, str] | None) -> dict[str, str]:
    out = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C",
           "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_ATTR_NOSYSTEM": "1",
           "GIT_TERMINAL_PROMPT": "0", "GIT_PAGER": "cat", "PAGER": "cat", "GIT_EDITOR": ":",
           "GIT_NO_REPLACE_OBJECTS": "1", "GIT_OPTIONAL_LOCKS": "0"}
    for key in ("HOME", "TMPDIR"):
        if os.environ.get(key):
            out[key] = os.environ[key]
    if mode == "trusted":
        out.update({k: os.environ[k] for k in _NETWORK_ENV if os.environ.get(k)})
    for key, value in (env or {}).items():
        if key not in CALLER_ENV:
            raise ValueError(f"fak.gitsafe.git: {key} cannot be set (allowed: "
                             f"{', '.join(sorted(CALLER_ENV))})")
        out[key] = value
    return out


def _common_dir(git_dir: Path, tmp: Path) -> Path:
    """The private common folder: ``FAK_CONFIG`` and links to the real data."""
    common = tmp / "common"
    common.mkdir()
    (common / "config").write_text(FAK_CONFIG)
    for name in COMMON_LINKS:
        os.symlink(git_dir / name, common / name)
    return common


def _refused(args: list[str], why: str, text: bool) -> subprocess.CompletedProcess:
    msg = f"fak: {why}\n"
    return subprocess.CompletedProcess(args, 128, "" if text else b"", msg if text else msg.encode())


def git(root: str | os.PathLike[str], *args: str, mode: str = "workspace",
        env: Mapping[str, str] | None = None, check: bool = True, text: bool = True,
        input: str | bytes | None = None, timeout: float | None = None
        ) -> subprocess.CompletedProcess:
    """Run ``git args...`` for the repository at ``root`` and return the completed process
    (``stdout``/``stderr`` as ``str`` when ``text``, else ``bytes``; ``input`` fed to stdin).

    ``mode``: ``"workspace"`` (default: a work tree a model may have written; ``root`` must be
    its top, holding a real ``.git`` folder; the repository's configuration, hooks and
    ``gitdir:`` pointers are never read), ``"trusted"`` (a repository only fak writes, bare or
    not: its own configuration is read, nothing else), ``"none"`` (no repository: ``root`` is
    only the working folder). ``env``: variables for this command, only ``CALLER_ENV``
    (``GIT_INDEX_FILE``, commit identity and dates); ``timeout`` in seconds
    (``subprocess.TimeoutExpired`` past it).

    Raises ``GitError`` (git's stderr in the message) when ``check`` and git fails, and also
    when git is missing or older than ``MIN_VERSION``; in workspace mode a ``root`` whose
    ``.git`` is missing, a symlink or a file fails the same way (exit status 128, nothing run)
    . ``ValueError`` for an unknown mode or a variable outside ``CALLER_ENV``.
    """
    if mode not in MODES:
        raise ValueError(f"fak.gitsafe.git: mode must be one of {MODES}, not {mode!r}")
    root = Path(root)
    full_env = _environment(mode, env)
    argv = [git_binary(), "--no-pager"]
    for setting in OVERRIDES + (WORKSPACE_OVERRIDES if mode == "workspace" else ()):
        argv += ["-c", setting]
    argv += ["-C", str(root), *args]
    with tempfile.TemporaryDirectory(prefix="fak-git-") as tmp:
        if mode == "workspace":
            git_dir = root.resolve() / ".git"
            if not os.path.lexists(git_dir):
                proc = _refused(argv, f"{root} is not the top of a git work tree (no .git folder)",
                                text)
            elif git_dir.is_symlink() or not git_dir.is_dir():
                proc = _refused(argv, f"{git_dir} is not a folder (a symlink or a gitdir file): "
                                      "fak does not run git on it", text)
            else:
                full_env.update(GIT_DIR=str(git_dir), GIT_WORK_TREE=str(git_dir.parent),
                                GIT_COMMON_DIR=str(_common_dir(git_dir, Path(tmp))))
                proc = None
        else:  # git looks for a repository at root only, never above it
            full_env["GIT_CEILING_DIRECTORIES"] = str(root.resolve().parent)
            proc = None
            if mode == "none" and (os.path.lexists(root / ".git") or (root / "HEAD").exists()):
                proc = _refused(argv, f"{root} holds a repository; mode 'none' is for folders "
                                      "outside any", text)
        if proc is None:
            proc = subprocess.run(argv, capture_output=True, text=text, env=full_env, input=input,
                                  timeout=timeout, check=False)
    if check and proc.returncode != 0:
        err = proc.stderr if text else proc.stderr.decode("utf-8", "replace")
        raise GitError(f"git {' '.join(args[:3])} failed in {root}: {err.strip()}")
    return proc


# -- git metadata ----------------------------------------------------------------------------

def is_git_name(name: str) -> bool:
    """Whether one path component names git metadata: ``.git`` in any case, also with trailing
    dots or spaces, and its 8.3 short name ``git~1`` (what git's own ``verify_path`` refuses
    with ``core.protectNTFS``/``protectHFS``)."""
    n = name.rstrip(". ").lower()
    return n == ".git" or name.lower() == "git~1"


def names_git_metadata(path: str | os.PathLike[str]) -> bool:
    """Whether any component of ``path`` (as written, ``/``-separated) names git metadata."""
    return any(is_git_name(p) for p in str(path).replace("\\", "/").split("/"))


def git_metadata(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> str | None:
    """Why writing ``path`` (relative to the workspace ``root``, or absolute) would write git
    metadata, or ``None``: a component of the path as given, or of the path with every symlink
    resolved, relative to the resolved root, is ``.git`` (``is_git_name``): the repository's
    ``.git``, a nested repository's ``.git`` folder or ``gitdir:`` file, or a symlink that
    leads into one. The root's own ``gitdir:`` target, when ``.git`` is such a file, counts too.
    """
    root_real = Path(os.path.realpath(root))
    p = Path(path)
    given = p if p.is_absolute() else Path(root) / p
    try:
        rel_given = os.path.relpath(given, root)
    except ValueError:
        rel_given = str(given)
    if names_git_metadata(rel_given) or names_git_metadata(p):
        return f"`{path}` names a .git entry"
    real = Path(os.path.realpath(given))
    try:
        rel = real.relative_to(root_real)
    except ValueError:
        return None  # outside the workspace: the caller's own check refuses it
    if names_git_metadata(rel.as_posix()):
        return f"`{path}` resolves to {rel.as_posix()}, inside a .git entry"
    pointer = root_real / ".git"
    if pointer.is_file() and not pointer.is_symlink():
        m = re.match(r"gitdir:\s*(.+)", pointer.read_text(errors="replace").strip())
        if m:
            target = Path(os.path.realpath(root_real / m.group(1).strip()))
            if real == target or target in real.parents:
                return f"`{path}` is inside the repository's git folder ({target})"
    return None


_PATCH_PATH = re.compile(
    r"^(?:diff --git (?P<a>\S+) (?P<b>\S+)|(?:---|\+\+\+|\*\*\*) (?P<f>[^\t\n]+)(?:\t.*)?"
    r"|(?:rename|copy) (?:from|to) (?P<r>.+)|Index: (?P<i>.+))$", re.M)


def patch_paths(patch: str) -> list[str]:
    """Every path a patch names: ``diff --git`` lines, unified (``---``/``+++``) and context
    (``***``/``---``) headers, rename/copy lines and ``Index:`` lines (GNU patch takes a file
    name from any of them), as written (``a/``/``b/`` prefixes kept, ``/dev/null`` left out).
    Lines of a hunk that look like headers are listed too (harmless: only a refusal follows)."""
    out: list[str] = []
    for m in _PATCH_PATH.finditer(patch):
        for key in ("a", "b", "f", "r", "i"):
            v = m.group(key)
            if v and v.strip() != "/dev/null":
                v = v.strip()
                if len(v) >= 2 and v[0] == v[-1] == '"':
                    v = v[1:-1]
                out.append(v)
    return out


def patch_git_metadata(patch: str) -> str | None:
    """The first path of ``patch`` that names git metadata (``names_git_metadata``), or
    ``None``: such a patch is never applied."""
    for p in patch_paths(patch):
        if names_git_metadata(p):
            return p
    return None
