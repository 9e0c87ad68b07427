"""Control flow of the agent loop, as exceptions (the mini-swe-agent pattern).

``AgentStop`` and its subclasses end a run; ``FormatError``, ``ToolError`` and ``PolicyDenied`` are
turned into a message to the model and the run goes on.
"""

from __future__ import annotations


class AgentStop(Exception):
    """Ends the run. ``exit_reason`` is the short label written to the trajectory and summary."""

    exit_reason = "stopped"


class Submitted(AgentStop):
    """The model called ``submit`` (tool protocol) or ran ``submit`` (text protocol)."""

    exit_reason = "submitted"


class LimitsExceeded(AgentStop):
    """``max_steps`` model turns were used without a submit."""

    exit_reason = "max_steps"


class Interrupted(AgentStop):
    """The fleet asked the agent to stop (Ctrl-C); the instance is not recorded as finished."""

    exit_reason = "interrupted"


class ModelError(AgentStop):
    """The model endpoint failed for good (retries exhausted, context too long, bad response)."""

    exit_reason = "model_error"


class ContextLimitExceeded(AgentStop):
    """The conversation no longer fits the model's context window (the endpoint answered
    ``context_length_exceeded``); the run ends and the workspace's changes so far are the patch."""

    exit_reason = "context_limit"


class FormatError(Exception):
    """The model's turn could not be turned into actions; the message is shown to the model."""


class ToolError(Exception):
    """A tool call was well-formed but could not be carried out (no such file, edit did not match,
    syntax error after an edit, ...); the message is shown to the model."""


class PolicyDenied(Exception):
    """The gateway's policy denied a tool call; it is never executed. ``verdict`` is the gateway's
    verdict object (``tool``, ``allowed``, ``reason``, ``rule``, ``call_ref``, ``arguments_digest``)."""

    def __init__(self, verdict: dict):
        self.verdict = verdict
        super().__init__(f"[fak policy] denied {verdict.get('tool')}: {verdict.get('reason')}")


# ``SandboxError`` (and its ``SandboxUnavailable``) live with the sandbox, ``fak.sandbox``: a
# command fak would run for the model cannot be run safely here, and ``--unsafe-no-sandbox`` was
# not given. Re-exported here, where the agent's other control-flow exceptions are.
from fak.sandbox.errors import SandboxError  # noqa: E402, F401
