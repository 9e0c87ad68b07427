"""fak's coding agent: a small loop (``agent.py``), tools over a workspace (``tools.py``,
``workspace.py``), two ways of talking to the model (``protocols/``), prompts as Jinja templates
(``prompts/``), and an OpenAI-compatible model client (``model.py``).
"""

from fak.agent.agent import Agent, AgentConfig, AgentStats, Environment, Model
from fak.agent.exceptions import (
    AgentStop,
    FormatError,
    Interrupted,
    LimitsExceeded,
    ModelError,
    PolicyDenied,
    SandboxError,
    Submitted,
    ToolError,
)
from fak.agent.model import ModelResponse, OpenAIChatModel, normalize_base_url
from fak.agent.protocols import DEFAULT_PROTOCOL, get_protocol
from fak.agent.tools import TOOL_NAMES, ToolBox, ToolResult, tool_schemas
from fak.agent.trajectory import Trajectory
from fak.agent.workspace import Workspace, WorkspaceError

__all__ = [
    "Agent", "AgentConfig", "AgentStats", "Environment", "Model", "AgentStop", "FormatError",
    "Interrupted", "LimitsExceeded", "ModelError", "PolicyDenied", "SandboxError", "Submitted",
    "ToolError", "ModelResponse", "OpenAIChatModel", "normalize_base_url", "DEFAULT_PROTOCOL",
    "get_protocol", "TOOL_NAMES", "ToolBox", "ToolResult", "tool_schemas", "Trajectory",
    "Workspace", "WorkspaceError",
]
