"""The wall around fak's own git (issue 26; ``fak.gitsafe``, docs/sandbox.md "fak's own git").

Every git execution primitive of ``tests/git_primitives.py`` is planted into a workspace by each
route a model has — the ``write``/``edit`` tools, the pipeline's search/replace edits, a
model-written patch applied by fak (``eval --local`` and the pipeline's test stage), ``bash``
inside the sandbox — and directly by Python (a route not thought of: the wall must hold even
then). Then every git operation fak runs on the host (``HOST_OPS``: the tool box's fingerprint,
patch capture, search, the not-found hint, the pipeline's patch, apply and reset, ``eval
--local``'s apply and undo, the task set-up commit) runs on it, and no canary file may appear.
Each primitive's control runs plain git on a copy and must fire its canary, so every plant is
live on the git versions tested (each git >= 2.32 found on this machine: ``GITS``).

The positive side: on an ordinary workspace fak's git gives the same patch as plain git, and it
applies.

Hostile texts live in ``git_primitives.py`` as data and are written into files by Python; the
only shell lines here are fak's own ``cp``/``cat`` commands inside the sandbox. To add a
primitive, add it to ``git_primitives.PRIMITIVES``; to add a host operation, add it to
``HOST_OPS``.
"""

from __future__ import annotations

import os
import pty
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from git_primitives import (
    HOSTILE_ENV,
    HOSTILE_ENV_NOT_IN_CONTROL,
    HOSTILE_GLOBAL_CONFIG,
    PRIMITIVES,
    Primitive,
)

from fak.agent.exceptions import ToolError
from fak.agent.search import Searcher, list_files
from fak.agent.tools import ToolBox
from fak.agent.workspace import Workspace
from fak.gitsafe import (
    GitError,
    _version_of,
    git,
    git_metadata,
    names_git_metadata,
    patch_git_metadata,
    patch_paths,
)
from fak.policy import Policy
from fak.sandbox import Sandbox, probe
from fak.swebench.local import LocalGrader
from fak.swebench.pipeline.edits import EditError, make_patch
from fak.swebench.pipeline.execute import run_in_sandbox
from fak.swebench.pipeline.repair import evaluate
from fak.swebench.pipeline.source import Repo
from fak.swebench.pipeline.testing import TaskEnv
from fak.swebench.repos import make_workspace

ROOT = Path(__file__).resolve().parent.parent
POLICY = ROOT / "examples" / "swebench-coding-agent-policy.json"


def _gits() -> list[str]:
    found = []
    for cand in (shutil.which("git"), "/usr/bin/git", "/usr/local/bin/git"):
        if cand and os.path.exists(cand):
            real = os.path.realpath(cand)
            if real not in [os.path.realpath(g) for g in found] and _version_of(cand)[:2] >= (2, 32):
                found.append(cand)
    return found


GITS = _gits()
BY_ID = {p.id: p for p in PRIMITIVES}


@pytest.fixture(params=GITS, ids=lambda g: "git" + ".".join(map(str, _version_of(g))))
def git_bin(request, monkeypatch) -> str:
    """Each git >= 2.32 of this machine, as the one fak runs (``FAK_GIT``)."""
    monkeypatch.setenv("FAK_GIT", request.param)
    return request.param


