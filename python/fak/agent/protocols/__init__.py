"""How the agent and the model talk: the OpenAI tool-call protocol or a plain text protocol.

``get_protocol("tools" | "text")`` returns the protocol object; see ``base.AgentProtocol``.
"""

from __future__ import annotations

from fak.agent.protocols.base import Action, AgentProtocol
from fak.agent.protocols.text import TextProtocol
from fak.agent.protocols.tools import ToolCallProtocol

PROTOCOLS = {"tools": ToolCallProtocol, "text": TextProtocol}

#: The protocol used when ``--protocol`` is not given: the tool-call protocol (the gateway
#: adjudicates structured calls directly, argument-level policy; no ``--allow-exec`` needed).
#: Measured against ``text`` with Qwen2.5-Coder-1.5B on the CPU (benches/results/
#: swebench-cpu-1.5b.md): both resolved 0 of the same 14 instances, a tie, so ``tools`` stayed.
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


__all__ = ["Action", "AgentProtocol", "get_protocol", "PROTOCOLS",
           "DEFAULT_PROTOCOL", "TextProtocol", "ToolCallProtocol"]
