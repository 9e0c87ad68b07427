"""What the shell analyzer follows beyond plain commands, and the pure helpers behind it: NUL
cuts, here-documents after the outer expansion, programs read from descriptors, files a line
writes and then runs, git configuration and sub-commands that run commands, awk and sed programs,
find expressions, kill operands, the files commands write.

To add a case to the analyzer table: append ``(command, [expected normalized lines])`` to
``LINES``; to a helper table, append to its parametrize list.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from fak.policy import CHECKS, ShellSyntaxError, analyze
from fak.policy.commands import descriptor_path, interpreter_program, parse_find, parse_kill
from fak.policy.paths import realpath
from fak.policy.programs import awk_effects, sed_effects
from fak.policy.shell import MAX_PARSE_CHARS, MAX_SOURCE_CHARS
from fak.policy.writes import written_paths

from test_policy_shell import dump

EVASIONS = Path(__file__).resolve().parent / "data" / "policy_evasions.jsonl"

LINES = [
    ("$'rm\\0x' -rf /", ["rm -rf /"]),
    ("r$'m\\x00junk' x", ["rm x"]),
    ("$'\\162m\\400' x", ["rm x"]),
    ("ls\0; rm -rf /", ["ls"]),
    ("bash <<EOF\nrm -rf \\$HOME\nEOF", ["bash", "rm -rf $HOME"]),
    ("bash <<EOF\nr\\\nm -rf /\nEOF", ["bash", "rm -rf /"]),
    ("bash <<'EOF'\nrm \\$x\nEOF", ["bash", "rm $x"]),
    ("cat <<EOF | bash\n$(run)\nEOF", ["cat", "run", "bash"]),
    ("cp /bin/rm ./d && ./d -rf /", ["cp /bin/rm ./d", "d -rf /", "rm -rf /"]),
    ("cp /bin/rm a; mv a b; ./b x", ["cp /bin/rm a", "mv a b", "b x", "rm x"]),
    ("echo 'rm -rf /' > x.sh; sh x.sh", ["echo rm -rf /", "sh x.sh", "rm -rf /"]),
    ("cat > x.sh <<'E'\nsudo id\nE\nbash x.sh", ["cat", "bash x.sh", "sudo id", "id"]),
    ("git -c core.fsmonitor='rm -rf /' status", ["git -c core.fsmonitor=rm -rf / status",
                                                  "rm -rf /", "git status"]),
    ("git rebase -x 'make test' HEAD~1", ["git rebase -x make test HEAD~1", "make test"]),
    ("git bisect run pytest -x", ["git bisect run pytest -x", "pytest -x"]),
    ("git submodule foreach git pull", ["git submodule foreach git pull", "git pull"]),
    ("git config alias.p push", ["git config alias.p push", "git push"]),
    ("GIT_CONFIG_KEY_0=core.pager GIT_CONFIG_VALUE_0=less git log", ["less", "git log"]),
    ("GIT_WORK_TREE=.. git status", ["git status", "git --work-tree=.. status"]),
    ("awk 'BEGIN{system(\"ls\")}'", ["awk BEGIN{system(\"ls\")}", "ls"]),
    ("sed '1e date' f", ["sed 1e date f", "date"]),
    ("parallel gzip ::: a b", ["parallel gzip ::: a b", "gzip a", "gzip b"]),
    ("parallel 'mv {} {}.bak' ::: x", ["parallel mv {} {}.bak ::: x", "mv x x.bak"]),
    ("setarch x86_64 -R ls", ["setarch x86_64 -R ls", "ls"]),
    ("prlimit --nofile=9 -- ls", ["prlimit --nofile=9 -- ls", "ls"]),
    ("chrt -f 1 ls", ["chrt -f 1 ls", "ls"]),
    ("env -S'ls -l'", ["env -Sls -l", "ls -l"]),
    ("gdb -batch -ex 'shell ls'", ["gdb -batch -ex shell ls", "ls"]),
    ("export EDITOR='rm x'", ["export EDITOR=rm x", "rm x"]),
    ("split --filter='gzip > $FILE.gz' f", ["split --filter=gzip > $FILE.gz f", "gzip"]),
]


@pytest.mark.parametrize("src, lines", LINES, ids=[repr(s)[:40] for s, _ in LINES])
def test_normalized_lines(src: str, lines: list[str]) -> None:
    assert list(analyze(src).lines) == lines


def test_heredoc_body_after_outer_expansion() -> None:
    a = analyze("bash <<EOF\necho $HOME\nEOF")
    bash = a.commands[0]
    assert bash.program == "dynamic" and "computed at run time" in bash.note
    r = bash.redirects[0]
    assert r.body == "echo $HOME\n" and r.body_dynamic
    q = analyze("cat <<'EOF'\n\\$x $y\nEOF").commands[0].redirects[0]
    assert q.body == "\\$x $y\n" and not q.body_dynamic


def test_descriptor_programs() -> None:
    assert descriptor_path("/dev/stdin") == 0 and descriptor_path("-") == 0
    assert descriptor_path("/proc/self/fd/0") == 0 and descriptor_path("/proc/$$/fd/0") == 0
    assert descriptor_path("/proc/thread-self/fd/3") == 3 and descriptor_path("/dev/fd/7") == 7
    assert descriptor_path("/proc/1/task/2/fd/0") == 0 and descriptor_path("/dev/null") is None
    f = [False] * 4
    assert interpreter_program("awk", ["awk", "-f", "-", "x"], f) == ("stdin", None)
    assert interpreter_program("awk", ["awk", "-F:", "{print}", "x"], f) == ("string", 2)
    assert interpreter_program("sed", ["sed", "-n", "1p", "x"], f) == ("string", 2)
    assert interpreter_program("make", ["make", "--eval=x"], f[:2]) == ("string", 1)
    assert interpreter_program("make", ["make", "test"], f[:2]) == ("file", None)
    assert interpreter_program("perl", ["perl", "-lne", "print"], f[:3]) == ("string", 2)
    assert interpreter_program("bash", ["bash", "/dev/fd/3"], f[:2]) == ("descriptor", 1)
    prog = {c.line: c.program for c in analyze("bash /dev/fd/3 3<<'E'\nls\nE").commands}
    assert prog == {"bash /dev/fd/3": "heredoc", "ls": None}


@pytest.mark.parametrize("script, runs, writes", [
    ("s/.*/x/e", [None], []), ("1e date", ["date"], []), ("w out", [], ["out"]),
    ("s/a/b/gw log", [], ["log"]), ("/re/,+3W x", [], ["x"]), ("1,20p", [], []),
    ("s/w/e/g", [], []), ("/^e/d", [], []), ("y/ew/we/", [], []), ("a\\\ne w x", [], []),
    ("s|a|b|e", [None], []), ("\\,e,d", [], []), ("$!N;P;D", [], []), (":e\nbe", [], []),
])
def test_sed_effects(script: str, runs: list, writes: list) -> None:
    assert sed_effects(script) == (runs, writes)


@pytest.mark.parametrize("prog, runs, writes, environ", [
    ('BEGIN{system("ls")}', [("ls", False)], [], False),
    ('{system($0)}', [(None, False)], [], False),
    ('BEGIN{print "x" | "sh"}', [("sh", True)], [], False),
    ('{print | cmd}', [(None, True)], [], False),
    ('BEGIN{"date" | getline d}', [("date", False)], [], False),
    ('{c = "ls"; c | getline}', [(None, False)], [], False),
    ('{print > "o.txt"}', [], ["o.txt"], False),
    ('{if ($1 > 2) print}', [], [], False), ("/a|b/", [], [], False),
    ("NR==1||NR==2", [], [], False),
    ('{print ENVIRON["HOME"]}', [], [], True), ('{x = 4 / 2 / 1}', [], [], False),
    ('# system("ls")\n{print}', [], [], False), ('{print "system(1) | x"}', [], [], False),
])
def test_awk_effects(prog: str, runs: list, writes: list, environ: bool) -> None:
    assert awk_effects(prog) == (runs, writes, environ)


@pytest.mark.parametrize("cmd, delete_guarded, exec_guarded", [
    ("find . -delete", False, []), ("find . -name '*.pyc' -delete", True, []),
    ("find . -name '*.pyc' -o -delete", False, []), ("find . ! -name x -delete", False, []),
    ("find . ( -name a -o -name b ) -delete", True, []),
    ("find . ( -name a -o -type f ) -delete", False, []),
    ("find . -delete -name x", False, []), ("find . -name '*' -delete", False, []),
    ("find . -path ./build/x -delete", True, []), ("find . -exec rm {} +", True, [False]),
    ("find . -name x -exec rm {} ;", True, [True]),
    ("find . -type d -name c -exec rm -r {} +", True, [True]),
])
def test_find_guards(cmd: str, delete_guarded: bool, exec_guarded: list) -> None:
    argv = cmd.replace("'", "").split()
    call = parse_find(argv, [False] * len(argv))
    assert call.delete_guarded is delete_guarded and call.exec_guarded == exec_guarded


@pytest.mark.parametrize("cmd, ops", [
    ("kill -9 -1", ["-1"]), ("kill -- -1", ["-1"]), ("kill -1", []),
    ("kill -s KILL 1 2", ["1", "2"]),
    ("kill %1", ["%1"]), ("kill -TERM -- -5", ["-5"]), ("kill -n 9 -1", ["-1"]),
])
def test_parse_kill(cmd: str, ops: list) -> None:
    argv = cmd.split()
    assert [argv[i] for i in parse_kill(argv, [False] * len(argv))] == ops
    assert parse_kill(["kill", "-l"], [False, False]) is None


@pytest.mark.parametrize("cmd, paths", [
    ("cp -t /etc a b", ["/etc"]), ("cp --target=.. a", [".."]), ("cp a b", ["b"]),
    ("mv -t d a", ["a", "d"]), ("install -D a ~/x", ["~/x"]), ("tar -xf x.tar -C/tmp", ["/tmp"]),
    ("tar czf ../x.tgz .", ["../x.tgz"]), ("tar -tf x.tar", []), ("tar -cf - .", []),
    ("sort -o out in", ["out"]), ("sort -o../x in", ["../x"]), ("split -l 9 in pre", ["pre"]),
    ("uniq a b", ["b"]), ("sed -n 1,5w\\ h.txt f", ["h.txt"]), ("sed -i s/a/b/ f", ["f"]),
    ("patch -d .. -p1", [".."]), ("gcc -o ~/x x.c", ["~/x"]), ("gcc -ox x.c", ["x"]),
    ("python -m pytest --basetemp=.. t", [".."]), ("git worktree add ../w", ["../w"]),
    ("git archive -o ../a.tar HEAD", ["../a.tar"]), ("git config --global a.b c", ["~/.gitconfig"]),
    ("git -C .. status", [".."]), ("gzip f", ["f"]), ("gzip -c f", []), ("sponge x", ["x"]),
    ("find . -fprint ../l", ["../l"]), ("pip install --target ../t .", ["../t"]),
    ("awk {print>\"../o\"} f", ["../o"]), ("mkfifo ../p", ["../p"]),
])
def test_written_paths(cmd: str, paths: list) -> None:
    argv = [w.replace("\\ ", " ") for w in cmd.replace("\\ ", "\x00").split()]
    argv = [w.replace("\x00", " ") for w in argv]
    name = argv[0]
    assert [p for _, p in written_paths(name, argv, [False] * len(argv))] == paths


def test_renamed_binary_on_disk(tmp_path: Path) -> None:
    """A workspace file that is a copy of (or a link to) a system program is analyzed as it."""
    rm = os.path.realpath(shutil.which("rm") or "/bin/rm")
    shutil.copy(rm, tmp_path / "del")
    os.symlink(rm, tmp_path / "lrm")
    (tmp_path / "script.py").write_text("print(1)\n")
    root = realpath(str(tmp_path))
    assert analyze("./del -rf /", root).lines == ("del -rf /", "rm -rf /")
    assert analyze("lrm/../lrm x", root).lines[-1] != "rm x"    # not a path to the link
    assert analyze("./lrm x", root).lines == ("lrm x", "rm x")
    assert analyze("./script.py", root).lines == ("script.py",)
    assert analyze("./del -rf /").lines == ("del -rf /",)       # no root: nothing looked up


def test_fork_bomb_and_functions() -> None:
    check = CHECKS["fork_bomb"].fn
    assert check(analyze(":(){ :|:& };:"), None, ())
    assert check(analyze("f(){ f & }; f"), None, ())
    assert check(analyze("f(){ f; }; f"), None, ()) is None
    assert check(analyze("f(){ ls | head; }; f"), None, ()) is None
    funcs = {c.line: c.func for c in analyze("g(){ a; h(){ b; }; c; }; d").commands}
    assert funcs == {"a": "g", "b": "h", "c": "g", "d": None}


def test_limits() -> None:
    with pytest.raises(ShellSyntaxError, match="longer than"):
        analyze("x" * (MAX_SOURCE_CHARS + 1))
    inner = "ls " + "a" * 40000
    src = inner
    for _ in range(7):
        src = "bash -c " + json.dumps(src)
    assert len(src) < MAX_SOURCE_CHARS < MAX_PARSE_CHARS
    with pytest.raises(ShellSyntaxError, match="characters to analyze"):
        analyze(src)


def evasion_commands() -> list[str]:
    out = []
    for line in EVASIONS.read_text(encoding="utf-8").splitlines():
        if line.strip():
            out.append(json.loads(line)["arguments"]["command"])
    return out + [s for s, _ in LINES]


@pytest.mark.parametrize("src", evasion_commands())
def test_fast_paths_agree_with_full_parser_on_evasions(src: str) -> None:
    fast, full = dump(src)
    assert fast == full