def _plain_env(home: Path) -> dict[str, str]:
    """The environment of plain git in the fixtures and controls: no system or user
    configuration of this machine, an identity, an empty home."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LC_ALL": "C",
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t.invalid",
            "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t.invalid"}


@pytest.fixture()
def mirror(tmp_path: Path) -> tuple[Path, str]:
    """A task repository (its mirror): Python files, a README, tests, and a submodule
    (``vendor/lib``, a gitlink with its ``.gitmodules`` entry, never initialized). Returns
    (mirror, base commit)."""
    m = tmp_path / "mirror"
    (m / "pkg").mkdir(parents=True)
    (m / "tests").mkdir()
    (m / "calc.py").write_text("def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n")
    (m / "pkg" / "__init__.py").write_text("")
    (m / "pkg" / "util.py").write_text("def twice(x):\n    return 2 * x\n")
    (m / "README.md").write_text("# calc\n\nA calculator.\n")
    (m / "tests" / "test_calc.py").write_text("from calc import add\n\n\ndef test_add():\n"
                                              "    assert add(1, 2) == 3\n")
    (m / ".gitmodules").write_text('[submodule "vendor/lib"]\n\tpath = vendor/lib\n\turl = ./lib\n')
    env = _plain_env(tmp_path)

    def run(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=m, env=env, check=True, capture_output=True,
                              text=True).stdout.strip()

    run("init", "-q", "-b", "main")
    run("add", "-A")
    run("commit", "-qm", "first")
    first = run("rev-parse", "HEAD")
    run("update-index", "--add", "--cacheinfo", f"160000,{first},vendor/lib")
    run("commit", "-qm", "base")
    return m, run("rev-parse", "HEAD")


def _workspace(mirror: tuple[Path, str], dest: Path) -> tuple[Path, str]:
    """A fak workspace of the mirror (``make_workspace``) with the model's fix in ``calc.py``."""
    m, base = mirror
    ws = make_workspace(m, base, dest)
    (ws.root / "calc.py").write_text((ws.root / "calc.py").read_text().replace("a - b", "a + b"))
    (ws.root / "vendor" / "lib").mkdir(parents=True, exist_ok=True)
    return ws.root, base


def _subst(text: str, prim: Primitive, root: Path, canary_dir: Path, base: str) -> str:
    return (text.replace("{fire}", str(root / "evil-bin" / prim.id))
            .replace("{canary}", str(canary_dir / prim.id))
            .replace("{ws}", str(root)).replace("{base}", base))


def _plant_direct(root: Path, prim: Primitive, canary_dir: Path, base: str) -> None:
    """Plant ``prim`` with Python, past every route's check (the wall must hold anyway)."""
    script = root / "evil-bin" / prim.id
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(f"#!/bin/sh\ntouch {canary_dir / prim.id}\n")
    script.chmod(0o755)
    if prim.refused:
        (root / ".git").rename(root / "real-git")
    if prim.config:
        with (root / ".git" / "config").open("a") as f:
            f.write(_subst(prim.config, prim, root, canary_dir, base))
    for rel, text in prim.files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        with p.open("a") as f:  # several primitives may share a file (.gitattributes)
            f.write(_subst(text, prim, root, canary_dir, base))
    for rel in prim.executable:
        (root / rel).chmod(0o755)
    for rel, target in prim.links.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, root / rel)


_README_PATCH = ("diff --git a/README.md b/README.md\n--- a/README.md\n+++ b/README.md\n"
                 "@@ -1,3 +1,3 @@\n # calc\n \n-A calculator.\n+A small calculator.\n")


def _host_ops(root: Path, base: str, tmp: Path) -> dict[str, Callable[[], object]]:
    """Every git operation fak runs on the host against a workspace, by the code that runs it."""
    ws = Workspace(root)
    old = "def twice(x):\n    return 2 * x\n"

    def not_found() -> None:
        with pytest.raises(ToolError):
            ToolBox(ws).execute("read", {"path": "nowhere/calc.py"})

    def setup_commit() -> None:  # swebench.run._task_env and pipeline.testing.prepare
        git(root, "commit", "--quiet", "--allow-empty", "--no-verify", "-am", "fak: task setup")
        git(root, "rev-parse", "HEAD")

    grader = LocalGrader(rows={}, output=tmp / "grade")
    (tmp / "grade").mkdir(exist_ok=True)
    return {
        "fingerprint": ws.fingerprint,
        "search": lambda: Searcher(root).grep("def", "."),
        "search-regex": lambda: Searcher(root).grep(r"def \w+\(", ".", regex=True),
        "word-counts": lambda: Searcher(root).word_counts("add"),
        "list-files": lambda: list_files(root),
        "not-found-hint": not_found,
        "junk-excludes": ws.write_junk_excludes,
        "patch-capture": lambda: ws.diff(base),
        "pipeline-make-patch": lambda: make_patch({"pkg/util.py": (old, old.replace("2", "3"))}),
        "pipeline-apply": lambda: TaskEnv(root, {}, "").apply(_README_PATCH),
        "eval-apply": lambda: grader._apply_model_patch(root, _README_PATCH, tmp / "grade"),
        "task-setup-commit": setup_commit,
        "fingerprint-after": ws.fingerprint,
        "patch-capture-after": lambda: ws.diff(base),
        "pipeline-reset": lambda: TaskEnv(root, {}, "").reset(),
    }


