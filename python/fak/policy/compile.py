"""Compile a validated :class:`~fak.policy.schema.PolicyFile` into the structures the decision
path reads: regexes compiled once (and, per argument, merged into one alternation that screens
all of a tool's regex rules in a single search), named checks looked up, extra roots resolved to
real paths, and every constant verdict built in advance.

Rule ids (``Verdict.rule``) are the rule's location in the file: ``default``, ``arguments``,
``tools.<tool>.allowed``, ``tools.<tool>.paths[i]``, ``tools.<tool>.deny[i]``,
``tools.<tool>.on_unparseable``, ``tools.<tool>.allow`` (nothing matched) or
``tools.<tool>.allow.rules[i]`` (what matched), ``tools.<tool>.budget``, ``budgets.total``, and
``tools.<tool>`` for a call allowed with no further rule.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import msgspec

from fak.policy.paths import real_root
from fak.policy.schema import Budget, PolicyFile, Rule, ToolPolicy
from fak.policy.checks import CHECKS, CheckFn

RAW, NORMALIZED, CHECK = 0, 1, 2


class Verdict(msgspec.Struct, frozen=True, gc=False):
    """A decision on one tool call: ``allowed`` (bool), ``reason`` (str, for the client and the
    audit log), ``rule`` (str, the stable id of the rule that decided, e.g.
    ``"tools.bash.deny[0]"`` or ``"default"``)."""

    allowed: bool
    reason: str
    rule: str


@dataclass(frozen=True, slots=True)
class CompiledRule:
    """A deny or allow rule ready to run: ``kind`` is RAW, NORMALIZED or CHECK."""

    rule_id: str
    argument: str
    reason: str
    kind: int
    rx: re.Pattern[str] | None
    check: CheckFn | None
    extra_roots: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CompiledScope:
    """A path scope ready to run."""

    rule_id: str
    argument: str
    reason: str
    optional: bool
    extra_roots: tuple[str, ...]
    git_metadata: str | None = None
    format: str = "path"


@dataclass(frozen=True, slots=True)
class CompiledBudget:
    """A call budget and the verdict given once it is spent."""

    max_calls: int
    denied: Verdict


@dataclass(frozen=True, slots=True)
class ArgumentPlan:
    """The deny rules of one argument, split by kind, each with its position in the tool's deny
    list (the first matching position decides). ``raw_screen``/``norm_screen``: one regex that
    matches when any rule of that kind might (``None``: try each rule)."""

    argument: str
    first: CompiledRule
    first_index: int
    raw: tuple[tuple[int, CompiledRule], ...]
    raw_screen: re.Pattern[str] | None
    normalized: tuple[tuple[int, CompiledRule], ...]
    norm_screen: re.Pattern[str] | None
    checks: tuple[tuple[int, CompiledRule], ...]
    first_shell_index: int


@dataclass(frozen=True, slots=True)
class CompiledTool:
    """One tool's rules. ``screens`` maps ``(argument, kind)`` to one regex that matches when
    any of that argument's regex rules of that kind matches (``None`` when they cannot be merged,
    e.g. a rule uses global inline flags); ``shell_arguments`` are the arguments parsed as
    shell."""

    name: str
    allowed: bool
    denied: Verdict | None
    allowed_verdict: Verdict
    scopes: tuple[CompiledScope, ...]
    deny: tuple[CompiledRule, ...]
    plans: tuple[ArgumentPlan, ...]
    shell_arguments: frozenset[str]
    allow: tuple[CompiledRule, ...]
    allow_miss: Verdict | None
    budget: CompiledBudget | None
    unparseable_allows: bool
    unparseable_reason: str
    unparseable_rule: str
    convert: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class CompiledPolicy:
    """The whole compiled policy."""

    tools: dict[str, CompiledTool]
    default: Verdict
    total: CompiledBudget | None
    workspace_root: str | None


def _rule(rule: Rule, rule_id: str) -> CompiledRule:
    if rule.check is not None:
        return CompiledRule(rule_id, rule.argument, rule.reason, CHECK, None,
                            CHECKS[rule.check].fn,
                            tuple(real_root(r) for r in rule.extra_roots))
    kind = NORMALIZED if rule.match == "normalized" else RAW
    return CompiledRule(rule_id, rule.argument, rule.reason, kind, re.compile(rule.regex or ""),
                        None, ())


def _screen(patterns: list[str]) -> re.Pattern[str] | None:
    if len(patterns) <= 1:
        return None
    try:
        return re.compile("|".join(f"(?:{p})" for p in patterns))
    except re.error:
        return None


def _budget(b: Budget | None, what: str, rule_id: str) -> CompiledBudget | None:
    if b is None:
        return None
    return CompiledBudget(b.max_calls, Verdict(False, f"{b.reason} (at most {b.max_calls} "
                                                      f"{what} per conversation)", rule_id))


def _tool(name: str, t: ToolPolicy) -> CompiledTool:
    base = f"tools.{name}"
    deny = tuple(_rule(r, f"{base}.deny[{i}]") for i, r in enumerate(t.deny))
    allow: tuple[CompiledRule, ...] = ()
    allow_miss = None
    if t.allow is not None:
        allow = tuple(_rule(r, f"{base}.allow.rules[{i}]") for i, r in enumerate(t.allow.rules))
        allow_miss = Verdict(False, t.allow.reason, f"{base}.allow")
    plans = []
    for arg in dict.fromkeys(r.argument for r in deny):
        mine = [(i, r) for i, r in enumerate(deny) if r.argument == arg]
        raw = tuple((i, r) for i, r in mine if r.kind == RAW)
        norm = tuple((i, r) for i, r in mine if r.kind == NORMALIZED)
        checks = tuple((i, r) for i, r in mine if r.kind == CHECK)
        shell_idx = [i for i, r in mine if r.kind != RAW]
        plans.append(ArgumentPlan(
            argument=arg, first=mine[0][1], first_index=mine[0][0],
            raw=raw, raw_screen=_screen([r.rx.pattern for _, r in raw]),  # type: ignore[union-attr]
            normalized=norm,
            norm_screen=_screen([r.rx.pattern for _, r in norm]),  # type: ignore[union-attr]
            checks=checks, first_shell_index=shell_idx[0] if shell_idx else 1 << 30))
    shell_args = frozenset(r.argument for r in (*deny, *allow) if r.kind != RAW)
    unp = t.on_unparseable
    return CompiledTool(
        name=name,
        allowed=t.allowed,
        denied=None if t.allowed else Verdict(False, t.reason or f"tool {name!r} is not allowed",
                                              f"{base}.allowed"),
        allowed_verdict=Verdict(True, f"allowed by {base}", base),
        scopes=tuple(CompiledScope(f"{base}.paths[{i}]", s.argument, s.reason, s.optional,
                                   tuple(real_root(r) for r in s.extra_roots), s.git_metadata, s.format)
                     for i, s in enumerate(t.paths)),
        deny=deny,
        plans=tuple(plans),
        shell_arguments=shell_args,
        allow=allow,
        allow_miss=allow_miss,
        budget=_budget(t.budget, f"calls of `{name}`", f"{base}.budget"),
        unparseable_allows=unp is not None and unp.verdict == "allow",
        unparseable_reason=unp.reason if unp is not None else "not valid shell",
        unparseable_rule=f"{base}.on_unparseable",
        convert=tuple(t.convert.items()),
    )


def compile_policy(pf: PolicyFile) -> CompiledPolicy:
    """Compile a validated policy file (regexes, checks, roots, constant verdicts)."""
    return CompiledPolicy(
        tools={name: _tool(name, t) for name, t in pf.tools.items()},
        default=Verdict(pf.default.verdict == "allow", pf.default.reason, "default"),
        total=_budget(pf.budgets.total, "tool calls", "budgets.total"),
        workspace_root=pf.workspace_root,
    )
