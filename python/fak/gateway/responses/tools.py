"""The Responses API's tool types, mapped onto the functions a local model calls.

The model only ever writes function calls (``name`` + JSON ``arguments``); each served tool type
says which function it is offered as, how a call of it is written back as the type's own output
item, and how the history items of that type are read back into calls and results. What maps:

| tool type | offered as | call item | result item |
|---|---|---|---|
| ``function`` | itself | ``function_call`` (``arguments``) | ``function_call_output`` |
| ``custom`` (Codex's freeform ``apply_patch``) | ``NAME({"input": str})`` | ``custom_tool_call`` (``input``) | ``custom_tool_call_output`` |
| ``local_shell`` | ``local_shell({"command": [str], "workdir", "timeout_ms"})`` | ``local_shell_call`` (``action.command``) | ``local_shell_call_output`` |
| ``shell`` | ``shell({"commands": [str], "timeout_ms"})`` | ``shell_call`` (``action.commands``) | ``shell_call_output`` |
| ``apply_patch`` | ``apply_patch({"type", "path", "diff"})`` | ``apply_patch_call`` (``operation``) | ``apply_patch_call_output`` |
| ``namespace`` (Codex 0.147's ``multi_agent_v1``: a named group of client tools) | each inner ``function`` / ``custom`` tool by its own name | its own item, with ``namespace`` set | its own |

Hosted tools run by OpenAI's servers (``web_search``, ``web_search_preview``, ``file_search``,
``code_interpreter``, ``image_generation``, ``computer_use_preview``, ``computer``, ``mcp``,
``tool_search``, ...) have nothing here to run them: a request that offers one is
refused with a 400 naming the type (``unsupported_tool_type``), never silently dropped. Codex
turns its web search off with ``web_search = "disabled"`` in ``config.toml`` (docs/clients.md).
The policy sees the function call (``shell`` with ``commands``, ``apply_patch`` with ``input``
or ``path``), whatever the item type.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fak.gateway.errors import bad_request

__all__ = ["HOSTED_TOOL_TYPES", "ServedTool", "ToolKinds", "call_item", "output_text"]

#: Tool types run by OpenAI's own servers: refused (see the module doc).
HOSTED_TOOL_TYPES = frozenset({
    "web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11", "file_search",
    "code_interpreter", "image_generation", "computer_use_preview", "computer", "mcp", "tool_search",
    "programmatic_tool_calling"})

_LOCAL_SHELL_SCHEMA = {"type": "object", "properties": {
    "command": {"type": "array", "items": {"type": "string"}, "description": "argv of the command"},
    "workdir": {"type": "string"}, "timeout_ms": {"type": "integer"}}, "required": ["command"]}
_SHELL_SCHEMA = {"type": "object", "properties": {
    "commands": {"type": "array", "items": {"type": "string"}, "description": "shell command lines, run in order"},
    "timeout_ms": {"type": "integer"}}, "required": ["commands"]}
_APPLY_PATCH_SCHEMA = {"type": "object", "properties": {
    "type": {"type": "string", "enum": ["create_file", "update_file", "delete_file"]},
    "path": {"type": "string"}, "diff": {"type": "string"}}, "required": ["type", "path"]}
_DESCRIPTIONS = {
    "local_shell": "Run a command (argv list) in the user's workspace.",
    "shell": "Run shell command lines in the user's workspace.",
    "apply_patch": "Create, update or delete one file of the workspace with a diff.",
}


@dataclass(frozen=True, slots=True)
class ServedTool:
    """One offered tool: its Responses ``type``, the function name the model calls, and the
    function definition (OpenAI chat form, only the fields the client set)."""

    type: str
    name: str
    function: dict[str, Any]
    #: the ``namespace`` tool that holds it (its calls carry the namespace's name), else ``None``
    namespace: str | None = None


def _custom_function(tool: dict[str, Any]) -> dict[str, Any]:
    description = str(tool.get("description") or "")
    fmt = tool.get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "grammar" and fmt.get("definition"):
        description += f"\nThe input follows this {fmt.get('syntax', '')} grammar:\n{fmt['definition']}"
    fn: dict[str, Any] = {"name": tool["name"]}
    if description:
        fn["description"] = description.strip()
    fn["parameters"] = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}
    return fn


class ToolKinds:
    """The offered tools of one request, by the function name the model calls.

    Raises (``from_request``): ``APIError`` 400 naming ``tools[i].type`` for a hosted or unknown
    type, ``tools[i].name`` for a function without a name.
    """

    def __init__(self, tools: list[ServedTool]) -> None:
        self.tools = tools
        self.by_name = {t.name: t for t in tools}

    @classmethod
    def from_request(cls, tools: list[dict[str, Any]] | None) -> ToolKinds:
        """Read ``tools`` of a Responses request (a ``namespace`` tool's inner tools are offered
        by their own names)."""
        served: list[ServedTool] = []
        flat: list[tuple[str, dict[str, Any], str | None]] = []
        for i, tool in enumerate(tools or []):
            if isinstance(tool, dict) and tool.get("type") == "namespace" and isinstance(tool.get("tools"), list):
                group = str(tool.get("name") or "")
                for j, inner in enumerate(tool["tools"]):
                    if not isinstance(inner, dict) or str(inner.get("type") or "function") not in ("function", "custom"):
                        raise bad_request("A namespace tool holds function and custom tools only.",
                                          param=f"tools[{i}].tools[{j}].type", code="unsupported_tool_type")
                    flat.append((f"tools[{i}].tools[{j}]", inner, group or None))
            else:
                flat.append((f"tools[{i}]", tool, None))
        for where, tool, space in flat:
            kind = str(tool.get("type") or "function")
            if kind in ("function", "custom"):
                name = tool.get("name")
                if not isinstance(name, str) or not name:
                    raise bad_request(f"A {kind} tool needs a name.", param=f"{where}.name")
                if kind == "function":
                    fn: dict[str, Any] = {"name": name}
                    for key in ("description", "parameters", "strict"):
                        if tool.get(key) is not None:
                            fn[key] = tool[key]
                else:
                    fn = _custom_function(tool)
                served.append(ServedTool(kind, name, fn, space))
            elif kind in ("local_shell", "shell", "apply_patch"):
                schema = {"local_shell": _LOCAL_SHELL_SCHEMA, "shell": _SHELL_SCHEMA,
                          "apply_patch": _APPLY_PATCH_SCHEMA}[kind]
                served.append(ServedTool(kind, kind, {"name": kind, "description": _DESCRIPTIONS[kind],
                                                      "parameters": schema}))
            else:
                what = "runs on OpenAI's servers" if kind in HOSTED_TOOL_TYPES else "is not known to this server"
                raise bad_request(f"Tool type {kind!r} {what}; fak serves tools of type function, custom, "
                                  "local_shell, shell and apply_patch (docs/gateway.md). Turn it off in the client "
                                  "(Codex: web_search = \"disabled\").", param=f"{where}.type",
                                  code="unsupported_tool_type")
        names = [t.name for t in served]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise bad_request(f"Two tools are offered under the name {name!r} (a {served[names.index(name)].type} "
                                  f"tool and a {served[i].type} tool); the model calls tools by name.",
                                  param=flat[i][0])
        return cls(served)

    def namespace_of(self, name: str) -> str | None:
        """The ``namespace`` tool that holds the function ``name`` (``None``: none)."""
        tool = self.by_name.get(name)
        return tool.namespace if tool is not None else None

    def client_tools(self) -> list[dict[str, Any]]:
        """The tools in OpenAI's chat form, for the template and the argument schemas."""
        return [{"type": "function", "function": t.function} for t in self.tools]

    def kind_of(self, name: str) -> str:
        """The Responses tool type of the function ``name`` (``function`` when not offered)."""
        tool = self.by_name.get(name)
        return tool.type if tool is not None else "function"


