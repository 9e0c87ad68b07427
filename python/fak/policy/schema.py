"""The policy file format (version 1): msgspec Structs, and a validator that reports every
problem with its location.

The format is documented field by field in ``docs/policy.md``. :func:`validate` walks a decoded
JSON document against the Structs below, field by field, so that it can report *every* problem
(msgspec stops at the first), each prefixed by its JSON path (``tools.bash.deny[2].regex``);
leaf values are checked by :func:`msgspec.convert` against the field's annotated type, unknown
fields are rejected, and rule-level semantics (regexes compile, named checks exist, exactly one of
``regex``/``check``) are checked in the same walk. When nothing is wrong it returns the document
converted to a :class:`PolicyFile` by msgspec.
"""

from __future__ import annotations

import json
import os
import re
import types
import typing
from typing import Annotated, Any, Literal, Union

import msgspec

from fak.policy.checks import CHECKS
from fak.policy import quarantine as _quarantine
from fak.policy.quarantine import QuarantineSection

VERSION = 1

VerdictName = Literal["allow", "deny"]
Reason = Annotated[str, msgspec.Meta(min_length=1, description="why; shown to the client")]
Name = Annotated[str, msgspec.Meta(min_length=1)]
Count = Annotated[int, msgspec.Meta(ge=0)]