def _run_host_ops(root: Path, base: str, tmp: Path, canary_dir: Path,
                  refused: bool = False) -> dict[str, str]:
    """Run ``_host_ops``; returns op → ``ok`` or the ``GitError`` (allowed only when fak must
    refuse the workspace). Fails at once when a canary appeared."""
    out = {}
    for name, op in _host_ops(root, base, tmp).items():
        try:
            op()
            out[name] = "ok"
        except GitError as e:
            if not refused:
                raise AssertionError(f"{name}: {e}") from None
            out[name] = f"GitError: {e}"
        fired = sorted(p.name for p in canary_dir.iterdir())
        assert not fired, f"planted commands ran on the host at {name}: {fired}"
    return out


def _control(prim: Primitive, git_bin: str, root: Path, canary_dir: Path, home: Path) -> None:
    """Plain git, reading the repository's configuration as usual, fires the primitive."""
    env = _plain_env(home)
    stdin = b"protocol=https\nhost=example.invalid\n\n"
    argv = [git_bin, *prim.control]
    if prim.tty:  # a pager runs only when git writes to a terminal
        main, sub = pty.openpty()
        try:
            subprocess.run(argv, cwd=root, env={**env, "TERM": "xterm"}, stdin=subprocess.DEVNULL,
                           stdout=sub, stderr=sub, timeout=60, check=False)
        finally:
            os.close(sub)
            os.close(main)
    else:
        subprocess.run(argv, cwd=root, env=env, input=stdin, capture_output=True, timeout=60,
                       check=False)
    assert (canary_dir / prim.id).exists(), f"control: plain {' '.join(prim.control)} did not fire {prim.id}"


# -- the wall: a plant by any route, fak's host-side git --------------------------------------

@pytest.mark.parametrize("prim", PRIMITIVES, ids=lambda p: p.id)
def test_planted_primitive_never_runs_in_fak_git(prim, git_bin, mirror, tmp_path):
    """Planted past every route's check: no host operation of fak runs it; plain git does."""
    canary = tmp_path / "canary"
    canary.mkdir()
    root, base = _workspace(mirror, tmp_path / "ws")
    _plant_direct(root, prim, canary, base)
    config_before = (root / ".git" / "config").read_bytes() if not prim.refused else None
    results = _run_host_ops(root, base, tmp_path, canary, refused=prim.refused)
    if prim.refused:
        assert results["patch-capture"].startswith("GitError") and "not a folder" in results["patch-capture"]
    else:
        assert all(v == "ok" for v in results.values()), results
        assert (root / ".git" / "config").read_bytes() == config_before
    if prim.control is None:
        assert prim.why_no_control
        return
    croot, _ = _workspace(mirror, tmp_path / "control")
    ccanary = tmp_path / "control-canary"
    ccanary.mkdir()
    _plant_direct(croot, prim, ccanary, base)
    _control(prim, git_bin, croot, ccanary, tmp_path)


def _compatible() -> list[Primitive]:
    """The primitives that can share one workspace: not those replacing the root's .git, and
    only the first of two that plant the same nested .git."""
    out: list[Primitive] = []
    taken: set[str] = set()
    for prim in PRIMITIVES:
        nested = {r.split("/.git")[0] for r in [*prim.files, *prim.links] if "/.git" in r}
        if prim.refused or nested & taken:
            continue
        taken |= nested
        out.append(prim)
    return out


def _plant_all(root: Path, canary: Path, base: str) -> list[str]:
    for prim in _compatible():
        _plant_direct(root, prim, canary, base)
    return [p.id for p in _compatible()]


def test_every_primitive_at_once(git_bin, mirror, tmp_path):
    canary = tmp_path / "canary"
    canary.mkdir()
    root, base = _workspace(mirror, tmp_path / "ws")
    planted = _plant_all(root, canary, base)
    assert len(planted) >= len(PRIMITIVES) - 4
    results = _run_host_ops(root, base, tmp_path, canary)
    assert all(v == "ok" for v in results.values()), results


