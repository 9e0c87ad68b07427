"""Which tool calls only read (python/fak/policy/readonly.py): the judgement the gateway's inline
reads (``fak serve --serve-inline-reads``) ask for. To add a case, add a row: a tool name, its
arguments, and whether the call only reads.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from fak.policy.readonly import ReadTools, command_reads_only


@pytest.mark.parametrize("name,args,ro", [
    ("read", {"path": "x"}, True), ("list", {}, True), ("search", {"pattern": "x"}, True),
    ("edit", {"path": "x"}, False), ("write", {"path": "x"}, False), ("submit", {}, False), ("weird", {}, False),
    ("bash", {"command": "cat a.py"}, True), ("bash", {"command": "grep -rn foo src | head -20"}, True),
    ("bash", {"command": "git diff HEAD~1 -- a.py"}, True), ("bash", {"command": "sed -n '1,20p' a.py"}, True),
    ("bash", {"command": "ls -la && find . -name '*.py'"}, True), ("bash", {"command": "cd src && cat x"}, True),
    ("bash", {"command": "git status"}, True), ("bash", {"command": "git branch"}, True),
    ("bash", {"command": "sed -i 's/a/b/' a.py"}, False), ("bash", {"command": "cat a > b"}, False),
    ("bash", {"command": "find . -delete"}, False), ("bash", {"command": "find . -exec rm {} ;"}, False),
    ("bash", {"command": "git checkout main"}, False), ("bash", {"command": "git branch new"}, False),
    ("bash", {"command": "python -m pytest"}, False), ("bash", {"command": "$CMD a"}, False),
    ("bash", {"command": "sort -o out in"}, False), ("bash", {"command": "sed -n 'w out' a"}, False),
    ("bash", {"command": "awk '{system(\"rm x\")}' a"}, False), ("bash", {"command": "cat <(rm x)"}, False),
    ("bash", {"command": "echo $(touch x)"}, False), ("bash", {"command": "unbalanced '"}, False),
    ("bash", {"command": "git diff --output=x"}, False), ("bash", {}, False),
])
def test_read_only_classification(name: str, args: dict[str, Any], ro: bool) -> None:
    assert ReadTools().reads_only(name, json.dumps(args)) is ro


@pytest.mark.parametrize("name,args,read_only", [
    ("Read", {"file_path": "a.py"}, True),
    ("Grep", {"pattern": "x"}, True),
    ("read_file", {"absolute_path": "/ws/a.py"}, True),
    ("Bash", {"command": "cat a.py | head -3"}, True),
    ("Bash", {"command": "sed -i s/a/b/ a.py"}, False),
    ("run_shell_command", {"command": "git diff"}, True),
    ("exec_command", {"cmd": "ls -la"}, True),
    ("exec_command", {"cmd": "touch x"}, False),
    ("shell", {"command": ["bash", "-lc", "git status"]}, True),
    ("shell", {"command": ["bash", "-lc", "rm x"]}, False),
    ("shell", {"commands": ["ls", "cat a.py"]}, True),
    ("Edit", {"file_path": "a.py", "old_string": "a", "new_string": "b"}, False),
    ("apply_patch", {"input": "*** Begin Patch\n*** End Patch"}, False),
])
def test_other_agents_tools_are_classified(name: str, args: dict, read_only: bool) -> None:
    """Claude Code's, Codex's and Qwen Code's read and shell tools, judged by their names."""
    assert ReadTools().reads_only(name, args) is read_only
    assert ReadTools().reads_only(name, json.dumps(args)) is read_only


def _tool(name: str, **properties: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": properties}}}


def test_the_offered_tools_decide() -> None:
    """With the request's tools known, a tool not offered is not a read, a read-named tool whose
    schema writes text is not one, and a ``command`` chosen from an ``enum`` reads when it says so
    (OpenHands' ``str_replace_editor``)."""
    tools = ReadTools.from_openai([
        _tool("read", path={"type": "string"}), _tool("bash", command={"type": "string"}),
        _tool("read_and_write", path={"type": "string"}, content={"type": "string"}),
        _tool("str_replace_editor", command={"type": "string", "enum": ["view", "create", "str_replace"]},
              path={"type": "string"}),
    ])
    assert tools.reads_only("read", {"path": "a.py"})
    assert not tools.reads_only("Read", {"file_path": "a.py"}), "not offered"
    assert not tools.reads_only("read_and_write", {"path": "a.py"})
    assert tools.reads_only("str_replace_editor", {"command": "view", "path": "a.py"})
    assert not tools.reads_only("str_replace_editor", {"command": "create", "path": "a.py"})
    assert tools.reads_only("bash", {"command": "git log --oneline | head"})
    assert not tools.reads_only("bash", '{"command": ')


@pytest.mark.parametrize("command,ro", [
    ("sed 's/a/b/' a.py", True), ("awk '{print $1}' a", True), ("find . -name '*.py' -exec grep -n x {} +", True),
    ("git --no-pager log -n 3", True), ("git grep -n foo", True), ("tail -n 20 log.txt 2>/dev/null", True),
    ("sed -n '1e rm x' a", False), ("sed -f prog.sed a", False), ("awk '{print > $1}' a", False),
    ("awk -i inplace '{print}' a", False), ("uniq in out", False), ("find . -fprint out", False),
    ("git -c core.pager=less log", False), ("git grep -Ovim foo", False), ("git branch --unset-upstream", False),
    ("git -C /elsewhere status", False), ("xxd a.bin out.hex", False), ("rg --pre ./conv foo", False),
    ("tree -o out", False), ("sort --compress-program=gzip a", False), ("tee out", False),
])
def test_commands_judged_with_the_shell_analysis(command: str, ro: bool) -> None:
    """What the policy's analysis knows beyond a list of readers: sed and awk programs, find's
    actions, git's options, the files a command writes."""
    assert command_reads_only(command) is ro
