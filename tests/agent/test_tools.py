"""The tools over a workspace: exact edits, syntax check, path confinement, bash sandbox, bounds.

To add a case: call ``ToolBox.execute(name, args)`` on the ``repo`` fixture and check the output
and the file system.
"""

from __future__ import annotations

import subprocess

import pytest

from fak.agent.exceptions import SandboxError, Submitted, ToolError
from fak.agent.tools import ToolBox, check_network_isolation, tool_schemas, truncate_middle


def test_read_numbered_range(repo):
    ws, _ = repo
    out = ToolBox(ws).execute("read", {"path": "calc.py", "start_line": 2, "end_line": 2}).output
    assert out.splitlines() == ["[calc.py: lines 2-2 of 6]", "2      return a - b"]
    full = ToolBox(ws).execute("read", {"path": "calc.py"}).output.splitlines()
    assert full[0] == "[calc.py: lines 1-6 of 6 (the whole file)]"
    assert full[1] == "1  def add(a, b):" and len(full) == 1 + 6


def test_read_bounds_and_errors(repo):
    ws, _ = repo
    tb = ToolBox(ws, max_read_lines=2)
    out = tb.execute("read", {"path": "calc.py"}).output
    assert out.startswith("[calc.py: lines 1-2 of 6]") and "start_line 3" in out
    with pytest.raises(ToolError, match="no such file"):
        tb.execute("read", {"path": "nope.py"})
    with pytest.raises(ToolError, match="binary"):
        tb.execute("read", {"path": "blob.bin"})
    with pytest.raises(ToolError, match="only 6 lines"):
        tb.execute("read", {"path": "calc.py", "start_line": 9})
    # integers given as strings (small models do this) are accepted
    assert tb.execute("read", {"path": "calc.py", "start_line": "2", "end_line": "2"}).output.startswith("2")


def test_not_found_hints(repo):
    """A wrong path names the tracked files or folders of that name, else the root's entries."""
    ws, _ = repo
    tb = ToolBox(ws)
    with pytest.raises(ToolError, match=r"no such file: src/calc.py\. Did you mean: calc.py\?"):
        tb.execute("read", {"path": "src/calc.py"})
    with pytest.raises(ToolError, match=r"no such folder: lib/pkg\. Did you mean: pkg\?"):
        tb.execute("list", {"path": "lib/pkg"})
    with pytest.raises(ToolError, match=r"relative to the repository root, which holds: blob.bin, "
                                        r"calc.py, pkg/"):
        tb.execute("search", {"pattern": "x", "path": "nowhere"})
    with pytest.raises(ToolError, match="Did you mean: pkg/util.py.*write creates a new file"):
        tb.execute("edit", {"path": "util.py", "old": "X", "new": "Y"})


def test_list_and_search(repo):
    ws, _ = repo
    tb = ToolBox(ws)
    assert tb.execute("list", {}).output.splitlines() == ["pkg/", "blob.bin", "calc.py"]
    assert tb.execute("list", {"path": "pkg"}).output == "util.py"
    assert tb.execute("search", {"pattern": "def (add|mul)", "regex": True}).output.splitlines() == [
        "calc.py:1:def add(a, b):", "calc.py:5:def mul(a, b):"]
    assert tb.execute("search", {"pattern": "X = ", "path": "pkg"}).output.splitlines() == [
        "pkg/util.py:1:X = 1", "pkg/util.py:3:X = 1"]
    assert "no matches" in tb.execute("search", {"pattern": "zzz"}).output
    with pytest.raises(ToolError, match="bad regular expression"):
        tb.execute("search", {"pattern": "(", "regex": True})
    # the default is a fixed string: "(" is just a character
    assert tb.execute("search", {"pattern": "("}).output.splitlines()[0] == "calc.py:1:def add(a, b):"


def test_edit_exactly_once(repo):
    ws, _ = repo
    tb = ToolBox(ws)
    out = tb.execute("edit", {"path": "calc.py", "old": "return a - b", "new": "return a + b"}).output
    assert "edited calc.py" in out and "return a + b" in out
    assert "return a + b" in (ws.root / "calc.py").read_text()
    with pytest.raises(ToolError, match="not found"):
        tb.execute("edit", {"path": "calc.py", "old": "return a - b", "new": "x"})
    with pytest.raises(ToolError, match="old occurs 2 times"):
        tb.execute("edit", {"path": "pkg/util.py", "old": "X = 1", "new": "X = 3"})
    assert (ws.root / "pkg" / "util.py").read_text() == "X = 1\nY = 2\nX = 1\n"
    with pytest.raises(ToolError, match="indentation"):
        tb.execute("edit", {"path": "calc.py", "old": "      return a * b", "new": "return 0"})


def test_edit_rejects_unparseable_python(repo):
    ws, _ = repo
    before = (ws.root / "calc.py").read_text()
    with pytest.raises(ToolError) as e:
        ToolBox(ws).execute("edit", {"path": "calc.py", "old": "return a - b", "new": "return (a +"})
    msg = str(e.value)
    assert "invalid Python" in msg and "calc.py:" in msg and "was not changed" in msg
    assert (ws.root / "calc.py").read_text() == before
    # a non-Python file takes anything
    ToolBox(ws).execute("write", {"path": "notes.txt", "content": "return (a +"})
    with pytest.raises(ToolError, match="invalid Python"):
        ToolBox(ws).execute("write", {"path": "new.py", "content": "def f(:\n"})
    assert not (ws.root / "new.py").exists()


