"""The agent loop: ``run → step → query → execute`` (the shape of mini-swe-agent's default agent).

``run`` seeds the conversation (system prompt + the task, with real example paths of the
workspace and the seed locations a localizer found), then ``step``s until an ``AgentStop``
(submit, step limit, interrupt, model failure). A step queries the model once, records the
gateway's policy verdicts, parses the reply into actions (``FormatError`` → a message back to the
model), and executes each action unless the policy denied it (a denied call is never executed; the
model is told and the loop goes on). The trajectory is saved after every step.

A call identical to one already executed (same tool, same normalized arguments:
``tools.call_key``) while no file has changed since (``ToolBox.state_token``) is not executed
again; what happens instead is ``AgentConfig.on_repeat``:

- ``"resample"`` (default): the reply is dropped from the history and the model is asked again
  for that turn at ``resample_temperature`` with a new seed, up to ``repeat_resamples`` times;
  a reply still repeating is then answered as with ``"tell"``. Why: at temperature 0 the 1.5B
  model repeated a call in 65 of 109 turns of the CPU runs (``benches/results/
  swebench-cpu-1.5b.md``) although each repeat was pointed out to it, e.g. the same search 10
  times in a row: a greedy model in an all-but-unchanged context writes the same reply again,
  while a resample changes the reply itself, and costs little (the prompt is the one just
  prefilled: the prefix cache serves it). A reply whose only calls the gateway removed as denied,
  each one (tool, arguments digest) denied at an earlier step already, is resampled the same way
  (the 0.5B model called a tool named after the issue's method 8 times in a row).
- ``"tell"``: the call is not run; the model is told it made it at step N and that the result
  would be the same (``prompts/repeated.j2``).
- ``"run"``: run it anyway and say so after its output (the old behaviour).

The trajectory records each resample (``steps[i].resamples``: the dropped reply, the repeated call,
the step it repeats, temperature and seed; ``n_resampled``) and each call not run
(``actions[j].repeated``, ``repeat_of``; ``n_repeated``).
"""

from __future__ import annotations

import threading
import time
import traceback
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from fak.agent.context import prompt_variables
from fak.agent.exceptions import (
    AgentStop,
    FormatError,
    Interrupted,
    LimitsExceeded,
    Submitted,
    ToolError,
)
from fak.agent.model import ModelResponse
from fak.agent.prompts import render
from fak.agent.protocols import Action, AgentProtocol
from fak.agent.tools import ToolResult, call_key, truncate_middle
from fak.agent.trajectory import Trajectory
from fak.agent.verify import OUTPUT_CHARS, EditVerifier
from fak.toolcalls import verdict_for

