"""The workspace patch: new files, binary files, deletions, junk excluded, applies with git apply."""

from __future__ import annotations

import subprocess

import pytest

from fak.agent.workspace import Workspace


def _clone_at(src, base, dest):
    subprocess.run(["git", "clone", "-q", str(src), str(dest)], check=True)
    subprocess.run(["git", "-C", str(dest), "checkout", "-q", base], check=True)


def test_diff_includes_new_binary_and_deleted_files_and_applies(repo, tmp_path):
    ws, base = repo
    assert ws.diff(base) == ""
    (ws.root / "calc.py").write_text((ws.root / "calc.py").read_text().replace("a - b", "a + b"))
    (ws.root / "new_mod.py").write_text("VALUE = 42\n")
    (ws.root / "blob.bin").write_bytes(bytes(range(255, -1, -1)))
    (ws.root / "pkg" / "util.py").unlink()
    (ws.root / "pkg" / "__pycache__").mkdir()
    (ws.root / "pkg" / "__pycache__" / "util.cpython-311.pyc").write_bytes(b"\0junk")
    (ws.root / ".pytest_cache").mkdir()
    (ws.root / ".pytest_cache" / "v").write_text("x")
    patch = ws.diff(base)
    assert "diff --git a/new_mod.py b/new_mod.py" in patch and "new file mode" in patch
    assert "GIT binary patch" in patch
    assert "deleted file mode" in patch
    assert "__pycache__" not in patch and ".pytest_cache" not in patch
    # the workspace's own index is untouched (the diff uses a private index)
    status = subprocess.run(["git", "-C", str(ws.root), "diff", "--cached", "--name-only"],
                            capture_output=True, text=True, check=True).stdout
    assert status == ""
    fresh = tmp_path / "fresh"
    _clone_at(ws.root, base, fresh)
    (tmp_path / "p.diff").write_text(patch)
    subprocess.run(["git", "apply", "--verbose", str(tmp_path / "p.diff")], cwd=fresh, check=True,
                   capture_output=True)
    assert "a + b" in (fresh / "calc.py").read_text()
    assert (fresh / "new_mod.py").read_text() == "VALUE = 42\n"
    assert (fresh / "blob.bin").read_bytes() == bytes(range(255, -1, -1))
    assert not (fresh / "pkg" / "util.py").exists()


def test_diff_against_base_even_after_model_commits(repo):
    ws, base = repo
    (ws.root / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    subprocess.run(["git", "-C", str(ws.root), "commit", "-qam", "model commit"], check=True)
    patch = ws.diff(base)
    assert "+    return a + b" in patch


def test_resolve(repo):
    ws, _ = repo
    assert ws.resolve(None) == ws.root and ws.resolve(".") == ws.root
    assert ws.resolve("pkg/util.py") == ws.root / "pkg" / "util.py"
    assert ws.resolve(str(ws.root / "calc.py")) == ws.root / "calc.py"
    with pytest.raises(ValueError):
        ws.resolve("../x")
    assert Workspace(ws.root).display(ws.root / "pkg") == "pkg"
