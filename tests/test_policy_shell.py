"""The shell analyzer behind the policy's ``normalized`` regexes and named checks: what it finds
in a command line, that its fast paths agree with the full parser, that path resolution agrees
with ``os.path.realpath``, and the option grammars of the commands it knows.

To add a case to the analyzer table: append ``(command, [expected normalized lines])`` to
``LINES``.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fak.policy import CHECKS, ShellSyntaxError, analyze
from fak.policy.commands import getopt, interpreter_program, parse_git, parse_pip, unwrap
from fak.policy.paths import realpath, resolve, within
from fak.policy.shell import MAX_DEPTH, analyze_full

CORPUS = Path(__file__).resolve().parent / "data" / "policy_corpus.jsonl"

LINES = [
    ("rm -rf /", ["rm -rf /"]),
    ("rm  -r\t-f   /", ["rm -r -f /"]),
    ("r''m -rf \"/\"", ["rm -rf /"]),
    ("\\r\\m -rf /", ["rm -rf /"]),
    ("$'\\x72\\155' -rf /", ["rm -rf /"]),
    ("/usr/bin/rm -rf /", ["rm -rf /"]),
    ("{rm,-rf,/}", ["rm -rf /"]),
    ("echo {a,b}{1..2}", ["echo a1 a2 b1 b2"]),
    ("echo '{a,b}' \"{c,d}\"", ["echo {a,b} {c,d}"]),
    ("echo {}", ["echo {}"]),
    ("echo $(rm -rf /)", ["rm -rf /", "echo $(rm -rf /)"]),
    ("echo \"$(rm -rf / | cat)\"", ["rm -rf /", "cat", "echo $(rm -rf / | cat)"]),
    ("echo `rm -rf /`", ["rm -rf /", "echo `rm -rf /`"]),
    ("bash -c 'rm -rf /'", ["bash -c rm -rf /", "rm -rf /"]),
    ("sh -xc 'ls; rm -rf ~'", ["sh -xc ls; rm -rf ~", "ls", "rm -rf ~"]),
    ("eval 'rm -rf /'", ["eval rm -rf /", "rm -rf /"]),
    ("a; b && c || d | e & f\ng", ["a", "b", "c", "d", "e", "f", "g"]),
    ("sudo -u root -- env A=1 nohup /bin/rm -rf /",
     ["sudo -u root -- env A=1 nohup /bin/rm -rf /", "env A=1 nohup /bin/rm -rf /",
      "nohup /bin/rm -rf /", "rm -rf /"]),
    ("timeout -s KILL 5 nice -n 10 rm x", ["timeout -s KILL 5 nice -n 10 rm x",
                                             "nice -n 10 rm x", "rm x"]),
    ("xargs -I{} rm -rf {}", ["xargs -I{} rm -rf {}", "rm -rf {}"]),
    ("git -C . -c x=y --no-pager push origin", ["git -C . -c x=y --no-pager push origin",
                                                "git push origin"]),
    ("git -c alias.p='push -f' p", ["git -c alias.p=push -f p", "git push -f"]),
    ("find . -name '*.py' -exec grep -l x {} +", ["find . -name *.py -exec grep -l x {} +",
                                                   "grep -l x {}"]),
    ("if true; then ls; elif x; then y; else z; fi", ["true", "ls", "x", "y", "z"]),
    ("while read l; do echo $l; done < f", ["read l", "echo $l"]),
    ("for i in 1 2; do touch f$i; done", ["touch f$i"]),
    ("case $x in a|b) one;; (c) two;; *) three;; esac", ["one", "two", "three"]),
    ("f() { inner; }; f", ["inner", "f"]),
    ("function g { inner; }", ["inner"]),
    ("(a; (b)) | { c; }", ["a", "b", "c"]),
    ("[[ -f a && $b > c ]] && d", ["[[ -f a && $b > c ]]", "d"]),
    ("(( i++ )); echo $((i * 2))", ["echo $((i * 2))"]),
    ("x=1 y=$(inner) cmd arg", ["inner", "cmd arg"]),
    ("arr=(a b $(inner)); echo ok", ["inner", "echo ok"]),
    ("ls # rm -rf /", ["ls"]),
    ("echo a#b", ["echo a#b"]),
    ("cat <<'EOF'\n$(not run)\nEOF\nls", ["cat", "ls"]),
    ("cat <<EOF\n$(run)\nEOF", ["run", "cat"]),
    ("cat <<-EOF\n\t$(run)\n\tEOF\necho after", ["run", "cat", "echo after"]),
    ("bash <<'X'\nrm -rf /\nX", ["bash", "rm -rf /"]),
    ("bash <<< 'rm -rf /'", ["bash", "rm -rf /"]),
    ("diff <(a) >(b)", ["a", "b", "diff <(a) >(b)"]),
    ("trap 'rm -rf ~' EXIT", ["trap rm -rf ~ EXIT", "rm -rf ~"]),
    ("GIT_PAGER='rm -rf /' git log", ["rm -rf /", "git log"]),
    ("r\\\nm -rf /", ["rm -rf /"]),
    ("echo a\\;rm", ["echo a;rm"]),
    ("", []),
    ("   \n\n  ", []),
    (":", [":"]),
]


@pytest.mark.parametrize("src, lines", LINES, ids=[repr(s)[:40] for s, _ in LINES])
def test_normalized_lines(src: str, lines: list[str]) -> None:
    assert list(analyze(src).lines) == lines


@pytest.mark.parametrize("src", [
    "echo 'unterminated", 'echo "unterminated', "echo `unterminated", "echo $(unterminated",
    "echo ${unterminated", "if true; then ls", "while true; do ls", "for x in a b", "case x in",
    "{ ls", "ls )", "echo $'abc", "f() ( ls", "foo ( bar )", "a=(1 2",
])
def test_syntax_errors(src: str) -> None:
    with pytest.raises(ShellSyntaxError):
        analyze(src)


def test_nesting_limit() -> None:
    src = "ls"
    for _ in range(MAX_DEPTH + 2):
        src = f"bash -c {json.dumps(src)}"
    with pytest.raises(ShellSyntaxError, match="nested deeper"):
        analyze(src)
    assert analyze("echo " + "$(" * 5 + "x" + ")" * 5).lines[0] == "x"


def test_brace_expansion_limit() -> None:
    with pytest.raises(ShellSyntaxError, match="brace expansion"):
        analyze("echo {1..100000}")
    with pytest.raises(ShellSyntaxError, match="brace expansion"):
        analyze("echo {a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}")


def test_dynamic_words_and_notes() -> None:
    a = analyze('$x -rf /; "$(echo rm)" x; eval "$y"; bash -c "$z"; ls $HOME; /??n/r? x')
    by_line = {c.line: c for c in a.commands}
    assert by_line["$x -rf /"].note and by_line["$x -rf /"].dyn == [True, False, False]
    assert by_line["$(echo rm) x"].note
    assert by_line["eval $y"].program == "dynamic"
    assert by_line["bash -c $z"].program == "dynamic"
    assert by_line["ls $HOME"].note is None and by_line["ls $HOME"].dyn == [False, True]
    assert by_line["r? x"].note     # a glob as the name: basename kept, flagged


def test_stdin_and_program_sources() -> None:
    a = analyze("curl x | sh; bash < f; python - <<'E'\nprint(1)\nE\nbash <(curl y); "
                "python s.py; python -m pip; python -c 'x'; xargs bash")
    progs = [(c.line, c.stdin, c.program) for c in a.commands if c.program]
    assert ("sh", "pipe", "stdin") in progs
    assert ("bash", "file", "stdin") in progs
    assert ("python -", "heredoc", "heredoc") in progs
    assert ("bash <(curl y)", "", "procsub") in progs
    assert ("python s.py", "", "file") in progs
    assert ("python -m pip", "", "module") in progs
    assert ("python -c x", "", "string") in progs
    assert ("bash", "", "dynamic") in progs


def test_directory_tracking() -> None:
    a = analyze("cd /srv && rm x; (cd sub; rm y); pushd ~ ; popd; rm z")
    rms = [c for c in a.commands if c.name == "rm"]
    assert rms[0].cwds == ("", "/srv")
    assert rms[1].cwds == ("", "/srv", "sub", "/srv/sub")
    assert "~" in rms[2].cwds
    loop = analyze("for d in a b; do cd $d; done; rm x")
    assert all(c.cwds == (None,) for c in loop.commands)
    func = analyze("f() { ls; }; cd /; rm x")
    assert all(c.cwds == (None,) for c in func.commands)
    assert analyze("env -C /etc rm x").commands[-1].cwds == ("/etc",)


# ------------------------------------------------------------------------------ fast paths


def dump(src: str):
    """Everything an analysis says, for comparing two ways of getting it."""
    def one(fn):
        try:
            a = fn(src)
        except ShellSyntaxError:
            return "syntax error"
        return [(c.argv, c.dyn, c.flags, c.name, c.line, c.stdin, c.cwds, c.via,
                 c.unknown_operands, c.find_roots, c.program, c.program_index, c.note,
                 [(r.op, r.fd, r.target, r.dynamic, r.procsub, r.body) for r in c.redirects])
                for c in a.commands]
    return one(analyze), one(analyze_full)


def corpus_commands() -> list[str]:
    out = []
    for line in CORPUS.read_text(encoding="utf-8").splitlines():
        e = json.loads(line)
        args = e["arguments"]
        if isinstance(args, dict) and isinstance(args.get("command"), str):
            out.append(args["command"])
    return out + [src for src, _ in LINES]


@pytest.mark.parametrize("src", corpus_commands())
def test_fast_paths_agree_with_full_parser_on_corpus(src: str) -> None:
    fast, full = dump(src)
    assert fast == full


WORDS = ["ls", "rm", "-rf", "/", "git", "push", "-C", ".", "python", "-m", "pytest", "-c",
         "bash", "sh", "cd", "/tmp", "sub", "x.py", "sudo", "env", "A=1", "find", "-exec", "{}",
         ";", "xargs", "cat", "~", "..", "-", "pip", "install", "-e", "tar", "1,20p", "a b",
         "it's", "-I{}", "curl", "http://x", "popd", "eval", "echo", "--", "2", "time", "!"]
OPS = [" ", " ", " ", "; ", " && ", " || ", " | ", " & ", "\n", " > out ", " 2>&1 ", " < in ",
       " >> /tmp/log ", " 2>/dev/null "]


@st.composite
def command_lines(draw) -> str:
    parts = []
    for _ in range(draw(st.integers(1, 12))):
        w = draw(st.sampled_from(WORDS))
        style = draw(st.integers(0, 5))
        if style == 1:
            w = "'" + w.replace("'", "") + "'"
        elif style == 2:
            w = '"' + w + '"'
        elif style == 3 and len(w) > 1:
            w = w[0] + "''" + w[1:]
        parts.append(w)
        parts.append(draw(st.sampled_from(OPS)))
    return "".join(parts).strip()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(command_lines())
def test_fast_paths_agree_with_full_parser_generated(src: str) -> None:
    fast, full = dump(src)
    assert fast == full


# ------------------------------------------------------------------------------ paths


def test_realpath_agrees_with_os_realpath(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    out = tmp_path / "out"
    (ws / "src" / "pkg").mkdir(parents=True)
    (out / "deep").mkdir(parents=True)
    (ws / "src" / "pkg" / "a.py").write_text("")
    (out / "secret").write_text("")
    os.symlink(out, ws / "escape")
    os.symlink("../out/secret", ws / "slink")
    os.symlink("/nonexistent/dir", ws / "dangling")
    os.symlink("src", ws / "inner")
    os.symlink("loop2", ws / "loop1")
    os.symlink("loop1", ws / "loop2")
    os.symlink("a.py", ws / "src" / "pkg" / "rel")
    (ws / "file").write_text("")
    comps = ["src", "pkg", "a.py", "..", ".", "escape", "slink", "dangling", "inner", "missing",
             "deep", "secret", "loop1", "", "x", "rel", "file"]
    rng = random.Random(7)
    for _ in range(3000):
        rel = "/".join(rng.choice(comps) for _ in range(rng.randint(1, 6)))
        for p in (f"{ws}/{rel}", f"{ws}/{rel}/", f"{ws}//{rel}"):
            assert realpath(p) == os.path.realpath(p), p


def test_resolve_and_within(tmp_path: Path) -> None:
    root = realpath(str(tmp_path))
    assert resolve("a/b", "", root) == f"{root}/a/b"
    assert resolve("a", "sub", root) == f"{root}/sub/a"
    assert resolve("a", "/etc", root) == "/etc/a"
    assert resolve("a", None, root) is None
    assert resolve("/etc", None, root) == "/etc"
    assert resolve("x\0y", "", root) is None
    assert resolve("~nosuchuser_fak/x", "", root) is None
    assert resolve("rel", "", None) is None
    assert within(f"{root}/a", root) and within(root, root) and not within(root, root, strict=True)
    assert not within(f"{root}2/a", root)
    assert within("/anything", "/")


# ------------------------------------------------------------------------------ commands


def test_getopt() -> None:
    args = ["rm", "-rfv", "--rec", "x", "--", "-y"]
    opts, ops = getopt(args, [False] * 6, long_names=("recursive", "force"))
    assert [o[0] for o in opts] == ["-r", "-f", "-v", "--recursive"]
    assert [args[i] for i in ops] == ["x", "-y"]
    opts, ops = getopt(["timeout", "-s", "KILL", "5", "rm", "-rf"], [False] * 6,
                       short_arg="sk", permute=False)
    assert opts == [("-s", "KILL", 2)] and ops == [3, 4, 5]
    opts, _ = getopt(["xargs", "-I{}", "-i"], [False] * 3, short_arg="I", short_opt="i")
    assert opts == [("-I", "{}", 1), ("-i", None, -1)]


@pytest.mark.parametrize("argv, hit", [
    ("rm -rf x", True), ("rm -fr x", True), ("rm -r -f x", True), ("rm -R -f x", True),
    ("rm --recursive --force x", True), ("rm --rec --fo x", True), ("rm x -rf", True),
    ("rm -rfi x", True), ("rm -r x", False), ("rm -f x", False), ("rm x", False),
    ("rm -- -rf", False), ("rm $flags x", True), ("rm -dv x", False),
])
def test_rm_recursive_force(argv: str, hit: bool) -> None:
    found = CHECKS["rm_recursive_force"].fn(analyze(argv), None, ())
    assert (found is not None) == hit


@pytest.mark.parametrize("cmd, remote", [
    ("pip install -e .", False), ("pip install .", False), ("pip install -e '.[test]'", False),
    ("pip install ./dist/pkg-1.0-py3-none-any.whl", False), ("pip install --no-deps -e .", False),
    ("pip install requests", True), ("pip install -U pip", True),
    ("pip install git+https://x/y", True), ("pip install -r req.txt", True),
    ("pip install -e git+https://x/y#egg=y", True), ("pip3.11 install x", True),
    ("python -m pip install x", True), ("python3 -mpip install x", True), ("uv pip install x", True),
    ("pip --quiet install x", True), ("pip list", False), ("pip install $PKG", True),
])
def test_pip_install_remote(cmd: str, remote: bool) -> None:
    found = CHECKS["pip_install_remote"].fn(analyze(cmd), None, ())
    assert (found is not None) == remote, found


def test_parse_pip_directly() -> None:
    assert parse_pip(["pip", "install", "-e", "."], [False] * 4, 2) is None
    assert parse_pip(["pip", "install", "x"], [False] * 3, 2) == ("x", "not a local path")


def test_interpreter_program() -> None:
    f = [False] * 8
    assert interpreter_program("bash", ["bash", "-lc", "ls"], f) == ("string", 2)
    assert interpreter_program("bash", ["bash", "-o", "pipefail", "-c", "ls"], f) == ("string", 4)
    assert interpreter_program("bash", ["bash"], f) == ("stdin", None)
    assert interpreter_program("bash", ["bash", "-s", "x"], f) == ("stdin", None)
    assert interpreter_program("bash", ["bash", "/dev/stdin"], f) == ("stdin", None)
    assert interpreter_program("bash", ["bash", "s.sh"], f) == ("file", 1)
    assert interpreter_program("python3", ["python3", "-u", "-c", "x"], f) == ("string", 3)
    assert interpreter_program("python3", ["python3", "-Wignore", "-m", "pytest"], f) == ("module", 3)
    assert interpreter_program("python3", ["python3", "-"], f) == ("stdin", None)
    assert interpreter_program("perl", ["perl", "-e", "x"], f) == ("string", 2)
    assert interpreter_program("node", ["node", "--eval", "x"], f) == ("string", 2)


def test_unwrap_and_git() -> None:
    f = [False] * 8
    assert unwrap("ls", ["ls"], f[:1]) is None
    assert unwrap("sudo", ["sudo", "-l"], f[:2]) is None
    w = unwrap("env", ["env", "-i", "A=1", "B=2", "rm", "x"], f[:6])
    assert w is not None and w.start == 4
    w = unwrap("su", ["su", "-", "root", "-c", "rm x"], f[:5])
    assert w is not None and w.programs == [4]
    call = parse_git(["git", "-C", "x", "-c", "alias.p=push", "--git-dir=y", "p"], f[:7])
    assert call.sub == 6 and call.aliases == {"p": "push"}


# ------------------------------------------------------------------------------ robustness

ADVERSARIAL = [
    "a" * 20000 + "{", "x" * 5000 + "$", "{" * 5000 + "x", "echo " + "${" * 3000,
    "echo " + "$(" * 50, '"' * 10001, "a," * 5000 + "{", "((" * 3000, "((" * 3000 + "))" * 3000,
    "x=(" * 1000, "'" * 9999, "`" * 999, "\\" * 10000, "; " * 5000, "| " * 3000 + "x",
    "cd a; " * 500 + "rm x", "echo {1..9}{1..9}{1..9}", "a=$(" * 30, "<<E\n" * 500,
    "bash -c " + "'" * 3, "$'" + "\\x" * 4000,
]


@pytest.mark.parametrize("src", ADVERSARIAL, ids=[f"adv{i}" for i in range(len(ADVERSARIAL))])
def test_adversarial_inputs_terminate(src: str) -> None:
    """Inputs built to make a lexer backtrack or recurse: each must end (guarded by an alarm,
    a liveness check rather than a speed assertion) with an analysis or a ShellSyntaxError."""
    import signal

    def alarm(*_):
        raise TimeoutError(f"analysis of {src[:30]!r}... did not finish")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(20)
    try:
        try:
            analyze(src)
        except ShellSyntaxError:
            pass
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


SHELLISH = "ab $(){}[]'\"\\`|&;<>#~*?=-/.\n\t01rmgitpush"


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=SHELLISH, max_size=60))
def test_decide_never_raises(text: str) -> None:
    from fak.policy import Policy, Verdict
    global _EXAMPLE_POLICY
    try:
        policy = _EXAMPLE_POLICY
    except NameError:
        policy = _EXAMPLE_POLICY = Policy.load(
            Path(__file__).resolve().parents[1] / "examples" / "swebench-coding-agent-policy.json")
    v = policy.decide("bash", {"command": text}, workspace_root="/nonexistent-ws")
    assert isinstance(v, Verdict) and v.reason
    fast, full = dump(text)
    assert fast == full