class _Base(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    pass


class DefaultRule(_Base, frozen=True):
    """The verdict for a tool the file does not list."""

    verdict: VerdictName
    reason: Reason


class Budget(_Base, frozen=True):
    """At most ``max_calls`` allowed calls per conversation."""

    max_calls: Count
    reason: Reason


class Budgets(_Base, frozen=True):
    """Budgets over all tools together."""

    total: Budget | None = None


class PathScope(_Base, frozen=True):
    """The argument ``argument`` names a path that must resolve inside the workspace root (or
    one of ``extra_roots``); ``optional``: a missing argument is fine (the tool has a default);
    ``git_metadata``: when given, the reason a path that is git metadata is denied with (``.git``
    and everything under it, a nested ``.git``, a symlink into one: tools that write).
    ``format``: ``"path"`` (the argument is one path), ``"paths"`` (a list of paths: Qwen Code's
    ``read_many_files``) or ``"apply_patch"`` (the argument is a patch in Codex's ``apply_patch``
    format; every file it adds, updates, deletes or moves to must pass; ``fak.policy.patches``)."""

    argument: Name
    reason: Reason
    optional: bool = False
    extra_roots: list[str] = []
    git_metadata: Reason | None = None
    format: Literal["path", "paths", "apply_patch"] = "path"


class Rule(_Base, frozen=True):
    """One argument rule: ``regex`` (searched in the raw value or in each normalized shell
    command line, per ``match``) or ``check`` (a named semantic check); ``extra_roots`` only for
    checks that resolve paths."""

    argument: Name
    reason: Reason
    regex: str | None = None
    match: Literal["raw", "normalized"] = "raw"
    check: str | None = None
    extra_roots: list[str] = []


class AllowList(_Base, frozen=True):
    """When present, every call must match one of ``rules`` (else denied with ``reason``)."""

    reason: Reason
    rules: Annotated[list[Rule], msgspec.Meta(min_length=1)]


class OnUnparseable(_Base, frozen=True):
    """What to do when an argument that shell rules inspect is not valid shell."""

    verdict: VerdictName
    reason: Reason


class ToolPolicy(_Base, frozen=True):
    """Everything about one tool. ``convert`` turns list arguments into the one command line the
    shell rules read, before any rule runs: ``{"command": "argv"}`` joins an argv list as the
    shell would quote it (Codex's ``shell``: ``["bash", "-lc", "ls"]`` → ``bash -lc ls``, which
    the analysis follows into ``bash -c``), ``"lines"`` joins command lines with newlines
    (``shell``'s ``commands``). A value that is already a string is left as it is."""

    allowed: bool = True
    convert: dict[Name, Literal["argv", "lines"]] = {}
    reason: str | None = None
    description: str = ""
    paths: list[PathScope] = []
    deny: list[Rule] = []
    allow: AllowList | None = None
    budget: Budget | None = None
    on_unparseable: OnUnparseable | None = None


class PolicyFile(_Base, frozen=True):
    """A whole policy file."""

    version: Literal[1]
    default: DefaultRule
    description: str = ""
    workspace_root: str | None = None
    tools: dict[Name, ToolPolicy] = {}
    budgets: Budgets = Budgets()
    quarantine: QuarantineSection | None = None  # tool-result screening, fak.policy.quarantine


# ---------------------------------------------------------------------------------------------
# validation with locations


class _Dups(dict):
    """A JSON object that remembers keys given more than once."""

    dups: list[str]


def _pairs(pairs: list[tuple[str, Any]]) -> dict:
    d = _Dups()
    d.dups = []
    for k, v in pairs:
        if k in d:
            d.dups.append(k)
        d[k] = v
    return d


def decode_json(text: str | bytes) -> tuple[Any, list[str]]:
    """Decode a policy document; returns ``(obj, errors)`` with a JSON syntax error located by
    line and column."""
    try:
        return json.loads(text, object_pairs_hook=_pairs), []
    except json.JSONDecodeError as e:
        return None, [f"(document): invalid JSON at line {e.lineno} column {e.colno}: {e.msg}"]
    except UnicodeDecodeError as e:
        return None, [f"(document): not UTF-8: {e}"]


def _loc(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_\-]*", key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key)}]"


def _leaf_message(exc: msgspec.ValidationError) -> str:
    return re.sub(r" - at `\$[^`]*`$", "", str(exc))


def _walk(value: Any, tp: Any, path: str, errors: list[str]) -> None:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            _walk(value, inner[0], path, errors)
            return
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        _walk_struct(value, tp, path, errors)
        return
    if origin is Annotated:
        base, *meta = typing.get_args(tp)
        if typing.get_origin(base) is list:
            if not isinstance(value, list):
                errors.append(f"{path}: expected an array, got {_kind(value)}")
                return
            shape: Any = list[Any]
            for m in meta:
                shape = Annotated[shape, m]
            try:
                msgspec.convert(value, shape)
            except msgspec.ValidationError as e:
                errors.append(f"{path}: {_leaf_message(e)}")
            _walk(value, base, path, errors)
            return
    if origin is list:
        if not isinstance(value, list):
            errors.append(f"{path}: expected an array, got {_kind(value)}")
            return
        (item,) = typing.get_args(tp)
        for i, v in enumerate(value):
            _walk(v, item, _loc(path, i), errors)
        return
    if origin is dict:
        if not isinstance(value, dict):
            errors.append(f"{path}: expected an object, got {_kind(value)}")
            return
        ktp, vtp = typing.get_args(tp)
        for dup in getattr(value, "dups", ()):
            errors.append(f"{_loc(path, dup)}: given more than once")
        for k, v in value.items():
            try:
                msgspec.convert(k, ktp)
            except msgspec.ValidationError as e:
                errors.append(f"{_loc(path, k)}: bad name: {_leaf_message(e)}")
            _walk(v, vtp, _loc(path, k), errors)
        return
    try:
        msgspec.convert(value, tp)
    except msgspec.ValidationError as e:
        errors.append(f"{path}: {_leaf_message(e)}")


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            int: "a number", float: "a number", type(None): "null"}.get(type(value), "a value")


