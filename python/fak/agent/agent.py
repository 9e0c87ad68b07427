"""The agent loop: ``run → step → query → execute`` (the shape of mini-swe-agent's default agent).

``run`` seeds the conversation (system prompt + the task), then ``step``s until an ``AgentStop``
(submit, step limit, interrupt, model failure). A step queries the model once, records the
gateway's policy verdicts, parses the reply into actions (``FormatError`` → a message back to the
model), and executes each action unless the policy denied it (a denied call is never executed; the
model is told and the loop goes on). The trajectory is saved after every step.
"""

from __future__ import annotations

import threading
import time
import traceback
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from fak.agent.exceptions import (
    AgentStop,
    FormatError,
    Interrupted,
    LimitsExceeded,
    Submitted,
    ToolError,
)
from fak.agent.model import ModelResponse
from fak.agent.protocols import Action, AgentProtocol
from fak.agent.tools import ToolResult, truncate_middle
from fak.agent.trajectory import Trajectory


class Model(Protocol):
    """Anything that answers a chat: ``query(messages, tools, options) -> ModelResponse``
    (``options``: extra request fields such as ``tool_choice`` and ``stop``)."""

    def query(self, messages: list[dict[str, Any]], tools: list[dict] | None = None,
              options: dict[str, Any] | None = None) -> ModelResponse:
        ...


