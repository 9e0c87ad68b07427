"""The tools over a workspace: exact edits and their diagnostics, syntax check, path confinement,
bash sandbox, fixed-string bounded search, read windows, identical-call keys.

To add a case: call ``ToolBox.execute(name, args)`` on the ``repo`` fixture and check the output
and the file system.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fak.agent.exceptions import SandboxError, Submitted, ToolError
from fak.agent.tools import (
    ToolBox,
    call_key,
    check_network_isolation,
    normalize_arguments,
    tool_schemas,
    truncate_middle,
)


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
    out = tb.execute("read", {"path": "calc.py", "start_line": "2", "end_line": "2"}).output
    assert out.splitlines()[1].startswith("2")


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


def test_bash_runs_in_the_sandbox_without_network(repo):
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
    r = tb.execute("bash", {"command": "echo new > made.txt; (echo x >> .git/config) 2>&1; "
                                       "(touch /fak-bash-tool) 2>&1"})
    assert (ws.root / "made.txt").read_text() == "new\n"  # the workspace is writable
    assert r.output.count("Read-only file system") == 2  # its .git and / are not
    assert not Path("/fak-bash-tool").exists()


def test_bash_timeout_and_output_bound(repo):
    ws, _ = repo
    tb = ToolBox(ws, allow_exec=True, exec_timeout_s=1, max_output_chars=1000)
    r = tb.execute("bash", {"command": "echo start; sleep 30"})
    assert not r.ok and r.extra["timed_out"] and r.extra["killed"] == "timeout"
    assert r.output.endswith("[killed: timeout after 1 s]") and r.output.startswith("start")
    assert r.duration_s < 10
    r = tb.execute("bash", {"command": "seq 1 100000"})
    assert len(r.output) < 1200 and r.output.startswith("1\n2\n") and r.output.endswith("100000\n")
    assert "characters cut" in r.output


def test_bash_refuses_to_run_without_the_sandbox(repo, monkeypatch):
    from fak.sandbox import SandboxUnavailable
    from fak.sandbox.detect import SandboxInfo

    ws, _ = repo
    broken = SandboxInfo(ok=False, method=None, detail="bwrap: not installed; unshare: EPERM",
                         methods={"bwrap": "not installed", "unshare": "EPERM"})
    monkeypatch.setattr("fak.sandbox.run.probe", lambda: broken)
    with pytest.raises(SandboxUnavailable, match="--unsafe-no-sandbox") as exc:
        ToolBox(ws, allow_exec=True)
    assert isinstance(exc.value, SandboxError) and "bwrap: not installed" in str(exc.value)
    tb = ToolBox(ws, allow_exec=True, unsafe_no_sandbox=True)  # the explicit opt-out works
    assert tb.execute("bash", {"command": "echo hi"}).output.strip() == "hi"
    assert ToolBox(ws, allow_exec=True, unsafe_network=True).unsafe_no_sandbox  # old name


def test_sandbox_works_here():
    """This machine (and CI) runs as root with bubblewrap: the sandbox must work, or bash would
    be unusable."""
    assert check_network_isolation() is None


# -- search: fixed strings, files searched, bounds, hints on a miss -----------------------------


def test_search_is_fixed_string_by_default(repo):
    ws, _ = repo
    tb = ToolBox(ws)
    # what a small model types: a call with an unbalanced parenthesis, a dotted name
    assert tb.execute("search", {"pattern": "add(a, b"}).output == "calc.py:1:def add(a, b):"
    assert tb.execute("search", {"pattern": "a * b"}).output == "calc.py:6:    return a * b"
    # regex true: a Python regular expression (\d, \w work)
    out = tb.execute("search", {"pattern": r"return a \W b", "regex": True}).output
    assert out.splitlines() == ["calc.py:2:    return a - b", "calc.py:6:    return a * b"]
    assert tb.execute("search", {"pattern": r"^Y = \d$", "regex": "true"}).output == "pkg/util.py:2:Y = 2"


def test_search_skips_binary_and_git_and_sees_untracked(repo):
    ws, _ = repo
    tb = ToolBox(ws)
    # blob.bin holds the bytes 0..255, so "ABCDEF" is in it, but it is binary
    assert tb.execute("search", {"pattern": "ABCDEF"}).output.startswith("no matches")
    # .git/HEAD holds "ref: refs/heads/main"
    assert tb.execute("search", {"pattern": "refs/heads"}).output.startswith("no matches")
    (ws.root / "new_module.py").write_text("def fresh():\n    pass\n")  # untracked
    assert tb.execute("search", {"pattern": "def fresh"}).output == "new_module.py:1:def fresh():"


def test_search_miss_lists_files_of_each_identifier(repo):
    """"foo.add(zzz" is nowhere, but ``add`` is in calc.py: the miss says so."""
    ws, _ = repo
    tb = ToolBox(ws)
    out = tb.execute("search", {"pattern": "foo.add(zzz"}).output
    assert out.startswith("no matches for the text 'foo.add(zzz' in the repository.")
    assert "add: calc.py (1)" in out and "foo: nowhere" in out and "zzz: nowhere" in out
    # the words are looked up in the whole repository even when the path was narrow
    out = tb.execute("search", {"pattern": "mul(x", "path": "pkg"}).output
    assert "no matches" in out and "mul: calc.py (1)" in out
    # a single name found nowhere says just that
    out = tb.execute("search", {"pattern": "nonexistent_name"}).output
    assert "'nonexistent_name' occurs nowhere in the repository" in out


def test_search_miss_tries_regex_reading_and_case(repo):
    ws, _ = repo
    tb = ToolBox(ws)
    out = tb.execute("search", {"pattern": r"def add\(a"}).output  # regex-escaped, as models write
    assert "read as a regular expression matches" in out and "calc.py:1:def add(a, b):" in out
    out = tb.execute("search", {"pattern": "DEF MUL"}).output
    assert "Ignoring upper/lower case" in out and "calc.py:5:def mul(a, b):" in out
    out = tb.execute("search", {"pattern": "def add(a", "regex": False}).output
    assert out == "calc.py:1:def add(a, b):"
    # an error message as the issue quotes it: the source holds it without the prefix
    (ws.root / "err.py").write_text("raise TypeError('A Vector must be supplied')\n")
    out = tb.execute("search", {"pattern": "TypeError: A Vector must be supplied"}).output
    assert "after its 'TypeError' prefix, 'A Vector must be supplied', matches" in out
    assert "err.py:1:raise TypeError" in out


def test_search_output_is_bounded_and_counts_what_is_left_out(repo):
    """A common word must not flood the context: lines per file and in all are capped, source
    files come first, and what was left out is counted."""
    ws, _ = repo
    (ws.root / "doc").mkdir()
    (ws.root / "doc" / "guide.rst").write_text("the word value here\n" * 50)
    (ws.root / "big.py").write_text("value = 1\n" * 500)
    for i in range(60):
        (ws.root / "pkg" / f"m{i:02d}.py").write_text(f"value = {i}\nother = value\n")
    out = ToolBox(ws).execute("search", {"pattern": "value"}).output
    lines = out.splitlines()
    assert len(out) < 4500, len(out)
    assert lines[0] == "big.py:1:value = 1"  # source first; doc/guide.rst sorts before it by name
    assert "[... 495 more in big.py]" in lines
    assert sum(1 for ln in lines if ln.startswith("pkg/")) <= 30
    assert "doc/guide.rst" not in "".join(ln for ln in lines if ":" in ln and not ln.startswith("["))
    assert lines[-1].startswith("[670 matching lines in 62 files, 30 shown")
    assert any(ln.startswith("[... also in 48 more files: doc/guide.rst (50), pkg/m13.py (2)")
               for ln in lines)
    # long lines are cut
    (ws.root / "wide.py").write_text("needle = '" + "x" * 5000 + "'\n")
    out = ToolBox(ws).execute("search", {"pattern": "needle"}).output
    assert len(out) < 300 and out.endswith("[...]")


def test_search_of_a_multiline_pattern_uses_its_first_line(repo):
    ws, _ = repo
    out = ToolBox(ws).execute("search", {"pattern": "\ndef mul(a, b):\n    return a * b"}).output
    assert "searched only the first line, 'def mul(a, b):'" in out and "calc.py:5:def mul" in out
    with pytest.raises(ToolError, match="pattern is empty"):
        ToolBox(ws).execute("search", {"pattern": "  "})


# -- read windows --------------------------------------------------------------------------------


def test_read_returns_windows_and_says_how_to_go_on(repo):
    ws, _ = repo
    (ws.root / "long.py").write_text("".join(f"x{i} = {i}\n" for i in range(1, 251)))
    tb = ToolBox(ws)
    out = tb.execute("read", {"path": "long.py"}).output.splitlines()
    assert out[0] == "[long.py: lines 1-100 of 250]" and out[1] == "  1  x1 = 1"
    assert len(out) == 1 + 100 + 1
    assert out[-1] == ("[lines 101-250 not shown; the next window: read with path 'long.py' and "
                       "start_line 101 (lines 101-200)]")
    out = tb.execute("read", {"path": "long.py", "start_line": 101}).output.splitlines()
    assert out[0] == "[long.py: lines 101-200 of 250]" and out[1] == "101  x101 = 101"
    out = tb.execute("read", {"path": "long.py", "start_line": 201, "end_line": 900}).output
    assert out.startswith("[long.py: lines 201-250 of 250]") and "not shown" not in out
    # an explicit range longer than a window is cut to one window
    out = tb.execute("read", {"path": "long.py", "start_line": 5, "end_line": 240}).output
    assert out.startswith("[long.py: lines 5-104 of 250]") and "start_line 105" in out
    (ws.root / "empty.py").write_text("")
    assert tb.execute("read", {"path": "empty.py"}).output == "empty.py is empty (0 lines)"


# -- edit diagnostics ------------------------------------------------------------------------------


def test_edit_rejects_old_equal_to_new(repo):
    ws, _ = repo
    with pytest.raises(ToolError, match="old and new are the same text"):
        ToolBox(ws).execute("edit", {"path": "calc.py", "old": "return a - b", "new": "return a - b"})


def test_edit_not_unique_shows_every_match_with_line_numbers(repo):
    ws, _ = repo
    with pytest.raises(ToolError) as e:
        ToolBox(ws).execute("edit", {"path": "pkg/util.py", "old": "X = 1", "new": "X = 3"})
    msg = str(e.value)
    assert "old occurs 2 times in pkg/util.py" in msg
    assert "  line 1: X = 1\n  line 3: X = 1\n" in msg and "surrounding lines" in msg
    with pytest.raises(ToolError, match=r"line 1: def add\(a, b\):  \(2 times\)"):
        ToolBox(ws).execute("edit", {"path": "calc.py", "old": "a", "new": "c"})


def test_edit_not_found_shows_closest_lines(repo):
    ws, _ = repo
    with pytest.raises(ToolError) as e:
        ToolBox(ws).execute("edit", {"path": "calc.py", "old": "return a + b", "new": "return b"})
    msg = str(e.value)
    assert "old was not found in calc.py" in msg
    assert "closest lines (2-2, 92% similar) are:\n2      return a - b" in msg
    with pytest.raises(ToolError, match="Nothing in the file is close"):
        ToolBox(ws).execute("edit", {"path": "calc.py", "old": "zzzzqqqq", "new": "y"})


def test_edit_takes_out_copied_line_numbers(repo):
    """A small model copies read's numbered lines into old: they are taken out when the text
    then matches once."""
    ws, _ = repo
    out = ToolBox(ws).execute("edit", {"path": "calc.py", "old": "1  def add(a, b):\n2      return a - b",
                                       "new": "1  def add(a, b):\n2      return a + b"}).output
    assert "line numbers copied from read were taken out" in out
    assert (ws.root / "calc.py").read_text().startswith("def add(a, b):\n    return a + b\n")


def test_edit_shows_changed_region_and_warns_on_tests_and_docs(repo):
    ws, _ = repo
    tb = ToolBox(ws)
    out = tb.execute("edit", {"path": "calc.py", "old": "return a * b", "new": "r = a * b\n    return r"}).output
    assert out.splitlines() == ["edited calc.py; lines 4-7 now:", "4  ", "5  def mul(a, b):",
                                "6      r = a * b", "7      return r"]
    (ws.root / "tests").mkdir()
    (ws.root / "tests" / "test_calc.py").write_text("def test_add():\n    assert True\n")
    out = tb.execute("edit", {"path": "tests/test_calc.py", "old": "True", "new": "False"}).output
    assert "[note: tests/test_calc.py is a test file" in out
    (ws.root / "README.rst").write_text("calc adds\n")
    out = tb.execute("edit", {"path": "README.rst", "old": "adds", "new": "adds numbers"}).output
    assert "is documentation, not code" in out


# -- identical calls ---------------------------------------------------------------------------


def test_call_key_normalizes_arguments():
    assert normalize_arguments("read", {"path": "./calc.py", "start_line": "1", "end_line": None}) \
        == {"path": "calc.py"}
    assert call_key("read", {"path": "calc.py"}) == call_key("read", {"path": "./calc.py", "start_line": 1})
    assert call_key("read", {"path": "calc.py"}) != call_key("read", {"path": "calc.py", "start_line": 2})
    assert call_key("search", {"pattern": "x", "regex": False, "path": "."}) == \
        call_key("search", {"pattern": "x"})
    assert call_key("search", {"pattern": "x", "regex": "true"}) != call_key("search", {"pattern": "x"})
    assert call_key("list", {"path": "pkg/"}) == call_key("list", {"path": "pkg"})
    assert call_key("list", {}) == call_key("list", {"path": "."})
    assert call_key("bash", {"command": " ls \n"}) == call_key("bash", {"command": "ls"})
    assert call_key("read", {"path": "a"}) != call_key("list", {"path": "a"})


def test_state_token_changes_with_the_files(repo):
    ws, _ = repo
    tb = ToolBox(ws)
    t0 = tb.state_token()
    tb.execute("read", {"path": "calc.py"})
    with pytest.raises(ToolError):
        tb.execute("edit", {"path": "calc.py", "old": "nothing like it", "new": "x"})
    assert tb.state_token() == t0  # reads and failed edits change nothing
    tb.execute("edit", {"path": "calc.py", "old": "return a - b", "new": "return a + b"})
    t1 = tb.state_token()
    assert t1 != t0
    tb.execute("write", {"path": "n.txt", "content": "x"})
    assert tb.state_token() != t1


def test_state_token_follows_bash_changes(repo):
    ws, _ = repo
    tb = ToolBox(ws, allow_exec=True)
    t0 = tb.state_token()
    tb.execute("bash", {"command": "ls; python3 -c 'print(1)'"})
    assert tb.state_token() == t0
    tb.execute("bash", {"command": "echo y > made.txt"})
    t1 = tb.state_token()
    assert t1 != t0
    tb.execute("bash", {"command": "echo z >> made.txt"})  # an already-changed file changes again
    assert tb.state_token() != t1
    t2 = tb.state_token()
    tb.execute("bash", {"command": "mkdir -p __pycache__ && touch __pycache__/x.pyc"})  # junk
    assert tb.state_token() == t2