def test_hostile_environment_never_reaches_fak_git(git_bin, mirror, tmp_path, monkeypatch):
    """Variables a parent process left (``GIT_CONFIG_PARAMETERS``, ``GIT_DIR``, pagers, editors,
    askpass, traces, ...): fak's git builds its environment from nothing."""
    canary = tmp_path / "canary"
    canary.mkdir()
    root, base = _workspace(mirror, tmp_path / "ws")
    prim = Primitive("hostile-env", files={"evil-global.cfg": HOSTILE_GLOBAL_CONFIG,
                                           **{f"evil-hooks/{h}": "#!/bin/sh\nexec {fire}\n"
                                              for h in ("post-commit", "post-checkout")}},
                     executable=("evil-hooks/post-commit", "evil-hooks/post-checkout"))
    _plant_direct(root, prim, canary, base)
    hostile = {k: _subst(v, prim, root, canary, base) for k, v in HOSTILE_ENV.items()}
    for k, v in hostile.items():
        monkeypatch.setenv(k, v)
    _run_host_ops(root, base, tmp_path, canary)
    for k in hostile:
        monkeypatch.delenv(k)
    control = {k: v for k, v in hostile.items() if k not in HOSTILE_ENV_NOT_IN_CONTROL}
    subprocess.run([git_bin, "status"], cwd=root, env={**_plain_env(tmp_path), **control},
                   capture_output=True, timeout=60, check=False)
    assert list(canary.iterdir()), "control: plain git with the hostile environment fired nothing"


# -- the routes a model has --------------------------------------------------------------------

def _route_files(root: Path, canary: Path, base: str) -> dict[str, str]:
    """What a model would try to write, path → text: every primitive's files, plus the config
    additions as a new ``.git/config`` (the routes below must refuse every git-metadata path)."""
    out: dict[str, str] = {}
    config = (root / ".git" / "config").read_text()
    for prim in _compatible():
        if prim.config:
            config += _subst(prim.config, prim, root, canary, base)
        for rel, text in prim.files.items():
            out[rel] = out.get(rel, "") + _subst(text, prim, root, canary, base)
    out[".git/config"] = config
    return out


def _scripts(root: Path, canary: Path) -> None:
    for prim in PRIMITIVES:
        s = root / "evil-bin" / prim.id
        s.parent.mkdir(parents=True, exist_ok=True)
        s.write_text(f"#!/bin/sh\ntouch {canary / prim.id}\n")
        s.chmod(0o755)


def test_write_and_edit_tools_refuse_git_metadata(git_bin, mirror, tmp_path):
    canary = tmp_path / "canary"
    canary.mkdir()
    root, base = _workspace(mirror, tmp_path / "ws")
    _scripts(root, canary)
    box = ToolBox(Workspace(root))
    git_before = {p: p.read_bytes() for p in (root / ".git").rglob("*") if p.is_file()}
    os.symlink(".git", root / "dotgit-link")            # symlinks a bash step could have made
    os.symlink(".git/config", root / "config-link")
    os.symlink("../.git/hooks", root / "pkg" / "hooks-link")
    refused, written = [], []
    for rel, text in _route_files(root, canary, base).items():
        try:
            box.execute("write", {"path": rel, "content": text})
            written.append(rel)
        except ToolError as e:
            assert "git metadata" in str(e) and "not changed" in str(e), str(e)
            refused.append(rel)
    for rel in ("dotgit-link/config", "config-link", "pkg/hooks-link/post-commit", ".GIT/config",
                ".git./config", "pkg/.git", "vendor/lib/.git/config", str(root / ".git" / "config")):
        with pytest.raises(ToolError, match="git metadata"):
            box.execute("write", {"path": rel, "content": "[core]\n\tfsmonitor = x\n"})
    for rel in (".git/config", "config-link", "dotgit-link/config"):
        with pytest.raises(ToolError, match="git metadata"):
            box.execute("edit", {"path": rel, "old": "[core]", "new": "[core]\n\tfsmonitor = x"})
    assert all(names_git_metadata(r) for r in refused)
    assert not any(names_git_metadata(r) for r in written)
    assert ".git/config" in refused and "pkg/.git" in refused and ".gitattributes" in written
    git_after = {p: p.read_bytes() for p in (root / ".git").rglob("*") if p.is_file()}
    assert git_after.keys() >= git_before.keys()
    assert all(git_after[p] == v for p, v in git_before.items() if p.name != "index")
    _run_host_ops(root, base, tmp_path, canary)