class Environment(Protocol):
    """Anything that runs a tool call: ``execute(name, arguments) -> ToolResult``; raises
    ``Submitted`` for submit and ``ToolError`` for a failed call."""

    def execute(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        ...


@dataclass
class AgentConfig:
    """``max_steps``: model turns before ``LimitsExceeded``. ``observation_window``: when > 0,
    tool outputs older than that many steps are cut to ``old_observation_chars`` characters in
    what is sent to the model (the trajectory keeps them whole) so small context windows last.
    ``max_actions_per_step``: calls carried out per reply (the first ones; 0: all); the others
    are dropped from the history and the model is told. ``failed_reply_chars``: a reply that gave
    no usable action is kept in the history cut to this many characters."""

    max_steps: int = 30
    observation_window: int = 0
    old_observation_chars: int = 600
    max_actions_per_step: int = 1
    failed_reply_chars: int = 400


@dataclass
class AgentStats:
    """Live counters the fleet's table reads (one writer: the agent's thread)."""

    status: str = "starting"
    step: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model_s: float = 0.0
    last_tool: str = ""
    allowed: int = 0
    denied: int = 0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def tok_per_s(self) -> float:
        return self.completion_tokens / self.model_s if self.model_s > 0 else 0.0


def _blocking_verdict(action: Action, denied: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The denied verdict that covers ``action``, if any.

    A verdict covers a call with the same tool name whose ``arguments_digest`` equals the call's
    canonical digest; a verdict without a digest, or with one in another format, covers every call
    of that tool in the turn (the safe side: a denied call must never run).
    """
    ours = action.policy_digest
    for v in denied:
        if v.get("tool") != action.policy_tool:
            continue
        digest = str(v.get("arguments_digest") or "")
        digest = digest.split(":", 1)[1] if digest.startswith("sha256:") else digest
        comparable = len(digest) == 64 and all(c in "0123456789abcdef" for c in digest.lower())
        if not comparable or digest.lower() == ours:
            return v
    return None


def _matching_verdict(action: Action, verdicts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The verdict recorded for ``action`` (same tool; same digest when one is comparable)."""
    same_tool = [v for v in verdicts if v.get("tool") == action.policy_tool]
    for v in same_tool:
        digest = str(v.get("arguments_digest") or "").removeprefix("sha256:").lower()
        if digest == action.policy_digest:
            return v
    return same_tool[0] if len(same_tool) == 1 else None


def _allowing_verdict(action: Action, verdicts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The allowing verdict that covers ``action``: same tool, and the same digest when the
    verdict carries one in the agent's format (else any allowed call of that tool)."""
    for v in verdicts:
        if v.get("tool") != action.policy_tool or v.get("allowed") is not True:
            continue
        digest = str(v.get("arguments_digest") or "").removeprefix("sha256:").lower()
        comparable = len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)
        if not comparable or digest == action.policy_digest:
            return v
    return None


NOT_ADJUDICATED = ("[fak] not run: the gateway's policy did not check this call (the gateway did "
                   "not read it as a tool call). Make exactly one tool call per reply.")


class Agent:
    """One agent on one task. ``stop`` (a ``threading.Event``) interrupts it between steps."""

    def __init__(self, model: Model, env: Environment, protocol: AgentProtocol,
                 config: AgentConfig | None = None, trajectory: Trajectory | None = None,
                 stop: threading.Event | None = None):
        self.model = model
        self.env = env
        self.protocol = protocol
        self.config = config or AgentConfig()
        self.trajectory = trajectory or Trajectory(None)
        self.stop = stop or threading.Event()
        self.stats = AgentStats()
        self._seen_calls: set[tuple[str, str, str]] = set()  # (name, digest, output)
        self.messages: list[dict[str, Any]] = self.trajectory.data["messages"]
        self.trajectory.data["config"] = asdict(self.config)
        self.trajectory.data["protocol"] = protocol.name

    # -- loop ------------------------------------------------------------------------------

    def run(self, **task: Any) -> dict[str, Any]:
        """Run to the end on ``task`` (template variables: ``problem_statement``, ``repo``,
        ``workspace``). Returns the trajectory dict (``exit_reason`` set)."""
        self.messages.append({"role": "system", "content": self.protocol.system_prompt(**task)})
        self.messages.append({"role": "user", "content": self.protocol.instance_prompt(**task)})
        self.stats.status = "running"
        data = self.trajectory.data
        try:
            while True:
                self.step()
        except AgentStop as e:
            data["exit_reason"] = e.exit_reason
            data["exit_message"] = str(e) or e.exit_reason
            if self.stop.is_set() and not isinstance(e, Submitted):
                data["exit_reason"] = Interrupted.exit_reason  # a cancelled model call, say
        except Exception as e:  # noqa: BLE001 - recorded, the fleet goes on with other instances
            data["exit_reason"] = "interrupted" if self.stop.is_set() else "error"
            data["exit_message"] = f"{type(e).__name__}: {e}"
            data["info"]["traceback"] = traceback.format_exc()
        finally:
            data["timings"]["ended_at"] = time.time()
            self.stats.status = data["exit_reason"] or "error"
            self.trajectory.save()
        return data

    def step(self) -> None:
        """One model turn and its actions; the trajectory is saved afterwards."""
        if self.stop.is_set():
            raise Interrupted("stopped by the user")
        if self.stats.step >= self.config.max_steps:
            raise LimitsExceeded(f"no submit after {self.config.max_steps} steps")
        self.stats.step += 1
        record: dict[str, Any] = {"step": self.stats.step, "started_at": time.time(),
                                  "verdicts": [], "actions": [], "format_error": None}
        self.trajectory.data["steps"].append(record)
        self.trajectory.data["n_steps"] = self.stats.step
        try:
            response = self.query(record)
            self.execute(response, record)
        finally:
            self.trajectory.save()

    def query(self, record: dict[str, Any]) -> ModelResponse:
        """Ask the model for the next turn; append it to the history; count tokens and time."""
        self.stats.status = "querying"
        response = self.model.query(self._messages_to_send(), self.protocol.tools(),
                                    self.protocol.request_options())
        self.stats.status = "running"
        data = self.trajectory.data
        pt, ct = response.usage.get("prompt_tokens", 0), response.usage.get("completion_tokens", 0)
        self.stats.prompt_tokens += pt
        self.stats.completion_tokens += ct
        self.stats.model_s += response.latency_s
        data["tokens"]["prompt"] += pt
        data["tokens"]["completion"] += ct
        data["timings"]["model_s"] = round(data["timings"]["model_s"] + response.latency_s, 3)
        record.update(model_latency_s=round(response.latency_s, 3), attempts=response.attempts,
                      finish_reason=response.finish_reason, usage=response.usage,
                      response={"content": response.message.get("content"),
                                "tool_calls": response.message.get("tool_calls")})
        inline = ((response.raw or {}).get("fak") or {}).get("inline_reads") or []
        if inline:  # calls the gateway answered itself (--serve-inline-reads): the model saw them
            record["inline_reads"] = inline
            data["n_inline_reads"] = data.get("n_inline_reads", 0) + len(inline)
            for pair in inline:
                self.messages += [pair["assistant"], pair["tool"]]
        self.messages.append(self.protocol.history_message(response.message))
        return response

    def execute(self, response: ModelResponse, record: dict[str, Any]) -> None:
        """Carry out the actions of ``response``; denied calls are reported, never run.

        Only the first ``max_actions_per_step`` calls run (the rest are dropped from the history
        and the model is told). When the gateway denied the reply's first call, nothing runs: what
        followed it was planned on a call that did not happen.
        """
        verdicts = list((response.policy or {}).get("verdicts") or [])
        record["verdicts"] = verdicts
        record["policy_active"] = response.policy is not None
        denied = [v for v in verdicts if v.get("allowed") is False]
        self.stats.allowed += sum(1 for v in verdicts if v.get("allowed") is True)
        self.stats.denied += len(denied)
        self.trajectory.data["n_denied"] += len(denied)
        try:
            actions = self.protocol.parse(response.message)
        except FormatError as e:
            if denied:  # the gateway removed the (only) call: tell the model about the denial
                self.messages.append(self.protocol.denied(denied))
                return
            record["format_error"] = str(e) or "no tool call"
            self.trajectory.data["n_format_errors"] += 1
            self.messages[-1] = self.protocol.shorten_failed(self.messages[-1],
                                                             self.config.failed_reply_chars)
            self.messages.append(self.protocol.format_error(str(e)))
            return
        limit = self.config.max_actions_per_step
        keep = actions if limit <= 0 else actions[:limit]
        if limit > 0 and verdicts and verdicts[0].get("allowed") is False:
            # the first call the model wrote was denied: removed by the gateway (nothing runs),
            # or still there (it is reported as denied, never run)
            keep = keep[:1] if keep and _blocking_verdict(keep[0], denied) else []
        dropped = [a for a in actions if a not in keep]
        if dropped:
            record["dropped"] = [{"name": a.name, "arguments": a.arguments} for a in dropped]
            self.messages[-1] = self.protocol.trim_history(self.messages[-1], keep)
        steps_left = self.config.max_steps - self.stats.step
        try:
            for i, action in enumerate(keep):
                note = ""
                if i == 0 and dropped and keep:
                    note = (f"[Only your first call was run; the other {len(dropped)} were ignored. "
                            "Make one call per reply and wait for its result.]")
                self._execute_one(action, denied, record, steps_left, note)
        finally:
            if denied:
                self.messages.append(self.protocol.denied(denied))

    def _execute_one(self, action: Action, denied: list[dict[str, Any]], record: dict[str, Any],
                     steps_left: int, note: str = "") -> None:
        entry: dict[str, Any] = {"id": action.id, "name": action.name,
                                 "arguments": action.arguments, "denied": False, "verdict": None,
                                 "executed": False, "ok": None, "returncode": None, "output": None,
                                 "duration_s": 0.0}
        record["actions"].append(entry)
        self.stats.last_tool = action.name
        verdict = _blocking_verdict(action, denied)
        entry["verdict"] = verdict or _matching_verdict(action, record["verdicts"])
        if verdict is not None:
            entry.update(denied=True, verdict=verdict, ok=False,
                         output=f"[fak policy] denied {action.name}: {verdict.get('reason')}")
            self.messages.append(self.protocol.observation(action, entry["output"], None, steps_left))
            return
        if record.get("policy_active") and _allowing_verdict(action, record["verdicts"]) is None:
            # a policy is on, but this call was never adjudicated: it must not run
            entry.update(ok=False, not_adjudicated=True, output=NOT_ADJUDICATED)
            self.messages.append(self.protocol.observation(action, entry["output"], None, steps_left))
            return
        self.stats.status = f"tool:{action.name}"
        try:
            result = self.env.execute(action.name, action.arguments)
        except Submitted:
            entry.update(executed=True, ok=True, output="submitted")
            raise
        except ToolError as e:
            result = ToolResult(f"Error: {e}", ok=False)
        finally:
            self.stats.status = "running"
        entry.update(executed=True, ok=result.ok, returncode=result.returncode,
                     output=result.output, duration_s=round(result.duration_s, 3))
        t = self.trajectory.data["timings"]
        t["tools_s"] = round(t["tools_s"] + result.duration_s, 3)
        output = result.output
        call = (action.name, action.digest, result.output)
        if call in self._seen_calls:
            entry["repeated"] = True
            self.trajectory.data["n_repeated"] = self.trajectory.data.get("n_repeated", 0) + 1
            output += ("\n[You made this same call before and got this same result. Do not repeat "
                       "it: do something else.]")
        self._seen_calls.add(call)
        if note:
            output = f"{note}\n{output}"
        self.messages.append(self.protocol.observation(action, output, result.returncode,
                                                       steps_left))

    def _messages_to_send(self) -> list[dict[str, Any]]:
        window = self.config.observation_window
        if window <= 0:
            return self.messages
        # indices of assistant turns; observations before the window-th last one are cut
        turns = [i for i, m in enumerate(self.messages) if m["role"] == "assistant"]
        if len(turns) <= window:
            return self.messages
        cutoff = turns[-window]
        out = []
        for i, m in enumerate(self.messages):
            if i < cutoff and i > 1 and m["role"] in ("tool", "user") and m.get("content"):
                m = {**m, "content": truncate_middle(m["content"], self.config.old_observation_chars)}
            out.append(m)
        return out
