"""The protocol interface: what the model is told, and how its replies become tool calls."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from fak.agent.prompts import render


@dataclass
class Action:
    """One tool call the model asked for: ``id`` (the tool_call id, or a made-up one in the text
    protocol), ``name`` (a tool name), ``arguments`` (dict), ``source`` (its text in the content,
    or ``""``), how the gateway's verdict refers to it (``call_ref``: the tool_call id of a
    structured call; ``span``: a shell block's place in the content, matched against the span of
    a ``block:N`` verdict; see ``fak.toolcalls``), and how the policy saw it (``policy_tool``)."""

    id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    #: the text of the call inside the reply's content, when it was written there (a
    #: ``<tool_call>`` block or a ```bash block) rather than sent as a structured tool call
    source: str = ""
    #: the call as the gateway's policy saw it, when that differs (the text protocol's ``submit``
    #: block is adjudicated as ``bash {"command": "submit"}``)
    policy_name: str = ""
    policy_arguments: dict[str, Any] | None = None
    #: the gateway's ``call_ref`` of a structured call (its tool_call id); None for text calls
    call_ref: str | None = None
    #: ``(start, end)`` of a shell block in the content (the text protocol)
    span: tuple[int, int] | None = None

    @property
    def policy_tool(self) -> str:
        """The tool name the gateway's verdict carries for this call."""
        return self.policy_name or self.name


class AgentProtocol(ABC):
    """A way of talking to the model. Subclasses give the system prompt, the ``tools`` request
    field and extra headers, parse an assistant message into ``Action``s (raising
    ``FormatError``), and write observations back as messages."""

    name: str = ""

    def __init__(self, *, allow_exec: bool):
        self.allow_exec = allow_exec
        #: template variables about the task (``fak.agent.context.prompt_variables``: real
        #: example paths and names, seed locations), set by the agent before the first prompt
        #: and used by every template this protocol renders
        self.context: dict[str, Any] = {}

    def variables(self, **extra: Any) -> dict[str, Any]:
        """What a template of this protocol sees: the defaults (``PROMPT_DEFAULTS``), the task
        context, the protocol's own settings, then ``extra``."""
        from fak.agent.context import PROMPT_DEFAULTS

        return {**PROMPT_DEFAULTS, **self.context, "protocol": self.name,
                "allow_exec": self.allow_exec, "tool_choice": getattr(self, "tool_choice", None),
                **extra}

    @property
    def tool_names(self) -> list[str]:
        from fak.agent.tools import TOOL_NAMES
        return [n for n in TOOL_NAMES if n != "bash" or self.allow_exec]

    def system_prompt(self, **variables: Any) -> str:
        return render(f"system_{self.name}.j2", **self.variables(**variables))

    def instance_prompt(self, **variables: Any) -> str:
        return render("instance.j2", **self.variables(**variables))

    def tools(self) -> list[dict] | None:
        """The ``tools`` field of the request, or ``None``."""
        return None

    def headers(self) -> dict[str, str]:
        """Extra HTTP headers for the gateway."""
        return {}

    def request_options(self) -> dict[str, Any]:
        """Extra fields of the request body (``tool_choice``, ``stop``, ...)."""
        return {}

    @staticmethod
    def history_message(message: dict[str, Any]) -> dict[str, Any]:
        """The assistant message as kept in the history (only the standard fields)."""
        out: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
        if message.get("tool_calls"):
            out["tool_calls"] = message["tool_calls"]
        return out

    @abstractmethod
    def parse(self, message: dict[str, Any]) -> list[Action]:
        """Actions in an assistant message. Raises ``FormatError`` when there are none usable."""

    def trim_history(self, message: dict[str, Any], keep: list[Action]) -> dict[str, Any]:
        """The history form of ``message`` (already passed through ``history_message``) when only
        the actions ``keep`` of it are carried out: the other calls are left out, so the model
        does not learn from its own history to put several calls in one reply."""
        return message

    def shorten_failed(self, message: dict[str, Any], limit: int) -> dict[str, Any]:
        """The history form of a reply that gave no usable action: its text cut to ``limit``
        characters (head and tail), so a runaway reply does not fill the context and is not
        imitated turn after turn."""
        from fak.agent.tools import truncate_middle

        out = dict(message)
        out["content"] = truncate_middle(out.get("content") or "", limit)
        return out

    @abstractmethod
    def observation(self, action: Action, output: str, returncode: int | None,
                    steps_left: int | None) -> dict[str, Any]:
        """The message that carries the result of ``action`` back to the model."""

    @abstractmethod
    def format_error(self, error: str) -> dict[str, Any]:
        """The message telling the model its reply could not be used."""

    def denied(self, verdicts: list[dict[str, Any]]) -> dict[str, Any]:
        """The message telling the model which calls the policy denied (never run)."""
        return {"role": "user", "content": render("denied.j2", denials=verdicts)}