def test_policy_denies_git_metadata_writes(tmp_path):
    """The coding-agent policy says the same as the tools (defence in depth, audited)."""
    root = tmp_path / "ws"
    (root / ".git").mkdir(parents=True)
    (root / "src").mkdir()
    os.symlink(".git", root / "lnk")
    policy = Policy.load(POLICY)
    for tool, args in [("write", {"path": ".git/config", "content": "x"}),
                       ("write", {"path": "src/.git", "content": "gitdir: x"}),
                       ("write", {"path": "lnk/hooks/post-commit", "content": "x"}),
                       ("edit", {"path": ".Git/config", "old": "a", "new": "b"}),
                       ("edit", {"path": "lnk/config", "old": "a", "new": "b"})]:
        v = policy.decide(tool, args, conversation="c", workspace_root=str(root))
        assert not v.allowed and v.rule == f"tools.{tool}.paths[0].git_metadata", (args, v)
        assert "git metadata" in v.reason
    for cmd in ("cp x .git/hooks/pre-commit", "cat a >> sub/.git/config", "echo x > lnk/config",
                "mkdir -p pkg/.git", "tee .git/info/attributes < x"):
        v = policy.decide("bash", {"command": cmd}, conversation="c", workspace_root=str(root))
        assert not v.allowed and "git metadata" in v.reason, (cmd, v)
    for tool, args in [("write", {"path": "src/a.py", "content": "x"}),
                       ("write", {"path": ".gitattributes", "content": "* text=auto"}),
                       ("write", {"path": "src/.gitignore", "content": "x"}),
                       ("read", {"path": ".git/config"})]:
        assert policy.decide(tool, args, conversation="c", workspace_root=str(root)).allowed, args


def test_pipeline_edits_refuse_git_metadata(git_bin, mirror, tmp_path):
    canary = tmp_path / "canary"
    canary.mkdir()
    root, base = _workspace(mirror, tmp_path / "ws")
    _scripts(root, canary)
    config = (root / ".git" / "config").read_text()
    repo = Repo(root, base)
    loc = {"path": "calc.py", "start": 1, "end": 2}
    for target in (".git/config", "pkg/.git", "vendor/lib/.git/config", ".git/hooks/post-commit"):
        answer = (f"### {target}\n<<<<<<< SEARCH\n[core]\n=======\n[core]\n\tfsmonitor = "
                  f"{root / 'evil-bin' / 'fsmonitor'}\n>>>>>>> REPLACE\n")
        status, _, changes = evaluate(repo, answer, loc)
        assert status == "bad_path" and not changes, (target, status)
        with pytest.raises(EditError, match="not a repository file path"):
            make_patch({target: (config, config + "[core]\n\tfsmonitor = x\n")})
    with pytest.raises(EditError):
        make_patch({"../outside.py": ("", "x")})
    assert (root / ".git" / "config").read_text() == config
    _run_host_ops(root, base, tmp_path, canary)


def _new_file_patch(path: str, text: str, mode: str = "100644") -> str:
    lines = text.splitlines()
    body = "".join(f"+{ln}\n" for ln in lines)
    return (f"diff --git a/{path} b/{path}\nnew file mode {mode}\n--- /dev/null\n+++ b/{path}\n"
            f"@@ -0,0 +1,{len(lines)} @@\n{body}")


def _append_patch(path: str, old: str, added: str) -> str:
    old_lines, new_lines = old.splitlines(), added.splitlines()
    ctx = old_lines[-3:]
    start = len(old_lines) - len(ctx) + 1
    body = "".join(f" {ln}\n" for ln in ctx) + "".join(f"+{ln}\n" for ln in new_lines)
    return (f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n"
            f"@@ -{start},{len(ctx)} +{start},{len(ctx) + len(new_lines)} @@\n{body}")


