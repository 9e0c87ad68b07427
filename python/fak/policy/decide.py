"""The decision path: :class:`Policy` adjudicates one proposed tool call.

Evaluation order for ``decide(tool, arguments)`` (the first step that decides wins):

1. ``arguments`` (a JSON string, bytes, or a dict) must decode to a JSON object, else deny
   (rule ``arguments``); so must text longer than :data:`MAX_ARGUMENTS_CHARS` or nested deeper
   than :data:`MAX_ARGUMENTS_DEPTH`, which is not decoded at all.
2. A tool the file does not list gets the ``default`` verdict (rule ``default``); if that
   allows, the total budget still applies.
3. ``allowed: false`` → deny (``tools.<t>.allowed``).
4. Path scopes, in order (``tools.<t>.paths[i]``): the argument must be a string that resolves
   inside the workspace root (or an extra root); a missing argument denies unless ``optional``;
   no workspace root known → deny; with ``git_metadata``, a path that is git metadata (a
   ``.git`` component as written or resolved) → deny (``tools.<t>.paths[i].git_metadata``).
5. Deny rules, in order (``tools.<t>.deny[i]``): the first that matches denies. An argument a
   ``normalized`` regex or a ``check`` reads is parsed as shell once; if it is not valid shell,
   the tool's ``on_unparseable`` decides (default: deny, ``tools.<t>.on_unparseable``).
6. The allow list, if any: some rule must match (``tools.<t>.allow.rules[i]``), else deny
   (``tools.<t>.allow``). A ``normalized`` allow rule must match every command line.
7. Budgets, per conversation: the tool's (``tools.<t>.budget``) then the total
   (``budgets.total``). Only allowed calls are counted.
8. Allow (``tools.<t>`` or the allow rule that matched).
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import threading
from pathlib import Path
from typing import Any

import msgspec

from fak.errors import FakError
from fak.policy import schema
from fak.policy.compile import (NORMALIZED, RAW, CompiledBudget, CompiledPolicy, CompiledTool,
                                Verdict, compile_policy)
from fak.gitsafe import names_git_metadata
from fak.policy.patches import PatchError, patch_paths
from fak.policy.paths import real_root, resolve, within
from fak.policy.shell import Analysis, ShellSyntaxError, analyze

_decode_json = msgspec.json.Decoder().decode
_NOT_OBJECT = Verdict(False, "tool-call arguments must be a JSON object", "arguments")
_log = logging.getLogger("fak.policy")

MAX_ARGUMENTS_CHARS = 1 << 20    # characters (or bytes) of JSON text decoded at most
MAX_ARGUMENTS_DEPTH = 64         # nesting of arrays and objects in the arguments
_MAX_NODES = 1 << 16             # values walked when checking a decoded dict's depth
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_JSON_STRING_B = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_BRACKETS = re.compile(r"[\[\]{}]")
_BRACKETS_B = re.compile(rb"[\[\]{}]")


def _too_deep_text(text: str | bytes) -> bool:
    """True when the JSON text nests arrays/objects deeper than :data:`MAX_ARGUMENTS_DEPTH`
    (brackets inside strings do not count). Linear in the text, in C but for the brackets."""
    if isinstance(text, str):
        if text.count("[") + text.count("{") <= MAX_ARGUMENTS_DEPTH:
            return False
        brackets = "".join(_BRACKETS.findall(_JSON_STRING.sub("", text)))
    else:
        if text.count(b"[") + text.count(b"{") <= MAX_ARGUMENTS_DEPTH:
            return False
        brackets = b"".join(_BRACKETS_B.findall(_JSON_STRING_B.sub(b"", text))).decode()
    depth = 0
    for c in brackets:
        if c == "[" or c == "{":
            depth += 1
            if depth > MAX_ARGUMENTS_DEPTH:
                return True
        else:
            depth -= 1
    return False


def _too_deep_value(args: dict[str, Any]) -> bool:
    """True when a decoded arguments dict nests lists/dicts deeper than
    :data:`MAX_ARGUMENTS_DEPTH`, or holds more than 65,536 values (walked without recursion)."""
    stack: list[tuple[Any, int]] = [(v, 1) for v in args.values() if type(v) in (dict, list)]
    seen = 0
    while stack:
        value, depth = stack.pop()
        seen += 1
        if depth > MAX_ARGUMENTS_DEPTH or seen > _MAX_NODES:
            return True
        children = value.values() if type(value) is dict else value
        stack.extend((c, depth + 1) for c in children if type(c) in (dict, list))
    return False
_TOTAL = None  # key of the all-tools count in a conversation's counters
_NO_RULE = 1 << 30


class PolicyError(FakError, ValueError):
    """A policy file that cannot be used. ``errors`` (list[str]) holds every problem found,
    each ``"<location>: <problem>"`` with the location a JSON path such as
    ``tools.bash.deny[2].regex``."""

    def __init__(self, errors: list[str], source: str = "policy"):
        self.errors = list(errors)
        self.source = source
        lines = "\n".join(f"  {e}" for e in self.errors)
        super().__init__(f"invalid {source} ({len(self.errors)} problem"
                         f"{'s' if len(self.errors) != 1 else ''}):\n{lines}")


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


class Policy:
    """A compiled tool-call policy. Build with :meth:`load` or :meth:`from_dict`; thread-safe.

    ``file`` is the validated :class:`~fak.policy.schema.PolicyFile`; ``source`` where it came
    from."""

    def __init__(self, file: schema.PolicyFile, source: str = "<dict>"):
        self.file = file
        self.source = source
        self._c: CompiledPolicy = compile_policy(file)
        self._tools = self._c.tools
        self._lock = threading.Lock()
        self._counts: dict[str, dict[str | None, int]] = {}

    # ------------------------------------------------------------------------- construction

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Policy:
        """Read, validate and compile the policy file at ``path``.

        Raises :class:`PolicyError` listing every problem with its location (unreadable file,
        invalid JSON with line/column, schema and rule errors)."""
        src = os.fspath(path)
        try:
            text = Path(src).read_bytes()
        except OSError as e:
            raise PolicyError([f"(file): cannot read: {e.strerror or e}"], src) from None
        obj, errors = schema.decode_json(text)
        if errors:
            raise PolicyError(errors, src)
        return cls._validated(obj, src)

    @classmethod
    def from_dict(cls, obj: Any, source: str = "<dict>") -> Policy:
        """Validate and compile a policy given as a decoded JSON object (a dict).

        Raises :class:`PolicyError` listing every problem with its location."""
        return cls._validated(obj, source)

    @classmethod
    def _validated(cls, obj: Any, source: str) -> Policy:
        pf, errors = schema.validate(obj)
        if pf is None:
            raise PolicyError(errors, source)
        return cls(pf, source)

    # ------------------------------------------------------------------------- decision

    def decide(self, tool: str, arguments: str | bytes | dict[str, Any], *,
               conversation: str = "", workspace_root: str | os.PathLike[str] | None = None
               ) -> Verdict:
        """Allow or deny one proposed tool call.

        ``tool``: the function name; ``arguments``: OpenAI ``function.arguments`` (a JSON string)
        or the decoded dict; ``conversation``: the key budgets are counted under;
        ``workspace_root``: the directory path arguments must stay in (falls back to the file's
        ``workspace_root``). Returns a :class:`Verdict`; never raises for any input: arguments
        too large or too deeply nested to decode are denied (rule ``arguments``), and an
        unexpected error inside the decision denies the call (rule ``internal``) and is logged
        to the ``fak.policy`` logger. An allowed call is counted against the conversation's
        budgets."""
        try:
            return self._decide(tool, arguments, conversation, workspace_root)
        except Exception as e:  # noqa: BLE001 - the contract: any input gets a verdict
            _log.exception("policy decision failed for tool %r", tool if isinstance(tool, str)
                           else type(tool).__name__)
            return Verdict(False, f"the call could not be checked ({type(e).__name__})",
                           "internal")

    def _decide(self, tool: str, arguments: str | bytes | dict[str, Any], conversation: str,
                workspace_root: str | os.PathLike[str] | None) -> Verdict:
        if type(tool) is not str:
            return Verdict(False, "the tool name must be a string", "arguments")
        if isinstance(arguments, dict):
            args = arguments
            if _too_deep_value(args):
                _log.warning("denied %r call: arguments nested deeper than %d", tool,
                             MAX_ARGUMENTS_DEPTH)
                return Verdict(False, f"tool-call arguments nested deeper than "
                                      f"{MAX_ARGUMENTS_DEPTH} levels", "arguments")
        else:
            if isinstance(arguments, (str, bytes, bytearray, memoryview)):
                text = arguments if isinstance(arguments, (str, bytes)) else bytes(arguments)
                if len(text) > MAX_ARGUMENTS_CHARS:
                    _log.warning("denied %r call: arguments of %d characters", tool, len(text))
                    return Verdict(False, f"tool-call arguments longer than "
                                          f"{MAX_ARGUMENTS_CHARS} characters", "arguments")
                if _too_deep_text(text):
                    _log.warning("denied %r call: arguments nested deeper than %d", tool,
                                 MAX_ARGUMENTS_DEPTH)
                    return Verdict(False, f"tool-call arguments nested deeper than "
                                          f"{MAX_ARGUMENTS_DEPTH} levels", "arguments")
                arguments = text
            try:
                args = _decode_json(arguments)
            except (msgspec.DecodeError, TypeError, ValueError, RecursionError) as e:
                return Verdict(False, f"tool-call arguments are not valid JSON: {e}",
                               "arguments")
            if type(args) is not dict:
                return _NOT_OBJECT
        ct = self._tools.get(tool)
        if ct is None:
            v = self._c.default
            return self._charge(conversation, tool, None, v) if v.allowed else v
        if not ct.allowed:
            return ct.denied  # type: ignore[return-value]
        if ct.convert:
            args = _converted(args, ct.convert)
        root: str | None = None
        if ct.scopes or ct.deny:
            r = workspace_root if workspace_root is not None else self._c.workspace_root
            if r is not None:
                root = real_root(os.fspath(r))
        for scope in ct.scopes:
            out = _check_scope(scope, args, root)
            if out is not None:
                return out
        best = _NO_RULE
        denied: Verdict | None = None
        analyses: dict[str, Analysis | ShellSyntaxError] | None = {} if ct.allow else None
        for plan in ct.plans:
            value = args.get(plan.argument)
            if value is None or plan.first_index >= best:
                continue
            if type(value) is not str:
                best = plan.first_index
                denied = Verdict(False, f"{plan.first.reason}: argument `{plan.argument}` must "
                                         f"be a string", plan.first.rule_id)
                continue
            if plan.raw and (plan.raw_screen is None or plan.raw_screen.search(value)):
                for idx, rule in plan.raw:
                    if idx >= best:
                        break
                    m = rule.rx.search(value)  # type: ignore[union-attr]
                    if m is not None:
                        best = idx
                        denied = Verdict(False, f"{rule.reason} (`{_short(m.group())}`)",
                                          rule.rule_id)
                        break
            if plan.first_shell_index >= best:
                continue
            try:
                an: Analysis | None = analyze(value, root)
                lines = an.lines  # type: ignore[union-attr]
            except ShellSyntaxError as e:
                if analyses is not None:
                    analyses[plan.argument] = e
                if not ct.unparseable_allows:
                    best = plan.first_shell_index
                    denied = Verdict(False, f"{ct.unparseable_reason}: `{plan.argument}` is "
                                             f"not valid shell ({e})", ct.unparseable_rule)
                    continue
                an = None
                lines = (value,)   # lenient: normalized regexes see the raw text
            if analyses is not None and an is not None:
                analyses[plan.argument] = an
            norm = plan.normalized
            if norm and lines:
                screen = plan.norm_screen
                if screen is not None:
                    for line in lines:
                        if screen.search(line) is not None:
                            break
                    else:
                        norm = ()
                for idx, rule in norm:
                    if idx >= best:
                        break
                    rx = rule.rx
                    for line in lines:
                        if rx.search(line) is not None:  # type: ignore[union-attr]
                            best = idx
                            denied = Verdict(False, f"{rule.reason} (`{_short(line)}`)",
                                              rule.rule_id)
                            break
                    else:
                        continue
                    break
            if an is not None:
                for idx, rule in plan.checks:
                    if idx >= best:
                        break
                    try:
                        found = rule.check(an, root, rule.extra_roots)  # type: ignore[misc]
                    except (OSError, ValueError, RecursionError) as e:
                        found = f"could not be checked: {type(e).__name__}: {e}"
                    if found is not None:
                        best = idx
                        denied = Verdict(False, f"{rule.reason} ({found})", rule.rule_id)
                        break
        if denied is not None:
            return denied
        verdict = ct.allowed_verdict
        if ct.allow:
            verdict = self._allow_list(ct, args, analyses or {})
            if not verdict.allowed:
                return verdict
        return self._charge(conversation, tool, ct, verdict)

    def _allow_list(self, ct: CompiledTool, args: dict[str, Any],
                    analyses: dict[str, Analysis | ShellSyntaxError]) -> Verdict:
        done: set[str] = set()
        for rule in ct.allow:
            arg = rule.argument
            value = args.get(arg)
            if type(value) is not str:
                continue
            if rule.kind == RAW:
                if rule.rx.search(value) is not None:  # type: ignore[union-attr]
                    return Verdict(True, rule.reason, rule.rule_id)
                continue
            if arg in done:
                continue
            done.add(arg)
            an = analyses.get(arg)
            if an is None:
                try:
                    an = analyses[arg] = analyze(value)
                except ShellSyntaxError as e:
                    an = analyses[arg] = e
            if isinstance(an, ShellSyntaxError) or not an.lines:
                continue
            # every command line must be allowed by some normalized allow rule of the argument
            normalized = [r.rx for r in ct.allow if r.kind == NORMALIZED and r.argument == arg]
            if all(any(rx.search(line) for rx in normalized)  # type: ignore[union-attr]
                   for line in an.lines):
                return Verdict(True, rule.reason, rule.rule_id)
        return ct.allow_miss  # type: ignore[return-value]

    def _charge(self, conversation: str, tool: str, ct: CompiledTool | None,
                verdict: Verdict) -> Verdict:
        tb: CompiledBudget | None = ct.budget if ct is not None else None
        total = self._c.total
        if tb is None and total is None:
            return verdict
        with self._lock:
            counts = self._counts.get(conversation)
            if counts is None:
                counts = self._counts[conversation] = {}
            n = counts.get(tool, 0)
            if tb is not None and n >= tb.max_calls:
                return tb.denied
            t = counts.get(_TOTAL, 0)
            if total is not None and t >= total.max_calls:
                return total.denied
            counts[tool] = n + 1
            counts[_TOTAL] = t + 1
        return verdict

    # ------------------------------------------------------------------------- budgets

    def usage(self, conversation: str) -> dict[str, int]:
        """Allowed calls counted so far in ``conversation``: per tool, plus ``"*"`` for all
        tools (only counted when the policy has a budget)."""
        with self._lock:
            counts = dict(self._counts.get(conversation, {}))
        return {("*" if k is None else k): v for k, v in counts.items()}

    def reset_conversation(self, conversation: str) -> None:
        """Forget the budget counts of ``conversation`` (call when it ends)."""
        with self._lock:
            self._counts.pop(conversation, None)

    def __repr__(self) -> str:
        return f"Policy({self.source!r}, tools={sorted(self._tools)})"


def _converted(args: dict[str, Any], convert: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """``args`` with each list argument of ``convert`` joined into one command line (``argv``:
    quoted as the shell would, ``shlex.join``; ``lines``: one line per item). Lists holding
    anything but strings are left for the rules to deny."""
    out = dict(args)
    for name, how in convert:
        value = out.get(name)
        if type(value) is list and all(type(v) is str for v in value):
            out[name] = shlex.join(value) if how == "argv" else "\n".join(value)
    return out


def _check_scope(scope: Any, args: dict[str, Any], root: str | None) -> Verdict | None:
    value = args.get(scope.argument)
    if value is None:
        if scope.optional:
            return None
        return Verdict(False, f"{scope.reason}: argument `{scope.argument}` is missing",
                       scope.rule_id)
    if scope.format == "paths" and type(value) is list:
        for item in value:
            out = _check_scope(scope, {scope.argument: item}, root) if type(item) is str else Verdict(
                False, f"{scope.reason}: argument `{scope.argument}` must list strings", scope.rule_id)
            if out is not None:
                return out
        return None
    if type(value) is not str:
        return Verdict(False, f"{scope.reason}: argument `{scope.argument}` must be a string",
                       scope.rule_id)
    if scope.format == "apply_patch":
        try:
            names = patch_paths(value)
        except PatchError as e:
            return Verdict(False, f"{scope.reason}: the patch could not be read ({e})", scope.rule_id)
        for name in names:
            out = _check_path(scope, name, root)
            if out is not None:
                return out
        return None
    return _check_path(scope, value, root)


def _check_path(scope: Any, value: str, root: str | None) -> Verdict | None:
    if root is None:
        return Verdict(False, f"{scope.reason}: no workspace root is known (pass workspace_root "
                              f"or set it in the policy file)", scope.rule_id)
    real = resolve(value, "", root)
    if real is None:
        return Verdict(False, f"{scope.reason}: `{_short(value)}` cannot be resolved",
                       scope.rule_id)
    if scope.git_metadata is not None:
        below = real[len(root):] if within(real, root, strict=True) else real
        if names_git_metadata(value) or names_git_metadata(below):
            return Verdict(False, f"{scope.git_metadata}: `{_short(value)}` resolves to "
                                  f"{_short(real)}", f"{scope.rule_id}.git_metadata")
    if within(real, root):
        return None
    for extra in scope.extra_roots:
        if within(real, extra):
            return None
    return Verdict(False, f"{scope.reason}: `{_short(value)}` resolves to {_short(real)}, "
                          f"outside the workspace", scope.rule_id)
