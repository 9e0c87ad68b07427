"""How the agent and the model talk: the OpenAI tool-call protocol or a plain text protocol.

``get_protocol("tools" | "text")`` returns the protocol object; see ``base.AgentProtocol``.
"""

from __future__ import annotations

from fak.agent.protocols.base import Action, AgentProtocol, canonical_digest
from fak.agent.protocols.text import TextProtocol
from fak.agent.protocols.tools import ToolCallProtocol

PROTOCOLS = {"tools": ToolCallProtocol, "text": TextProtocol}

#: The protocol used when ``--protocol`` is not given. Chosen before measuring: the tool-call
#: protocol, because the gateway adjudicates structured calls directly (argument-level policy)
#: and it needs no ``--allow-exec``. The lead measures both on the smoke slice and sets this.
DEFAULT_PROTOCOL = "tools"


def get_protocol(name: str, *, allow_exec: bool, tool_choice: str | None = None) -> AgentProtocol:
    """The protocol called ``name``. ``tool_choice`` (``"required"`` | ``"auto"``; ``None``: the
    protocol's default) applies to ``tools`` only. Raises ``ValueError`` for an unknown name or
    tool choice, or for ``text`` without ``allow_exec`` (its only action is a shell command)."""
    try:
        cls = PROTOCOLS[name]
    except KeyError:
        raise ValueError(f"unknown protocol {name!r}; choose one of {', '.join(PROTOCOLS)}") from None
    if cls is ToolCallProtocol and tool_choice is not None:
        return ToolCallProtocol(allow_exec=allow_exec, tool_choice=tool_choice)
    return cls(allow_exec=allow_exec)


__all__ = ["Action", "AgentProtocol", "canonical_digest", "get_protocol", "PROTOCOLS",
           "DEFAULT_PROTOCOL", "TextProtocol", "ToolCallProtocol"]