def test_model_patches_never_write_git_metadata(git_bin, mirror, tmp_path):
    """A model-written patch (``eval --local``, the pipeline's test stage): git apply on the host
    through fak.gitsafe, GNU patch in the sandbox; a patch naming .git is never applied."""
    assert probe().ok, probe().detail
    canary = tmp_path / "canary"
    canary.mkdir()
    root, base = _workspace(mirror, tmp_path / "ws")
    _scripts(root, canary)
    config = (root / ".git" / "config").read_text()
    fire = root / "evil-bin" / "fsmonitor"
    patches = [
        _append_patch(".git/config", config, f"[core]\n\tfsmonitor = {fire}"),
        _new_file_patch(".git/hooks/post-checkout", f"#!/bin/sh\nexec {fire}", "100755"),
        _new_file_patch(".git/config.worktree", f"[core]\n\tfsmonitor = {fire}"),
        _new_file_patch("pkg/.git", "gitdir: ../evil-nested"),
        _new_file_patch("vendor/lib/.git/config", f"[core]\n\tfsmonitor = {fire}"),
        _new_file_patch("x/../.git/info/attributes", "* filter=evil"),
        _new_file_patch(".GIT/config", f"[core]\n\tfsmonitor = {fire}"),
    ]
    grader = LocalGrader(rows={}, output=tmp_path / "grade")
    tenv = TaskEnv(root, {}, "")
    for patch in patches:
        assert patch_git_metadata(patch) is not None, patch
        assert grader._apply_model_patch(root, patch, tmp_path) is None
        assert tenv.apply(patch) is False
        # past fak's check: git apply refuses every one; GNU patch in the sandbox cannot write
        # the read-only .git, but it does write a nested pointer (pkg/.git), which is why fak
        # checks first; what it left stays planted for the host operations below
        assert git(root, "apply", "-", input=patch, check=False).returncode != 0
        Sandbox(root, readonly=[root / ".git"], timeout_s=60).run(
            ["patch", "--batch", "-p1"], stdin=patch.encode())
    assert (root / ".git" / "config").read_text() == config
    assert not (root / ".git" / "hooks" / "post-checkout").exists()
    assert not (root / ".git" / "config.worktree").exists()
    assert (root / "pkg" / ".git").is_file()
    # an ordinary patch still applies, by git or (fuzzy) by GNU patch in the sandbox
    ok = _new_file_patch("evil-include.cfg", f"[core]\n\tfsmonitor = {fire}")
    assert grader._apply_model_patch(root, ok, tmp_path) is not None
    assert (root / "evil-include.cfg").exists()
    fuzzy = _README_PATCH.replace(" # calc\n", " # calculator\n")  # git apply rejects
    assert git(root, "apply", "--check", "-", input=fuzzy, check=False).returncode != 0
    assert grader._apply_model_patch(root, fuzzy, tmp_path) is not None
    assert "A small calculator." in (root / "README.md").read_text()
    git(root, "checkout", "--", "README.md")
    assert (root / ".git" / "config").read_text() == config
    _run_host_ops(root, base, tmp_path, canary)


def _payload(root: Path, canary: Path, base: str) -> str:
    """Write every primitive under ``.fak/payload`` (Python writes the data) and return the
    fak-written command that copies it into place: ``.git`` contents, the config additions,
    the work-tree files, nested ``.git`` folders and pointers."""
    pay = root / ".fak" / "payload"
    for prim in _compatible():
        if prim.config:
            with _mk(pay / "config-add").open("a") as f:
                f.write(_subst(prim.config, prim, root, canary, base))
        for rel, text in prim.files.items():
            dest = pay / ("dotgit" + rel[4:] if rel.startswith(".git/") else "tree/" + rel)
            _mk(dest)
            with dest.open("a") as f:
                f.write(_subst(text, prim, root, canary, base))
        for rel, target in prim.links.items():
            dest = pay / ("dotgit" + rel[4:] if rel.startswith(".git/") else "tree/" + rel)
            if not os.path.lexists(dest):
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(target, dest)
    return ("cat .fak/payload/config-add >> .git/config; cp -a .fak/payload/dotgit/. .git/; "
            "chmod -R +x .git/hooks; cp -a .fak/payload/tree/. ./; mv .git real-git; "
            "ln -s real-git .git; echo done")


def _mk(p: Path) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.touch()
    return p


