"""Task repositories: local mirrors, the GitHub fallback, and workspaces at ``base_commit``.

A mirror folder (``--repos DIR``) holds one git repository per task repository, laid out
``DIR/OWNER/NAME`` (bare or with a work tree; ``NAME.git`` and ``OWNER__NAME`` are accepted too).
Without one, the repository is cloned once from ``https://github.com/OWNER/NAME`` into a bare
mirror under the cache folder (``~/.cache/fak/repos``, or ``$FAK_REPOS_CACHE``) and reused.

A workspace is a local clone of the mirror checked out (detached) at ``base_commit`` in which every
branch, the remote, and every tag not in ``base_commit``'s history are then deleted, so the model
cannot see the repository's later history with ``git log --all`` (the official harness does the
same with its instance images; tags of the past stay, as there: ``setuptools_scm`` versions need
them). The objects of later commits stay in the clone's object store, reachable only by hash.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from fak.agent.workspace import Workspace
from fak.gitsafe import GitError, git

DEFAULT_CACHE = Path(os.environ.get("FAK_REPOS_CACHE", Path.home() / ".cache" / "fak" / "repos"))


class RepoError(RuntimeError):
    """A repository that cannot be found, cloned or checked out; the message says what to do."""


def find_mirror(repos_dir: Path, repo: str) -> Path | None:
    """The mirror of ``repo`` (``OWNER/NAME``) under ``repos_dir``, or ``None``."""
    owner, name = repo.split("/", 1)
    for cand in (repos_dir / owner / name, repos_dir / owner / f"{name}.git",
                 repos_dir / f"{owner}__{name}", repos_dir / f"{owner}__{name}.git"):
        if cand.is_dir() and ((cand / ".git").exists() or (cand / "HEAD").is_file()):
            return cand
    return None


def _has_commit(repo_path: Path, commit: str) -> bool:
    proc = git(repo_path, "cat-file", "-e", f"{commit}^{{commit}}", mode="trusted", check=False)
    return proc.returncode == 0


def ensure_mirror(repo: str, repos_dir: Path | None = None, cache_dir: Path | None = None,
                  commit: str | None = None) -> Path:
    """A local repository for ``repo`` that contains ``commit``.

    Looks in ``repos_dir`` (when given, and only there), else in the cache, else clones
    ``https://github.com/{repo}`` as a bare mirror into the cache. Raises ``RepoError`` when the
    mirror is missing, the clone fails (no network), or ``commit`` is not in it.
    """
    if repos_dir is not None:
        mirror = find_mirror(Path(repos_dir), repo)
        if mirror is None:
            raise RepoError(f"no mirror of {repo} in {repos_dir} (expected {repos_dir}/{repo}); "
                            f"make one with: git clone --mirror https://github.com/{repo} "
                            f"{repos_dir}/{repo}")
    else:
        cache = Path(cache_dir or DEFAULT_CACHE)
        mirror = find_mirror(cache, repo) or cache / repo
        if not mirror.exists():
            mirror.parent.mkdir(parents=True, exist_ok=True)
            tmp = mirror.with_name(mirror.name + ".partial")
            shutil.rmtree(tmp, ignore_errors=True)
            url = f"https://github.com/{repo}"
            proc = git(tmp.parent, "clone", "--quiet", "--mirror", url, str(tmp), mode="trusted",
                       check=False)
            if proc.returncode != 0:
                shutil.rmtree(tmp, ignore_errors=True)
                raise RepoError(f"cloning {url} failed: {proc.stderr.strip()}; on an offline "
                                "machine pass --repos DIR with local mirrors DIR/OWNER/NAME")
            tmp.rename(mirror)
    if commit and not _has_commit(mirror, commit):
        raise RepoError(f"commit {commit} of {repo} is not in {mirror}; update the mirror "
                        "(git fetch --all) or use a full clone")
    return mirror


def make_workspace(mirror: Path, base_commit: str, dest: Path) -> Workspace:
    """A fresh clone of ``mirror`` at ``dest``, detached at ``base_commit``, with no refs but HEAD.

    ``dest`` is replaced if it exists. Raises ``RepoError`` on a git failure.
    """
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    # the mirror and the fresh clone are fak's own (no model has seen them): trusted mode
    proc = git(dest.parent, "clone", "--quiet", "--no-checkout", "--local", str(mirror), str(dest),
               mode="trusted", check=False)
    if proc.returncode != 0:
        raise RepoError(f"cloning {mirror} into {dest} failed: {proc.stderr.strip()}")
    try:
        git(dest, "checkout", "--quiet", "--detach", base_commit, mode="trusted")
        git(dest, "remote", "remove", "origin", mode="trusted", check=False)  # its refs go too
        # keep the tags of base_commit's history (setuptools_scm versions need them), as the
        # harness keeps tags older than base_commit; drop every branch and every later tag
        kept = set(git(dest, "tag", "--merged", base_commit, "--format=%(refname)",
                       mode="trusted").stdout.split())
        refs = [r for r in git(dest, "for-each-ref", "--format=%(refname)",
                               mode="trusted").stdout.split() if r not in kept]
        if refs:
            git(dest, "update-ref", "--no-deref", "--stdin", mode="trusted",
                input="".join(f"delete {r}\n" for r in refs))
        git(dest, "reflog", "expire", "--expire=now", "--all", mode="trusted", check=False)
        git(dest, "config", "user.email", "agent@fak.invalid", mode="trusted")
        git(dest, "config", "user.name", "fak agent", mode="trusted")
    except GitError as e:
        raise RepoError(str(e)) from None
    ws = Workspace(dest)
    ws.write_junk_excludes()
    return ws


def read_file_at(mirror: Path, commit: str, path: str) -> str | None:
    """The text of ``path`` at ``commit`` in ``mirror``, or ``None`` when it does not exist."""
    proc = git(mirror, "show", f"{commit}:{path}", mode="trusted", check=False)
    return proc.stdout if proc.returncode == 0 else None