def _args(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def call_item(kind: str, *, item_id: str, call_id: str, name: str, arguments: str,
              status: str = "completed") -> dict[str, Any]:
    """The output item of one call of a tool of type ``kind`` (see the module doc's table)."""
    if kind == "custom":
        return {"type": "custom_tool_call", "id": item_id, "call_id": call_id, "name": name,
                "input": str(_args(arguments).get("input", "")), "status": status}
    if kind == "local_shell":
        a = _args(arguments)
        action: dict[str, Any] = {"type": "exec", "command": a.get("command") or [], "env": {},
                  "working_directory": a.get("workdir"), "timeout_ms": a.get("timeout_ms"), "user": None}
        return {"type": "local_shell_call", "id": item_id, "call_id": call_id, "action": action, "status": status}
    if kind == "shell":
        a = _args(arguments)
        action = {"commands": a.get("commands") or [], "timeout_ms": a.get("timeout_ms"), "max_output_length": None}
        return {"type": "shell_call", "id": item_id, "call_id": call_id, "action": action, "status": status}
    if kind == "apply_patch":
        a = _args(arguments)
        operation = {"type": a.get("type", "update_file"), "path": a.get("path", "")}
        if operation["type"] != "delete_file":
            operation["diff"] = a.get("diff", "")
        return {"type": "apply_patch_call", "id": item_id, "call_id": call_id, "operation": operation,
                "status": status}
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


#: history item type → (function name or None for the item's own ``name``, the arguments it held)
CALL_ITEMS = ("function_call", "custom_tool_call", "local_shell_call", "shell_call", "apply_patch_call")
OUTPUT_ITEMS = ("function_call_output", "custom_tool_call_output", "local_shell_call_output", "shell_call_output",
                "apply_patch_call_output")


def read_call(item: dict[str, Any]) -> tuple[str, str, str]:
    """``(call_id, function name, arguments JSON)`` of a history call item (``CALL_ITEMS``)."""
    kind = item.get("type")
    call_id = str(item.get("call_id") or item.get("id") or "")
    if kind == "custom_tool_call":
        return call_id, str(item.get("name") or ""), json.dumps({"input": item.get("input") or ""}, ensure_ascii=False)
    if kind == "local_shell_call":
        action = item.get("action") or {}
        args = {"command": action.get("command") or []}
        if action.get("working_directory"):
            args["workdir"] = action["working_directory"]
        if action.get("timeout_ms") is not None:
            args["timeout_ms"] = action["timeout_ms"]
        return call_id, "local_shell", json.dumps(args, ensure_ascii=False)
    if kind == "shell_call":
        action = item.get("action") or {}
        return call_id, "shell", json.dumps({"commands": action.get("commands") or []}, ensure_ascii=False)
    if kind == "apply_patch_call":
        return call_id, "apply_patch", json.dumps(item.get("operation") or {}, ensure_ascii=False)
    arguments = item.get("arguments")
    return call_id, str(item.get("name") or ""), arguments if isinstance(arguments, str) else json.dumps(
        arguments or {}, ensure_ascii=False)


def output_text(item: dict[str, Any]) -> str:
    """The text of a history result item (``OUTPUT_ITEMS``): a string, text parts, or a shell
    call's ``stdout``/``stderr`` entries."""
    output = item.get("output")
    if isinstance(output, str):
        return output
    parts: list[str] = []
    for part in output if isinstance(output, list) else []:
        if not isinstance(part, dict):
            continue
        if isinstance(part.get("text"), str):
            parts.append(part["text"])
        elif "stdout" in part or "stderr" in part:
            parts += [str(part[k]) for k in ("stdout", "stderr") if part.get(k)]
        elif part.get("type") in ("input_image", "input_file"):
            parts.append(f"[{part['type']} omitted: this model reads text only]")
    return "\n".join(parts)