def test_bash_in_the_sandbox_cannot_plant_in_git(git_bin, mirror, tmp_path):
    """The agent's bash and the pipeline's scripts run in the sandbox with ``.git`` read-only:
    nothing reaches ``.git``; what they can plant in the work tree (nested repositories,
    ``gitdir:`` files, attributes, include files) is never run by fak's git."""
    assert probe().ok, probe().detail
    canary = tmp_path / "canary"
    canary.mkdir()
    root, base = _workspace(mirror, tmp_path / "ws")
    _scripts(root, canary)
    cmd = _payload(root, canary, base)
    git_before = {p: p.read_bytes() for p in (root / ".git").rglob("*") if p.is_file()}
    box = ToolBox(Workspace(root), allow_exec=True, exec_timeout_s=60)
    out = box.execute("bash", {"command": cmd}).output
    assert "Read-only file system" in out, out
    res = run_in_sandbox(["bash", "-c", cmd], workspace=root, timeout_s=60)
    assert "Read-only file system" in res.output, res.output
    assert (root / ".git").is_dir() and not (root / ".git").is_symlink()
    git_after = {p: p.read_bytes() for p in (root / ".git").rglob("*") if p.is_file()}
    assert git_after == git_before
    assert (root / "pkg" / ".git").exists() and (root / "vendor" / "lib" / ".git").exists()
    assert (root / ".gitattributes").exists() and (root / "evil-include.cfg").exists()
    _run_host_ops(root, base, tmp_path, canary)


# -- the positive side: the same patch as before ------------------------------------------------

def _plain_patch(root: Path, base: str, home: Path) -> str:
    """The patch as fak took it before ``fak.gitsafe`` (plain git, private index)."""
    env = {**_plain_env(home), "GIT_INDEX_FILE": str(home / "plain-index")}
    run = lambda *a: subprocess.run(["git", "-C", str(root), *a], env=env, check=True,  # noqa: E731
                                    capture_output=True).stdout
    run("read-tree", base)
    run("add", "-A")
    return run("diff", "--cached", "--binary", "--no-color", "--no-ext-diff", "--no-renames",
               base).decode("utf-8", "surrogateescape")


def test_fak_git_gives_the_same_patch_as_plain_git(git_bin, mirror, tmp_path):
    root, base = _workspace(mirror, tmp_path / "ws")
    (root / "README.md").unlink()
    (root / "pkg" / "new module.py").write_text("X = 'ünïcödé'\n")
    (root / "pkg" / "blob.bin").write_bytes(bytes(range(256)) * 4)
    (root / "pkg" / "util.py").chmod(0o755)
    os.symlink("util.py", root / "pkg" / "alias.py")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "calc.cpython-312.pyc").write_bytes(b"\0junk")
    ws = Workspace(root)
    ws.write_junk_excludes()
    ours = ws.diff(base)
    assert ours == _plain_patch(root, base, tmp_path)
    for needle in ("+    return a + b", "deleted file mode", "new module.py", "GIT binary patch",
                   "old mode 100644", "new file mode 120000"):
        assert needle in ours, needle
    assert "__pycache__" not in ours
    fresh = make_workspace(mirror[0], base, tmp_path / "fresh").root
    assert git(fresh, "apply", "--index", "-", input=ours, check=False).returncode == 0
    assert git(fresh, "diff", "--cached", "--stat", base).stdout.strip()
    assert (fresh / "pkg" / "alias.py").is_symlink()


@pytest.mark.parametrize("junk", ["untracked-repo", "tracked-folder-repo", "broken-submodule",
                                  "upper-case-git", "gitdir-file-to-nowhere"])
def test_patch_capture_survives_nested_git(junk, git_bin, mirror, tmp_path):
    """A model's ``git init`` in a folder, a broken submodule checkout or a ``.GIT`` folder made
    plain ``git add -A`` fail, and the whole patch was lost; now they are left out."""
    root, base = _workspace(mirror, tmp_path / "ws")
    if junk == "untracked-repo":
        (root / "scratch").mkdir()
        git(root / "scratch", "init", "-q", mode="trusted")
        (root / "scratch" / "a.py").write_text("x = 1\n")
    elif junk == "tracked-folder-repo":
        git(root / "pkg", "init", "-q", mode="trusted")
        (root / "pkg" / "util.py").write_text("def twice(x):\n    return x + x\n")
    elif junk == "broken-submodule":
        (root / "vendor" / "lib" / ".git").mkdir()
        (root / "vendor" / "lib" / ".git" / "config").write_text("")
    elif junk == "upper-case-git":
        (root / ".GIT").mkdir()
        (root / ".GIT" / "config").write_text("[core]\n")
    else:
        (root / "sub").mkdir()
        (root / "sub" / ".git").write_text("gitdir: ../nowhere\n")
    (root / "new.py").write_text("y = 2\n")
    patch = Workspace(root).diff(base)
    assert "+    return a + b" in patch and "new.py" in patch
    assert ".GIT" not in patch and "scratch" not in patch and "Subproject" not in patch
    if junk == "tracked-folder-repo":
        assert "return x + x" in patch  # git adds its tracked files as before


