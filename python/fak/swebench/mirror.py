"""``fak swebench mirror``: compact mirrors holding only the commits a dataset slice needs.

For each repository of the selected rows, one bare repository ``OUT/OWNER/NAME`` holding every
``base_commit`` and ``environment_setup_commit`` of its rows, each fetched with
``git fetch --depth 1 origin SHA`` from a source: a local mirror (``--from DIR``, laid out
``DIR/OWNER/NAME`` as ``--repos`` is; default ``~/.cache/fak/repos``) or, where that has no
mirror of the repository, ``https://github.com/OWNER/NAME`` (GitHub serves commits by hash).
Each commit gets a branch ``fak/SHA`` so that a clone (``fak.swebench.repos.make_workspace``,
which reads a shallow repository as any other) copies it; and, when the source is local, the
nearest tag of each base commit (``git describe --tags --abbrev=0``) is set on the base commit
itself, as a lightweight tag, so that ``setuptools_scm`` finds a version in a clone that has no
history (the version then reads as that tag rather than ``TAG.devN``; recorded in the manifest,
skipped when two base commits share the tag).

The mirror folder is what ``--repos`` takes on an offline machine; ``OUT/mirror-manifest.json``
lists per repository its commits, tags, source and size in bytes. Re-running adds what is
missing and fetches nothing twice.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import click

from fak.gitsafe import git
from fak.swebench.repos import DEFAULT_CACHE, RepoError, find_mirror


def needed_commits(rows: list[dict[str, Any]]) -> dict[str, dict[str, list[str]]]:
    """``{repo: {"base": [sha...], "setup": [sha...]}}`` of ``rows`` (first-seen order)."""
    out: dict[str, dict[str, list[str]]] = {}
    for r in rows:
        d = out.setdefault(r["repo"], {"base": [], "setup": []})
        if r["base_commit"] not in d["base"]:
            d["base"].append(r["base_commit"])
        setup = r.get("environment_setup_commit")
        if setup and setup not in d["setup"] and setup not in d["base"]:
            d["setup"].append(setup)
    return out


def dir_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (apparent sizes)."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def _has(repo: Path, sha: str) -> bool:
    return git(repo, "cat-file", "-e", f"{sha}^{{commit}}", mode="trusted",
               check=False).returncode == 0


def compact_mirror(repo: str, base: list[str], setup: list[str], out: Path,
                   source_dir: Path | None, tags: bool = True) -> dict[str, Any]:
    """Make or complete ``out/OWNER/NAME`` (see the module docstring); returns its manifest
    entry. Raises ``RepoError`` when a commit cannot be fetched."""
    dest = out / repo
    local = find_mirror(source_dir, repo) if source_dir is not None else None
    source = str(local) if local is not None else f"https://github.com/{repo}"
    if not (dest / "HEAD").is_file():
        dest.mkdir(parents=True, exist_ok=True)
        git(dest, "init", "--bare", "-q", mode="trusted")
    remotes = git(dest, "remote", mode="trusted").stdout.split()
    git(dest, *(["remote", "set-url"] if "origin" in remotes else ["remote", "add"]), "origin", source,
        mode="trusted")
    commits = base + [c for c in setup if c not in base]
    missing = [c for c in commits if not _has(dest, c)]
    if missing:
        proc = git(dest, "fetch", "--quiet", "--depth", "1", "--no-tags", "origin", *missing,
                   mode="trusted", check=False)
        if proc.returncode != 0:
            raise RepoError(f"fetching {len(missing)} commit(s) of {repo} from {source} failed: "
                            f"{proc.stderr.strip()[-600:]}")
    for c in commits:
        if not _has(dest, c):
            raise RepoError(f"commit {c} of {repo} is not in {source}")
        git(dest, "update-ref", f"refs/heads/fak/{c}", c, mode="trusted")
    git(dest, "symbolic-ref", "HEAD", f"refs/heads/fak/{commits[0]}", mode="trusted")
    tagged: dict[str, str] = {}
    skipped: list[str] = []
    if tags and local is not None:
        for c in base:
            proc = git(local, "describe", "--tags", "--abbrev=0", c, check=False, mode="trusted")
            name = proc.stdout.strip()
            if proc.returncode != 0 or not name:
                continue
            have = git(dest, "rev-parse", "-q", "--verify", f"refs/tags/{name}", check=False,
                       mode="trusted")
            if have.returncode == 0 and have.stdout.strip() != c:
                skipped.append(name)
                continue
            git(dest, "update-ref", f"refs/tags/{name}", c, mode="trusted")
            tagged[name] = c
    if missing:
        git(dest, "repack", "-a", "-d", "-q", mode="trusted")
        git(dest, "prune-packed", check=False, mode="trusted")
    return {"repo": repo, "path": str(dest), "source": source, "base_commits": base,
            "setup_commits": [c for c in setup if c not in base], "fetched": missing,
            "tags": tagged, "tags_skipped": skipped, "bytes": dir_bytes(dest)}


@click.command("mirror")
@click.option("--dataset", required=True, help="Rows as JSON/JSONL (or a dataset name).")
@click.option("--filter", "filter_spec", default=None,
              help="smoke | ID,ID,... | REGEX (searched in instance ids).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Folder of compact mirrors OUT/OWNER/NAME (what --repos takes).")
@click.option("--from", "source_dir", type=click.Path(file_okay=False, path_type=Path),
              default=DEFAULT_CACHE, show_default=True,
              help="Local mirrors DIR/OWNER/NAME to fetch from; a repository missing there is "
                   "fetched from GitHub.")
@click.option("--tags/--no-tags", default=True, show_default=True,
              help="Set each base commit's nearest tag on it (setuptools_scm versions).")
@click.option("--live/--no-live", default=None,
              help="Progress bar over the repositories (default: when on a terminal).")
def mirror_cmd(dataset: str, filter_spec: str | None, out_dir: Path, source_dir: Path,
               tags: bool, live: bool | None) -> None:
    """Compact mirrors of the repositories of a dataset slice: only the base_commits and
    environment_setup_commits, shallow (docs/gpu-runbook.md)."""
    from fak.agent.trajectory import write_json_atomic
    from fak.swebench.dataset import DatasetError, apply_filter, load_rows

    try:
        rows = apply_filter(load_rows(dataset), filter_spec)
    except (DatasetError, OSError) as e:
        raise click.ClickException(str(e)) from None
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest_path = out_dir / "mirror-manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        manifest = {"repos": {}}
    from fak.progress import progress_bar

    failed = []
    needed = needed_commits(rows)
    with progress_bar("mirror", total=len(needed), live=live) as bar:
        for repo, need in needed.items():
            bar.update(description=f"mirror {repo} ({len(need['base']) + len(need['setup'])} commits)")
            try:
                entry = compact_mirror(repo, need["base"], need["setup"], out_dir, source_dir, tags)
            except (RepoError, OSError) as e:
                failed.append(repo)
                click.echo(f"{repo}: FAILED {e}", err=True)
                bar.advance(1)
                continue
            bar.advance(1)
            manifest["repos"][repo] = entry
            click.echo(f"{repo}: {len(entry['base_commits'])} base + {len(entry['setup_commits'])} "
                       f"setup commits ({len(entry['fetched'])} fetched from {entry['source']}), "
                       f"{len(entry['tags'])} tags, {entry['bytes'] / 1e6:.1f} MB → {entry['path']}")
    manifest["total_bytes"] = sum(e["bytes"] for e in manifest["repos"].values())
    write_json_atomic(manifest_path, manifest)
    click.echo(f"{len(manifest['repos'])} repositories, {manifest['total_bytes'] / 1e6:.1f} MB "
               f"→ {out_dir} (manifest {manifest_path.name})")
    if failed:
        raise SystemExit(1)