def test_edit_allowed_when_file_was_already_unparseable(repo):
    ws, _ = repo
    (ws.root / "py2.py").write_text("print 'hello'\nx = 1\n")
    ToolBox(ws).execute("edit", {"path": "py2.py", "old": "x = 1", "new": "x = 2"})
    assert (ws.root / "py2.py").read_text() == "print 'hello'\nx = 2\n"


def test_paths_stay_inside_workspace(repo, tmp_path):
    ws, _ = repo
    tb = ToolBox(ws)
    (tmp_path / "secret.txt").write_text("s")
    for path in ("../secret.txt", str(tmp_path / "secret.txt"), "/etc/passwd"):
        with pytest.raises(ToolError, match="outside the workspace"):
            tb.execute("read", {"path": path})
    (ws.root / "link").symlink_to(tmp_path / "secret.txt")
    with pytest.raises(ToolError, match="outside the workspace"):
        tb.execute("read", {"path": "link"})
    with pytest.raises(ToolError, match="outside the workspace"):
        tb.execute("write", {"path": "../evil.txt", "content": "x"})
    assert not (tmp_path / "evil.txt").exists()


def test_argument_checks(repo):
    ws, _ = repo
    tb = ToolBox(ws)
    with pytest.raises(ToolError, match="needs the argument"):
        tb.execute("edit", {"path": "calc.py", "old": "x"})
    with pytest.raises(ToolError, match="has no argument 'file'"):
        tb.execute("read", {"file": "calc.py"})
    with pytest.raises(ToolError, match="unknown tool"):
        tb.execute("rm", {})
    with pytest.raises(ToolError, match="not available"):
        tb.execute("bash", {"command": "true"})
    with pytest.raises(Submitted):
        tb.execute("submit", {"summary": "done"})


def test_schemas_match_tools():
    names = [t["function"]["name"] for t in tool_schemas(allow_exec=True)]
    assert names == ["read", "list", "search", "edit", "write", "bash", "submit"]
    assert "bash" not in [t["function"]["name"] for t in tool_schemas(allow_exec=False)]
    edit = next(t for t in tool_schemas(False) if t["function"]["name"] == "edit")
    assert edit["function"]["parameters"]["required"] == ["path", "old", "new"]


def test_truncate_middle():
    text = "a" * 50 + "b" * 50
    cut = truncate_middle(text, 20)
    assert cut.startswith("a" * 10) and cut.endswith("b" * 10) and "[80 characters cut]" in cut
    assert truncate_middle("short", 20) == "short"


needs_netns = pytest.mark.skipif(check_network_isolation() is not None,
                                 reason="unshare -n not permitted here")


@needs_netns
def test_bash_runs_in_workspace_without_network(repo):
    ws, _ = repo
    tb = ToolBox(ws, allow_exec=True)
    r = tb.execute("bash", {"command": "pwd; ip -o link show | cut -d: -f2"})
    assert r.ok and r.returncode == 0
    lines = r.output.splitlines()
    assert lines[0] == str(ws.root)
    assert [x.strip() for x in lines[1:]] == ["lo"]  # a fresh network namespace: loopback only
    r = tb.execute("bash", {"command": "python3 -c \"import socket; s=socket.socket(); "
                                       "s.bind(('127.0.0.1', 0)); s.listen(); print('lo-ok')\""})
    assert r.output.strip() == "lo-ok"  # loopback is up
    r = tb.execute("bash", {"command": "exit 3"})
    assert not r.ok and r.returncode == 3


@needs_netns
def test_bash_timeout_and_output_bound(repo):
    ws, _ = repo
    tb = ToolBox(ws, allow_exec=True, exec_timeout_s=1, max_output_chars=1000)
    r = tb.execute("bash", {"command": "echo start; sleep 30"})
    assert not r.ok and r.extra["timed_out"] and "killed after 1 s" in r.output
    assert r.duration_s < 10
    r = tb.execute("bash", {"command": "seq 1 100000"})
    assert len(r.output) < 1200 and r.output.startswith("1\n2\n") and r.output.endswith("100000\n")
    assert "characters cut" in r.output


def test_bash_refuses_to_run_with_network_when_unshare_fails(repo, monkeypatch):
    ws, _ = repo
    monkeypatch.setattr("fak.agent.tools.check_network_isolation", lambda: "Operation not permitted")
    with pytest.raises(SandboxError, match="--unsafe-network"):
        ToolBox(ws, allow_exec=True)
    tb = ToolBox(ws, allow_exec=True, unsafe_network=True)  # explicit opt-out works
    assert tb.execute("bash", {"command": "echo hi"}).output.strip() == "hi"


def test_unshare_works_here():
    """This machine (and CI) runs as root: `unshare -n` must work, or bash would be unusable."""
    assert check_network_isolation() is None
    assert subprocess.run(["unshare", "-n", "true"]).returncode == 0