def _walk_struct(value: Any, cls: type[msgspec.Struct], path: str, errors: list[str]) -> None:
    where = path or "(document)"
    if not isinstance(value, dict):
        errors.append(f"{where}: expected an object, got {_kind(value)}")
        return
    fields = {f.encode_name: f for f in msgspec.structs.fields(cls)}
    for dup in getattr(value, "dups", ()):
        errors.append(f"{_loc(path, dup)}: given more than once")
    for k in value:
        if k not in fields:
            errors.append(f"{_loc(path, k)}: unknown field (expected one of: "
                          f"{', '.join(fields)})")
    n_before = len(errors)
    for name, f in fields.items():
        if name not in value:
            if f.required:
                errors.append(f"{_loc(path, name)}: missing required field")
            continue
        _walk(value[name], f.type, _loc(path, name), errors)
    if len(errors) == n_before:
        check = _SEMANTICS.get(cls)
        if check is not None:
            check(value, path, errors)


def _check_rule(value: dict, path: str, errors: list[str]) -> None:
    regex, check = value.get("regex"), value.get("check")
    if (regex is None) == (check is None):
        errors.append(f"{path}: give exactly one of `regex` or `check`")
        return
    if regex is not None:
        try:
            re.compile(regex)
        except re.error as e:
            errors.append(f"{_loc(path, 'regex')}: invalid regular expression: {e}")
        if value.get("extra_roots"):
            errors.append(f"{_loc(path, 'extra_roots')}: only checks that resolve paths take "
                          f"extra roots")
        return
    if "match" in value:
        errors.append(f"{_loc(path, 'match')}: only regex rules have `match` (checks always "
                      f"read the normalized shell commands)")
    known = CHECKS.get(str(check))
    if known is None:
        errors.append(f"{_loc(path, 'check')}: unknown check {check!r} (known: "
                      f"{', '.join(sorted(CHECKS))})")
        return
    roots = value.get("extra_roots") or []
    if roots and not known.uses_paths:
        errors.append(f"{_loc(path, 'extra_roots')}: check {check!r} does not resolve paths")
    _check_roots(roots, _loc(path, "extra_roots"), errors)


def _check_roots(roots: list[str], path: str, errors: list[str]) -> None:
    for i, r in enumerate(roots):
        if not os.path.isabs(os.path.expanduser(r)):
            errors.append(f"{_loc(path, i)}: must be an absolute path (or start with ~)")


def _check_scope(value: dict, path: str, errors: list[str]) -> None:
    _check_roots(value.get("extra_roots") or [], _loc(path, "extra_roots"), errors)


def _check_allow(value: dict, path: str, errors: list[str]) -> None:
    for i, rule in enumerate(value.get("rules", [])):
        if rule.get("check") is not None:
            errors.append(f"{_loc(_loc(_loc(path, 'rules'), i), 'check')}: allow rules are "
                          f"regexes; named checks only deny")


def _check_tool(value: dict, path: str, errors: list[str]) -> None:
    if value.get("allowed", True) is False and not value.get("reason"):
        errors.append(f"{_loc(path, 'reason')}: a tool that is not allowed needs a reason")


def _check_top(value: dict, path: str, errors: list[str]) -> None:
    root = value.get("workspace_root")
    if root is not None and not os.path.isabs(os.path.expanduser(root)):
        errors.append("workspace_root: must be an absolute path (or start with ~)")


_SEMANTICS = {Rule: _check_rule, PathScope: _check_scope, AllowList: _check_allow,
              ToolPolicy: _check_tool, PolicyFile: _check_top}
_SEMANTICS.update(_quarantine.SEMANTICS)


def validate(obj: Any) -> tuple[PolicyFile | None, list[str]]:
    """Check a decoded policy document. Returns ``(policy, [])`` or ``(None, errors)`` where
    each error is ``"<location>: <problem>"`` and every problem found is listed."""
    errors: list[str] = []
    if isinstance(obj, dict) and "version" in obj and obj["version"] != VERSION:
        return None, [f"version: unsupported policy version {obj['version']!r} (this fak reads "
                      f"version {VERSION})"]
    _walk_struct(obj, PolicyFile, "", errors)
    if errors:
        return None, errors
    try:
        return msgspec.convert(obj, PolicyFile), []
    except msgspec.ValidationError as e:  # pragma: no cover - the walk checks the same types
        return None, [f"(document): {e}"]
