"""The offered tools, and whether a proposed call fits them: a known name, arguments that validate
against that tool's JSON Schema.

``ToolSet.from_openai(tools)`` takes OpenAI ``tools`` (``[{"type": "function", "function": {"name",
"description", "parameters"}}]``) and compiles each ``parameters`` schema once with jsonschema-rs
(JSON Schema drafts 4 to 2020-12, the draft picked from ``$schema``, 2020-12 by default, as
OpenAI's function calling documents). ``check(name, arguments_json)`` returns ``None`` for a call
that fits, else the reason in words (``unknown_tool``, ``invalid_json`` or ``schema`` as
``CallProblem.kind``; the XML form's parser adds ``malformed``) so the caller can resample or
hand the text back as content.

Schemas come from clients, so compiling one never reaches the network or the disk: a ``$ref``
to anything outside the schema itself is an error (``SchemaError``), and ``pattern`` uses the
linear-time regex engine (no backtracking blow-up on hostile patterns).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CallProblem", "SchemaError", "ToolSet"]

#: The shortest example of a failing instance path, in messages (``city``, ``items/0``).
_MAX_ERRORS = 3
#: Local ``$ref`` links followed to find a parameter's schema (``ToolSet.parameter_schema``).
_MAX_REF_HOPS = 8


class SchemaError(ValueError):
    """A tool's ``parameters`` is not a usable JSON Schema. ``index`` is the tool's position."""

    def __init__(self, index: int, name: str, message: str) -> None:
        super().__init__(f"tools[{index}] ({name}): parameters is not a valid JSON Schema: {message}")
        self.index = index
        self.name = name


@dataclass(frozen=True, slots=True)
class CallProblem:
    """Why a proposed call does not fit the offered tools.

    ``kind``: ``"unknown_tool"`` (a name that was not offered), ``"invalid_json"`` (arguments
    that are not a JSON object), ``"schema"`` (arguments that fail the tool's schema) or
    ``"malformed"`` (a Qwen3-Coder XML call whose markup is broken: cut off, no function name);
    ``message``: what was wrong, in words a model (or a person) can act on.
    """

    kind: str
    message: str


def _no_retrieval(uri: str) -> Any:
    raise ValueError(f"external $ref {uri!r} is not fetched (only references inside the schema resolve)")


def _compile(schema: Mapping[str, Any]) -> Any:
    import jsonschema_rs

    kwargs: dict[str, Any] = {"retriever": _no_retrieval}
    regex = getattr(jsonschema_rs, "RegexOptions", None)
    if regex is not None:
        kwargs["pattern_options"] = regex()
    return jsonschema_rs.validator_for(dict(schema), **kwargs)


def _allows_null(schema: Mapping[str, Any] | None) -> bool:
    """Whether a parameter's schema admits ``null`` (``type`` null or a list with it, an ``enum``
    or ``const`` of it, or an ``anyOf``/``oneOf`` branch that does); unknown shapes count as yes."""
    if not isinstance(schema, Mapping):
        return True
    t = schema.get("type")
    if t == "null" or (isinstance(t, list) and "null" in t):
        return True
    if "enum" in schema and None in (schema.get("enum") or ()):
        return True
    if "const" in schema and schema.get("const") is None:
        return True
    for key in ("anyOf", "oneOf"):
        if any(_allows_null(b) for b in schema.get(key) or () if isinstance(b, Mapping)):
            return True
    return t is None and not any(k in schema for k in ("enum", "const", "anyOf", "oneOf", "properties", "items"))


@dataclass
class ToolSet:
    """The offered tools by name, each with its compiled argument validator (``None``: any object).

    Build with ``from_openai``; ``names`` is the set of offered names (in offer order in
    ``ordered``); ``schemas`` holds each tool's ``parameters`` JSON Schema as the client sent it
    (tools without one are absent), which the Qwen3-Coder XML form needs to type its values
    (``parameter_schema``).
    """

    validators: dict[str, Any] = field(default_factory=dict)
    ordered: tuple[str, ...] = ()
    schemas: dict[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def names(self) -> frozenset[str]:
        """The offered tool names."""
        return frozenset(self.validators)

    @classmethod
    def from_openai(cls, tools: Sequence[Mapping[str, Any]] | None) -> ToolSet:
        """Compile OpenAI ``tools`` (dicts or msgspec-decoded ``Tool`` structs as dicts).

        Raises:
            SchemaError: a ``parameters`` value that is not a valid JSON Schema (or refers outside
                itself).
        """
        validators: dict[str, Any] = {}
        ordered: list[str] = []
        schemas: dict[str, Mapping[str, Any]] = {}
        for i, tool in enumerate(tools or ()):
            fn = tool.get("function") or {}
            name = str(fn.get("name") or "")
            params = fn.get("parameters")
            validator = None
            if isinstance(params, Mapping) and params:
                try:
                    validator = _compile(params)
                except Exception as exc:  # noqa: BLE001 - jsonschema_rs raises ValidationError, ValueError, ReferencingError
                    raise SchemaError(i, name, str(exc).split("\n", 1)[0]) from None
            if name not in validators:
                ordered.append(name)
            validators[name] = validator
            if isinstance(params, Mapping) and params:
                schemas[name] = params
            else:
                schemas.pop(name, None)
        return cls(validators, tuple(ordered), schemas)

    def parameter_schema(self, tool: str, parameter: str) -> Mapping[str, Any] | None:
        """The JSON Schema of one parameter of an offered tool (``parameters.properties[parameter]``),
        a local ``$ref`` (``#/$defs/...``, ``#/definitions/...``) followed; ``None`` when the tool,
        its schema or that property is not known."""
        root = self.schemas.get(tool) or {}
        props = root.get("properties")
        schema = props.get(parameter) if isinstance(props, Mapping) else None
        for _ in range(_MAX_REF_HOPS):
            ref = schema.get("$ref") if isinstance(schema, Mapping) else None
            if not isinstance(ref, str) or not ref.startswith("#/"):
                break
            target: Any = root
            for part in ref[2:].split("/"):
                part = part.replace("~1", "/").replace("~0", "~")
                target = target.get(part) if isinstance(target, Mapping) else None
            schema = target
        return schema if isinstance(schema, Mapping) else None

    def fit(self, name: str, arguments: str) -> str:
        """``arguments`` (JSON text) without the top-level ``null`` values of optional parameters
        whose schema does not allow ``null``: a model's way of saying "omitted" (Qwen2.5-Coder-1.5B
        answered Codex's ``exec_command`` with ``"sandbox_permissions": null`` for an optional
        enum). Anything else (unknown tool, not an object, a required or nullable parameter) comes
        back unchanged, for ``check`` to judge."""
        schema = self.schemas.get(name)
        props = schema.get("properties") if isinstance(schema, Mapping) else None
        if not isinstance(props, Mapping) or "null" not in arguments:
            return arguments
        try:
            value = json.loads(arguments)
        except (ValueError, RecursionError):
            return arguments
        if not isinstance(value, dict):
            return arguments
        required = set(schema.get("required") or ())
        drop = [k for k, v in value.items()
                if v is None and k in props and k not in required and not _allows_null(self.parameter_schema(name, k))]
        if not drop:
            return arguments
        return json.dumps({k: v for k, v in value.items() if k not in drop}, ensure_ascii=False)

    def check(self, name: str, arguments: str | Mapping[str, Any]) -> CallProblem | None:
        """``None`` when ``name`` was offered and ``arguments`` (a JSON object, or its text) fits
        its schema; else the ``CallProblem``."""
        if name not in self.validators:
            offered = ", ".join(self.ordered) or "none"
            return CallProblem("unknown_tool", f"`{name}` is not one of the offered tools ({offered})")
        if isinstance(arguments, str):
            try:
                value = json.loads(arguments)
            except (ValueError, RecursionError) as exc:
                return CallProblem("invalid_json", f"the arguments of `{name}` are not valid JSON ({exc})")
        else:
            value = dict(arguments)
        if not isinstance(value, dict):
            return CallProblem("invalid_json", f"the arguments of `{name}` must be a JSON object")
        validator = self.validators[name]
        if validator is None:
            return None
        errors = []
        for err in validator.iter_errors(value):
            where = "/".join(str(p) for p in err.instance_path)
            errors.append(f"{err.message}" + (f" (at `{where}`)" if where else ""))
            if len(errors) >= _MAX_ERRORS:
                break
        if not errors:
            return None
        return CallProblem("schema", f"the arguments of `{name}` do not match its schema: " + "; ".join(errors))