def test_search_and_fingerprint_unchanged(git_bin, mirror, tmp_path):
    root, base = _workspace(mirror, tmp_path / "ws")
    ws = Workspace(root)
    fp = ws.fingerprint()
    assert fp and fp == ws.fingerprint()
    (root / "new.py").write_text("def add(): pass\n")
    assert ws.fingerprint() != fp
    s = Searcher(root)
    assert s.git
    hits = s.grep("def add", ".")
    assert set(hits.files) == {"calc.py", "new.py"}
    assert "new.py" in list_files(root) and ".gitmodules" in list_files(root)


# -- gitsafe itself ------------------------------------------------------------------------------

def test_git_refuses_an_old_git(tmp_path, monkeypatch):
    fake = tmp_path / "git"
    fake.write_text("#!/bin/sh\necho 'git version 2.20.1'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("FAK_GIT", str(fake))
    with pytest.raises(GitError, match=r"needs git >= 2\.32"):
        git(tmp_path, "status")


def test_git_modes_and_arguments(git_bin, mirror, tmp_path):
    root, base = _workspace(mirror, tmp_path / "ws")
    with pytest.raises(ValueError, match="GIT_DIR cannot be set"):
        git(root, "status", env={"GIT_DIR": "/x"})
    with pytest.raises(ValueError, match="mode"):
        git(root, "status", mode="host")
    plain = tmp_path / "plain"
    plain.mkdir()
    proc = git(plain, "status", check=False)
    assert proc.returncode == 128 and "not the top of a git work tree" in proc.stderr
    with pytest.raises(GitError):
        git(plain, "status")
    assert git(root / "pkg", "status", check=False).returncode == 128  # never discovery upward
    assert git(root, "status", mode="none", check=False).returncode == 128
    assert git(mirror[0], "rev-parse", "HEAD", mode="trusted").stdout.strip() == base
    common = git(root, "rev-parse", "--git-common-dir").stdout.strip()
    assert not common.startswith(str(root))  # the private common folder, outside the workspace
    assert not os.path.exists(common)        # and gone after the command


def test_git_metadata_predicate(tmp_path):
    root = tmp_path / "ws"
    (root / ".git" / "hooks").mkdir(parents=True)
    (root / "sub").mkdir()
    os.symlink(".git", root / "lnk")
    os.symlink("sub", root / "ok-link")
    for bad in (".git", ".git/config", "./.git/hooks/x", "sub/.git", "sub/.GIT/config", ".git.",
                ".git /x", "git~1/config", "lnk", "lnk/config", "sub/../.git/config",
                str(root / ".git" / "config")):
        assert git_metadata(root, bad), bad
    for good in ("calc.py", ".gitignore", ".gitattributes", ".gitmodules", "sub/x.py", "ok-link/x",
                 ".github/workflows/ci.yml", "git/config", "a.git/b"):
        assert git_metadata(root, good) is None, good
    pointer = tmp_path / "wt"
    (pointer / "meta").mkdir(parents=True)
    (pointer / ".git").write_text("gitdir: meta\n")
    assert git_metadata(pointer, "meta/config")
    patch = _new_file_patch("a.py", "x") + _append_patch("sub/.git/config", "a\nb\nc\n", "d")
    assert patch_paths(patch)[:3] == ["a/a.py", "b/a.py", "b/a.py"]
    assert patch_git_metadata(patch) == "a/sub/.git/config"
    assert patch_git_metadata(_new_file_patch("a.py", "x")) is None
    # GNU patch takes names from plain unified headers with timestamps, context diffs, Index:
    for other in ("--- a/x.py\t2020-01-01 00:00:00\n+++ b/.git/config\t2020-01-01 00:00:00\n",
                  "*** a/.git/hooks/post-commit\t2020\n--- b/x.py\t2020\n",
                  "Index: sub/.GIT/config\n1a2\n> x\n",
                  '--- "a/sp ace/.git/config"\n+++ "b/sp ace/.git/config"\n'):
        assert patch_git_metadata(other), other
