"""The agent's workspace: a git work tree the tools may touch, and the patch it ends as.

Paths the model gives are resolved inside the workspace root (relative to it, or absolute under it);
anything that leaves the root (``..``, a symlink out) is refused, and so is a write to git metadata
(``resolve_for_write``: ``.git`` and everything under it, a nested repository's ``.git`` folder or
``gitdir:`` file, a symlink that leads into one; ``fak.gitsafe.git_metadata``).

Every git command runs through ``fak.gitsafe.git``, which never reads the repository's own
configuration, hooks or ``gitdir:`` pointers: a model that wrote them cannot make fak's git run
anything (docs/sandbox.md).

The patch is what the official SWE-bench harness applies with ``git apply``: every change to the
work tree against ``base_commit``, new files included, binary-safe. It is taken with
``git add -A`` then ``git diff --cached --binary base_commit`` on a private index file, so the
workspace's own index is left alone.

Junk that is never part of a patch (``JUNK_PATTERNS``): Python byte-code (``__pycache__/``,
``*.pyc``, ``*.pyo``), test and tool caches (``.pytest_cache/``, ``.mypy_cache/``, ``.tox/``,
``.hypothesis/``), build metadata (``*.egg-info/``) and editor swap files (``*.swp``, ``*~``),
plus fak's own scratch (``.fak/``). Only untracked files are filtered; a change to a tracked file is
always in the patch.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import tempfile
from pathlib import Path

from fak.gitsafe import GitError, git, git_metadata, is_git_name

__all__ = ["JUNK_PATTERNS", "Workspace", "WorkspaceError", "git"]

JUNK_PATTERNS: tuple[str, ...] = (
    "__pycache__/",
    "*.pyc",
    "*.pyo",
    ".pytest_cache/",
    ".mypy_cache/",
    ".tox/",
    ".hypothesis/",
    "*.egg-info/",
    "*.swp",
    "*~",
    ".fak/",
)


def _is_junk(path: str) -> bool:
    """Whether a root-relative path is junk by ``JUNK_PATTERNS`` (``dir/`` patterns match any
    folder of that name on the path, the others the file name)."""
    parts = path.rstrip("/").split("/")
    for pat in JUNK_PATTERNS:
        if pat.endswith("/"):
            if any(fnmatch.fnmatch(p, pat[:-1]) for p in parts[:-1]) or \
                    (path.endswith("/") and fnmatch.fnmatch(parts[-1], pat[:-1])):
                return True
        elif fnmatch.fnmatch(parts[-1], pat):
            return True
    return False


#: a git operation on the workspace failed (the message carries git's stderr); the same class as
#: ``fak.gitsafe.GitError``, which every host-side git command raises
WorkspaceError = GitError


class Workspace:
    """A git work tree at ``root`` (absolute, resolved).

    ``resolve(path)`` maps a model-given path to an absolute path inside the root or raises
    ``ValueError``; ``display(path)`` gives it back relative to the root for messages.
    """

    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise WorkspaceError(f"workspace {self.root} is not a directory")

    def resolve(self, path: str | None) -> Path:
        """Absolute path of ``path`` inside the workspace; ``None``/``""``/``"."`` is the root.

        Raises ``ValueError`` when the path leaves the workspace (also through a symlink).
        """
        if path is None or str(path).strip() in ("", "."):
            return self.root
        p = Path(str(path).strip())
        if not p.is_absolute():
            p = self.root / p
        resolved = p.resolve()
        if resolved != self.root and self.root not in resolved.parents:
            raise ValueError(f"path {path!r} is outside the workspace {self.root}")
        return resolved

    def resolve_for_write(self, path: str | None) -> Path:
        """``resolve(path)`` for a tool that writes there. Raises ``ValueError`` also when the
        path is git metadata (``fak.gitsafe.git_metadata``): git would run what a model wrote
        there (hooks, ``core.fsmonitor``, filter drivers), so fak's tools never write it."""
        resolved = self.resolve(path)
        why = git_metadata(self.root, str(path).strip() if path is not None else ".")
        if why is not None:
            raise ValueError(f"{why}: git metadata (.git, a nested repository's .git, or a path "
                             "that leads into one) is never written by the tools, since git runs "
                             "commands that its configuration and hooks name; change the work "
                             "tree's files only")
        return resolved

    def display(self, path: Path) -> str:
        """``path`` relative to the root (``.`` for the root itself)."""
        try:
            rel = path.resolve().relative_to(self.root)
        except ValueError:
            return str(path)
        return str(rel) if str(rel) != "." else "."

    def fingerprint(self) -> str:
        """A short digest of the work tree's changes: the paths ``git status`` lists (untracked
        files one by one, junk of ``JUNK_PATTERNS`` left out) with each one's size and
        modification time (ns), so it changes when a changed file changes again. Cheap (one
        ``git status``); outside a git repository, ``""``."""
        proc = git(self.root, "status", "--porcelain=v1", "-z", "--untracked-files=all",
                   "--no-renames", "--ignore-submodules=all", check=False, text=False)
        if proc.returncode != 0:
            return ""
        h = hashlib.sha256()
        for entry in proc.stdout.decode("utf-8", "surrogateescape").split("\0"):
            if len(entry) < 4:
                continue
            path = entry[3:]
            if _is_junk(path):
                continue
            try:
                st = (self.root / path).lstat()
                stamp = f"{st.st_size}:{st.st_mtime_ns}"
            except OSError:
                stamp = "gone"
            h.update(f"{entry[:2]} {path} {stamp}\0".encode("utf-8", "surrogateescape"))
        return h.hexdigest()[:16]

    def write_junk_excludes(self) -> None:
        """Add ``JUNK_PATTERNS`` to ``.git/info/exclude`` so untracked junk never enters a patch."""
        git_dir = Path(git(self.root, "rev-parse", "--absolute-git-dir").stdout.strip())
        exclude = git_dir / "info" / "exclude"
        exclude.parent.mkdir(parents=True, exist_ok=True)
        existing = exclude.read_text() if exclude.exists() else ""
        missing = [p for p in JUNK_PATTERNS if p not in existing.splitlines()]
        if missing:
            with exclude.open("a") as f:
                f.write("\n# fak: never part of a patch\n" + "\n".join(missing) + "\n")

    def git_metadata_entries(self) -> list[str]:
        """Root-relative paths below the root that git will not take into a patch: folders
        holding a ``.git`` entry (a nested repository, a submodule's checkout, a stray
        ``gitdir:`` file) and entries named like git metadata (``.GIT``, ``.git.``, ``git~1``:
        ``fak.gitsafe.is_git_name``, which ``git add`` refuses). Found by a walk that follows
        no symlink and enters none of them."""
        out = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            rel = Path(dirpath).relative_to(self.root)
            if dirpath != str(self.root) and (".git" in dirnames or ".git" in filenames):
                out.append(rel.as_posix())
                dirnames[:] = []
                continue
            for name in [*dirnames, *filenames]:
                if is_git_name(name) and not (dirpath == str(self.root) and name == ".git"):
                    out.append((rel / name).as_posix())
            dirnames[:] = [d for d in dirnames if not is_git_name(d)]
        return sorted(out)

    def _add_around_git_metadata(self, env: dict[str, str], tmp: Path) -> None:
        """``git add -A`` into the private index without ``git_metadata_entries``: the tracked
        ones (a submodule's checkout, a tracked folder turned into a repository) left out by
        pathspec, the untracked ones by an exclude file. Raises ``WorkspaceError`` when that
        fails too."""
        entries = self.git_metadata_entries()
        tracked: set[str] = set()
        if entries:
            out = git(self.root, "ls-files", "-z", "--", *[f":(literal){e}" for e in entries],
                      env=env).stdout
            tracked = {f for f in out.split("\0") if f}
        tops = [e for e in entries if any(t == e or t.startswith(e + "/") for t in tracked)]
        exclude = tmp / "exclude"
        exclude.write_text("".join("/" + re.sub(r"([\\*?\[\]!# ])", r"\\\1", e) + "\n"
                                   for e in entries if e not in tops))
        git(self.root, "-c", f"core.excludesFile={exclude}", "add", "-A", "--", ".",
            *[f":(exclude,literal){e}" for e in tops], env=env)

    def diff(self, base_commit: str) -> str:
        """The workspace's changes against ``base_commit`` as a ``git apply``-able patch.

        Untracked files are included (``git add -A`` into a private index), binary files as
        ``GIT binary patch`` hunks, junk excluded (see module docstring). When ``git add`` fails on a
        nested repository or an entry named like git metadata (``git_metadata_entries``: a
        model's ``git init`` of a folder with no commit, a broken submodule checkout, a ``.GIT``
        folder), those are left out and the rest is taken (``_add_around_git_metadata``)
        instead of losing the whole patch. Returns ``""`` when nothing changed. Raises
        ``WorkspaceError`` when git fails.
        """
        self.write_junk_excludes()
        with tempfile.TemporaryDirectory(prefix="fak-index-") as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            git(self.root, "read-tree", base_commit, env=env)
            if git(self.root, "add", "-A", env=env, check=False).returncode != 0:
                self._add_around_git_metadata(env, Path(tmp))
            proc = git(self.root, "diff", "--cached", "--binary", "--no-color", "--no-ext-diff",
                       "--no-textconv", "--no-renames", base_commit, env=env, text=False)
        return proc.stdout.decode("utf-8", "surrogateescape")
