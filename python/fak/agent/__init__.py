"""fak's coding agent: a small loop (``agent.py``), tools over a workspace (``tools.py``,
``search.py``, ``workspace.py``), two ways of talking to the model (``protocols/``), prompts as
Jinja templates (``prompts/``) filled with real names of the task's repository (``context.py``),
and an OpenAI-compatible model client (``model.py``). The staged pipeline uses the same tools,
search and templates.
"""

from fak.agent.agent import (
    REPEAT_POLICIES,
    Agent,
    AgentConfig,
    AgentStats,
    Environment,
    Model,
)
from fak.agent.context import normalize_seeds, prompt_variables
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
from fak.agent.search import Searcher
from fak.agent.tools import TOOL_NAMES, ToolBox, ToolResult, call_key, tool_schemas
from fak.agent.trajectory import Trajectory
from fak.agent.workspace import Workspace, WorkspaceError

__all__ = [
    "Agent", "AgentConfig", "AgentStats", "Environment", "Model", "AgentStop", "FormatError",
    "Interrupted", "LimitsExceeded", "ModelError", "PolicyDenied", "SandboxError", "Submitted",
    "ToolError", "ModelResponse", "OpenAIChatModel", "normalize_base_url", "DEFAULT_PROTOCOL",
    "get_protocol", "TOOL_NAMES", "ToolBox", "ToolResult", "tool_schemas", "Trajectory",
    "Workspace", "WorkspaceError", "REPEAT_POLICIES", "normalize_seeds", "prompt_variables",
    "Searcher", "call_key",
]
