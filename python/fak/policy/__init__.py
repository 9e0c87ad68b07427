"""fak's tool-call policy engine: a versioned JSON policy file, compiled once, that allows or
denies each tool call a model proposes, and an audit log of the decisions.

>>> from fak.policy import Policy, AuditLog
>>> policy = Policy.load("examples/swebench-coding-agent-policy.json")
>>> v = policy.decide("bash", '{"command": "sudo rm -rf /"}', conversation="c1",
...                   workspace_root="/tmp/ws")
>>> v.allowed, v.rule
(False, 'tools.bash.deny[0]')

Modules, one job each: :mod:`~fak.policy.schema` (the file format and its validation),
:mod:`~fak.policy.compile` (rules → compiled regexes, checks, roots), :mod:`~fak.policy.shell`
(static analysis of shell commands: a package of lexer, grammar, command following, fast paths),
:mod:`~fak.policy.commands` (what particular commands do with their arguments; with
:mod:`~fak.policy.options`, :mod:`~fak.policy.interpreters`, :mod:`~fak.policy.findcmd`),
:mod:`~fak.policy.writes` (the files a command writes), :mod:`~fak.policy.gitcmd` (what git
sub-commands run and write), :mod:`~fak.policy.programs` (what sed and awk programs run and
write), :mod:`~fak.policy.binaries` (what program a workspace file really is),
:mod:`~fak.policy.readonly` (which tool calls and command lines only read),
:mod:`~fak.policy.checks` (named semantic checks), :mod:`~fak.policy.paths` (path containment),
:mod:`~fak.policy.decide` (the decision path, its input bounds and budgets),
:mod:`~fak.policy.audit` (the JSONL audit log), :mod:`~fak.policy.check` (the ``--policy-check``
command). The format is documented in ``docs/policy.md``.
"""

from fak.policy.audit import AuditLog
from fak.policy.check import check_file, check_main
from fak.policy.compile import Verdict
from fak.policy.decide import Policy, PolicyError
from fak.policy.shell import ShellSyntaxError, analyze
from fak.policy.checks import CHECKS

__all__ = [
    "Policy",
    "PolicyError",
    "Verdict",
    "AuditLog",
    "check_file",
    "check_main",
    "analyze",
    "ShellSyntaxError",
    "CHECKS",
]
