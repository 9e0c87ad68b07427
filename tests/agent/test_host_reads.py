"""What fak reads on the host from a workspace a model wrote (docs/sandbox.md, audit): a symlink
made in the sandbox to a host file is never followed by the tools' reads (``read`` refuses it,
``search`` skips it, in git grep and in the Python fallback alike)."""

from __future__ import annotations

import os

import pytest

from fak.agent.exceptions import ToolError
from fak.agent.search import Searcher, read_text_file
from fak.agent.tools import ToolBox

SECRET = "fak-host-secret-canary-1f3a"


def test_symlink_to_a_host_file_is_never_read(repo, tmp_path):
    ws, _ = repo
    outside = tmp_path / "host-secret.txt"
    outside.write_text(SECRET + "\n")
    os.symlink(outside, ws.root / "leak.txt")
    os.symlink(tmp_path, ws.root / "leakdir")
    box = ToolBox(ws)
    with pytest.raises(ToolError, match="outside the workspace"):
        box.execute("read", {"path": "leak.txt"})
    for regex in (False, True):
        out = box.execute("search", {"pattern": SECRET, "regex": regex}).output
        assert out.startswith("no matches") and "leak" not in out, out
    s = Searcher(ws.root)
    s.git = False  # the Python fallback (outside git, or a regex without PCRE)
    assert not s.grep(SECRET, ".").files and not s.grep(SECRET, ".", regex=True).files
    assert read_text_file(ws.root / "leak.txt", ws.root) is None
    assert read_text_file(ws.root / "leak.txt") == SECRET + "\n"  # without a root: as before