REPEAT_POLICIES = ("resample", "tell", "run")


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
    no usable action is kept in the history cut to this many characters. ``on_repeat``: what to do
    with a call identical to one already made (``"resample"`` | ``"tell"`` | ``"run"``, see the
    module docstring; ``"resample"`` also resamples a reply whose only calls the gateway denied
    before and removed); ``repeat_resamples``: new samples asked for one turn before telling;
    ``resample_temperature`` and ``seed`` (the n-th resample of step s uses seed
    ``seed + 1000 * s + n``) are sent with a resample. ``verify_on_edit``: after each successful
    ``edit``, run the model's own reproduction script again (``fak.agent.verify``) and show its
    output with the edit's result. Raises ``ValueError`` for an unknown ``on_repeat`` or a
    negative count."""

    max_steps: int = 30
    observation_window: int = 0
    old_observation_chars: int = 600
    max_actions_per_step: int = 1
    failed_reply_chars: int = 400
    on_repeat: str = "resample"
    repeat_resamples: int = 2
    resample_temperature: float = 0.7
    seed: int = 0
    verify_on_edit: bool = True

    def __post_init__(self) -> None:
        if self.on_repeat not in REPEAT_POLICIES:
            raise ValueError(f"on_repeat must be one of {', '.join(REPEAT_POLICIES)}, "
                             f"not {self.on_repeat!r}")
        if self.repeat_resamples < 0:
            raise ValueError(f"repeat_resamples must be >= 0, not {self.repeat_resamples}")


@dataclass
class AgentStats:
    """Live counters the fleet's table reads (one writer: the agent's thread)."""

    status: str = "starting"
    step: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model_s: float = 0.0
    decode_s: float = 0.0  # the server's decode time (seconds), where it reports one
    decode_tokens: int = 0
    last_tool: str = ""
    allowed: int = 0
    denied: int = 0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def tok_per_s(self) -> float:
        return self.completion_tokens / self.model_s if self.model_s > 0 else 0.0


def _verdict_of(action: Action, verdicts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The gateway's verdict about ``action``: the one whose ``call_ref`` is the action's (a
    structured call's id) or, for a shell block, the ``block:N`` verdict with the block's span
    (``fak.toolcalls.verdict_for``). A denied verdict that carries no ``call_ref`` (a gateway
    without the contract) covers every call of its tool: a denied call must never run."""
    found = verdict_for(verdicts, call_ref=action.call_ref, span=action.span)
    if found is None:
        found = next((v for v in verdicts if v.get("allowed") is False and not v.get("call_ref")
                      and v.get("tool") == action.policy_tool), None)
    return dict(found) if found is not None else None


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
        # (call key, workspace state) → {"step", "ok"} of the first execution
        self._calls: dict[tuple[str, Any], dict[str, Any]] = {}
        self._mutations = 0  # state for an environment without state_token()
        self._denials: dict[tuple[str, str], int] = {}  # (tool, digest) → step first denied
        self._verifier = EditVerifier()
        self.messages: list[dict[str, Any]] = self.trajectory.data["messages"]
        self.trajectory.data["config"] = asdict(self.config)
        self.trajectory.data["protocol"] = protocol.name

    # -- loop ------------------------------------------------------------------------------

    def run(self, *, seed_locations: list[dict[str, Any]] | None = None,
            **task: Any) -> dict[str, Any]:
        """Run to the end on ``task`` (template variables: ``problem_statement``, ``repo``,
        ``workspace``, optionally ``listing``, ``python_note`` and any of
        ``context.PROMPT_DEFAULTS`` to override what is read from the workspace).
        ``seed_locations``: ``[{"path", "line"?, "symbol"?}]`` from a localizer, shown in the
        first user message as likely relevant (``None``: none). Returns the trajectory dict
        (``exit_reason`` set)."""
        data = self.trajectory.data
        context: dict[str, Any] = {}
        workspace = task.get("workspace")
        if workspace:
            context = prompt_variables(workspace, str(task.get("repo") or ""), seed_locations)
        self.protocol.context = {**context, "verify_on_edit": self.config.verify_on_edit, **task}
        data["info"]["seed_locations"] = context.get("seeds", [])
        data["info"]["prompt_examples"] = {k: v for k, v in context.items()
                                           if k.startswith("example_")}
        self.messages.append({"role": "system", "content": self.protocol.system_prompt()})
        self.messages.append({"role": "user", "content": self.protocol.instance_prompt()})
        self.stats.status = "running"
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
            response = self.resample_repeats(response, record)
            self.execute(response, record)
        finally:
            self.trajectory.save()

    def query(self, record: dict[str, Any], options: dict[str, Any] | None = None) -> ModelResponse:
        """Ask the model for the next turn; append it to the history; count tokens and time.
        ``options`` are extra request fields (they win over the protocol's)."""
        self.stats.status = "querying"
        response = self.model.query(self._messages_to_send(), self.protocol.tools(),
                                    {**self.protocol.request_options(), **(options or {})})
        self.stats.status = "running"
        data = self.trajectory.data
        pt, ct = response.usage.get("prompt_tokens", 0), response.usage.get("completion_tokens", 0)
        self.stats.prompt_tokens += pt
        self.stats.completion_tokens += ct
        self.stats.model_s += response.latency_s
        if response.decode_s is not None:
            self.stats.decode_s += response.decode_s
            self.stats.decode_tokens += response.decode_tokens
            data["timings"]["decode_s"] = round(data["timings"].get("decode_s", 0.0) + response.decode_s, 3)
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

    # -- repeated calls ----------------------------------------------------------------------

    def _state(self) -> Any:
        token = getattr(self.env, "state_token", None)
        return token() if callable(token) else self._mutations

    def _repeat_of(self, action: Action) -> dict[str, Any] | None:
        """The first execution of a call identical to ``action`` at the current workspace state
        (``{"step", "ok"}``), or ``None``. ``submit`` is never a repeat."""
        if action.name == "submit":
            return None
        return self._calls.get((call_key(action.name, action.arguments), self._state()))

    @staticmethod
    def _denial_key(verdict: dict[str, Any]) -> tuple[str, str]:
        digest = str(verdict.get("arguments_digest") or "").removeprefix("sha256:").lower()
        return str(verdict.get("tool")), digest

    def _repeated_denial(self, response: ModelResponse) -> dict[str, Any] | None:
        """When every verdict of ``response`` is a denial of a call (tool and arguments digest)
        the gateway already denied at an earlier step, that step (``{"step", "tool"}``); else
        ``None``. A reply whose only call the gateway removed has no action to compare."""
        verdicts = list((response.policy or {}).get("verdicts") or [])
        if not verdicts or any(v.get("allowed") is not False for v in verdicts):
            return None
        steps = [self._denials.get(self._denial_key(v)) for v in verdicts]
        if any(s is None for s in steps):
            return None
        return {"step": min(steps), "tool": verdicts[0].get("tool")}

    def resample_repeats(self, response: ModelResponse, record: dict[str, Any]) -> ModelResponse:
        """With ``on_repeat="resample"``: while the reply's first call repeats an earlier one,
        drop the reply from the history and ask again (``resample_temperature``, a new seed), at
        most ``repeat_resamples`` times. Returns the reply to execute."""
        cfg = self.config
        if cfg.on_repeat != "resample":
            return response
        for attempt in range(1, cfg.repeat_resamples + 1):
            try:
                actions = self.protocol.parse(response.message)
            except FormatError:
                actions = []
            if actions:
                prior = self._repeat_of(actions[0])
                call = {"name": actions[0].name, "arguments": actions[0].arguments}
            else:  # the gateway removed the call: the same denied call as before?
                prior = self._repeated_denial(response)
                call = {"name": (prior or {}).get("tool"), "denied": True}
            if prior is None:
                return response
            seed = cfg.seed + 1000 * self.stats.step + attempt
            record.setdefault("resamples", []).append({
                "attempt": attempt, "temperature": cfg.resample_temperature, "seed": seed,
                "repeated_call": call,
                "repeat_of_step": prior["step"], "response": record.get("response"),
                "usage": record.get("usage"), "model_latency_s": record.get("model_latency_s"),
                "verdicts": list((response.policy or {}).get("verdicts") or [])})
            data = self.trajectory.data
            data["n_resampled"] = data.get("n_resampled", 0) + 1
            self.messages.pop()  # the repeated reply is not part of the conversation
            response = self.query(record, {"temperature": cfg.resample_temperature, "seed": seed})
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
        for v in denied:  # for _repeated_denial
            self._denials.setdefault(self._denial_key(v), self.stats.step)
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
            first = _verdict_of(keep[0], verdicts) if keep else None
            keep = keep[:1] if first is not None and first.get("allowed") is False else []
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
        verdict = _verdict_of(action, record["verdicts"])
        entry["verdict"] = verdict
        if verdict is not None and verdict.get("allowed") is False:
            entry.update(denied=True, ok=False,
                         output=f"[fak policy] denied {action.name}: {verdict.get('reason')}")
            self.messages.append(self.protocol.observation(action, entry["output"], None, steps_left))
            return
        if record.get("policy_active") and (verdict is None or verdict.get("allowed") is not True):
            # a policy is on, but this call was never adjudicated: it must not run
            entry.update(ok=False, not_adjudicated=True, output=NOT_ADJUDICATED)
            self.messages.append(self.protocol.observation(action, entry["output"], None, steps_left))
            return
        state = self._state()
        prior = self._repeat_of(action)
        if prior is not None and self.config.on_repeat != "run":
            entry.update(ok=False, repeated=True, repeat_of=prior["step"],
                         output=render("repeated.j2", tool=action.name, step=prior["step"],
                                       ok=prior["ok"]))
            data = self.trajectory.data
            data["n_repeated"] = data.get("n_repeated", 0) + 1
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
            if action.name in ("edit", "write", "bash"):
                self._mutations += 1
        entry.update(executed=True, ok=result.ok, returncode=result.returncode,
                     output=result.output, duration_s=round(result.duration_s, 3))
        t = self.trajectory.data["timings"]
        t["tools_s"] = round(t["tools_s"] + result.duration_s, 3)
        output = result.output
        if prior is not None:  # on_repeat == "run"
            entry.update(repeated=True, repeat_of=prior["step"])
            self.trajectory.data["n_repeated"] = self.trajectory.data.get("n_repeated", 0) + 1
            output += ("\n[You made this same call before and got this same result. Do not repeat "
                       "it: do something else.]")
        else:
            self._calls[(call_key(action.name, action.arguments), state)] = {
                "step": self.stats.step, "ok": result.ok}
        if self.config.verify_on_edit:
            self._verifier.observe(action.name, action.arguments, result.ok)
            again = self._verifier.after_edit(action.name, action.arguments, result.ok)
            if again is not None:
                output += self._verify(again, entry)
        if note:
            output = f"{note}\n{output}"
        self.messages.append(self.protocol.observation(action, output, result.returncode,
                                                       steps_left))

    def _verify(self, command: str, entry: dict[str, Any]) -> str:
        """Runs ``command`` (the model's own script run, allowed by the policy when the model
        made it) again after an edit, in the same environment; returns the text added to the
        edit's observation and records the run in ``entry["verify"]``."""
        self.stats.status = "tool:verify"
        try:
            result = self.env.execute("bash", {"command": command})
        except ToolError as e:
            result = ToolResult(f"Error: {e}", ok=False)
        finally:
            self.stats.status = "running"
            self._mutations += 1
        entry["verify"] = {"command": command, "ok": result.ok, "returncode": result.returncode,
                           "output": result.output, "duration_s": round(result.duration_s, 3)}
        data = self.trajectory.data
        data["n_verify_runs"] = data.get("n_verify_runs", 0) + 1
        t = data["timings"]
        t["tools_s"] = round(t["tools_s"] + result.duration_s, 3)
        status = "" if result.returncode is None else f", exit status {result.returncode}"
        return (f"\n\n[After this edit `{command}` ran again{status}:]\n"
                f"{truncate_middle(result.output, OUTPUT_CHARS)}")

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
