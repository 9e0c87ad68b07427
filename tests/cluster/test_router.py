"""The router's HTTP side (``fak.cluster.router``) over scripted replicas: relaying, the
``X-Fak-Replica`` / ``X-Fak-Route`` headers, a dead replica (retry elsewhere, then an
OpenAI-style 503), health probes, a stream cut mid-answer, and ``fak router`` in front of two
``fak serve`` processes sharing one audit log (each record naming its replica).

To add a case: start replicas (``ScriptedServer`` or a small Litestar app), put a ``Router``
and ``create_router_app`` on a ``BackgroundServer``, and talk to it with httpx or openai.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import openai
from litestar import Litestar, post
from litestar.response import Stream

from cluster_procs import fak_process
from fak.agent.scripted import ScriptedServer
from fak.cluster.router import create_router_app
from fak.cluster.routing import Router
from fak.gateway.server import BackgroundServer

REPO = Path(__file__).resolve().parents[2]
LONG = "Fix the bug in calc.add: it subtracts. " * 10


def ask(client: httpx.Client, conversation: str | None, text: str) -> httpx.Response:
    headers = {"X-Fak-Conversation": conversation} if conversation else {}
    return client.post("/v1/chat/completions", headers=headers, timeout=30,
                       json={"model": "m", "messages": [{"role": "user", "content": text}]})


def test_relay_affinity_and_failover(scripted):
    a = scripted({"*": [{"content": "from a"}]})
    b = scripted({"*": [{"content": "from b"}]})
    router = Router([("a", a.url), ("b", b.url)])
    with BackgroundServer(create_router_app(router, probe_interval_s=0)) as srv:
        c = httpx.Client(base_url=srv.url)
        first = ask(c, "run/1", LONG + "1")
        assert first.status_code == 200
        home = first.headers["x-fak-replica"]
        assert first.headers["x-fak-route"] == "least_loaded"
        assert first.json()["choices"][0]["message"]["content"] == f"from {home}"
        for turn in range(3):
            r = ask(c, "run/1", LONG + "1" + " more" * turn)
            assert (r.headers["x-fak-replica"], r.headers["x-fak-route"]) == (home, "conversation")
        # the replica's log saw the conversation header the client sent
        server = a if home == "a" else b
        assert {q["headers"]["x-fak-conversation"] for q in server.requests} == {"run/1"}
        # the home replica dies: the next turn is sent to the other one and answered
        server.stop()
        r = ask(c, "run/1", LONG + "1 again")
        assert r.status_code == 200 and r.headers["x-fak-replica"] != home
        health = c.get("/health").json()
        down = {x["name"]: x for x in health["replicas"]}[home]
        assert down["up"] is False and "ConnectorError" in down["down_reason"]
        assert c.get("/v1/models").status_code == 200
        # nobody left: an OpenAI-style 503
        (b if home == "a" else a).stop()
        r = ask(c, "run/2", "x")
        assert r.status_code == 503
        err = r.json()["error"]
        assert err["type"] == "server_error" and err["code"] == "replica_unavailable"
        assert "no replica can take the request" in err["message"]
        assert c.get("/health").status_code == 503
        assert ask(c, None, "not json").status_code == 503  # valid JSON, still no replica
        bad = c.post("/v1/chat/completions", content=b"{nope", headers={"content-type": "application/json"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"


def test_health_probe_marks_a_replica_up_again(scripted):
    a = scripted({"*": [{"content": "a"}]})
    router = Router([("a", a.url)])
    with BackgroundServer(create_router_app(router, probe_interval_s=0.1)):
        router.mark_down("a", "test")
        deadline = time.monotonic() + 10
        while not router.replicas["a"].up:
            assert time.monotonic() < deadline, "the probe did not mark the replica up"
            time.sleep(0.05)


def _cut_stream_app() -> Litestar:
    @post("/v1/chat/completions", status_code=200)
    async def chat() -> Stream:
        async def events():
            yield b'data: {"choices":[{"index":0,"delta":{"content":"par"}}]}\n\n'
            await asyncio.sleep(0.05)
            raise RuntimeError("replica died mid-stream")
        return Stream(events(), media_type="text/event-stream")

    return Litestar(route_handlers=[chat], logging_config=None)


def test_stream_cut_mid_answer_ends_with_an_error_event():
    with BackgroundServer(_cut_stream_app()) as broken:
        router = Router([("broken", broken.url)])
        with BackgroundServer(create_router_app(router, probe_interval_s=0)) as srv:
            r = httpx.post(srv.url + "/v1/chat/completions", timeout=30,
                           json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]})
            assert r.status_code == 200 and r.headers["x-fak-replica"] == "broken"
            events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
            assert events[0]["choices"][0]["delta"]["content"] == "par"
            assert events[-1]["error"]["code"] == "replica_unavailable"
            assert router.replicas["broken"].up is False
            assert router.replicas["broken"].in_flight == 0


def test_fak_router_in_front_of_two_fak_serve_one_audit_stream(tmp_path):
    """``fak router`` relays to two ``fak serve`` proxies of a scripted model; both apply the
    policy and append to one audit log, each record naming its replica."""
    turn = {"tool_calls": [{"name": "bash", "arguments": {"command": "sudo su"}},
                           {"name": "bash", "arguments": {"command": "ls"}}]}
    model = ScriptedServer({"*": [turn]}).start()
    audit = tmp_path / "audit.jsonl"
    policy = REPO / "tests" / "data" / "policy_strict.json"
    common = ("serve", "--base-url", model.url + "/v1", "--policy", str(policy),
              "--audit-log", str(audit))
    try:
        with fak_process(*common, "--replica-name", "r0") as r0, \
                fak_process(*common, "--replica-name", "r1") as r1, \
                fak_process("router", "--replica", f"r0={r0}", "--replica", f"r1={r1}/v1") as front:
            client = openai.OpenAI(base_url=front + "/v1", api_key="x", max_retries=0)
            homes = {}
            for i in range(6):
                conv = f"run/i{i}"
                raw = client.chat.completions.with_raw_response.create(
                    model="scripted", messages=[{"role": "user", "content": f"task {i}"}],
                    tools=[{"type": "function", "function": {"name": "bash", "parameters": {
                        "type": "object", "properties": {"command": {"type": "string"}}}}}],
                    extra_headers={"X-Fak-Conversation": conv, "X-Fak-Workspace": str(tmp_path)})
                homes[conv] = raw.headers["x-fak-replica"]
                calls = raw.parse().choices[0].message.tool_calls
                assert [c.function.arguments for c in calls] == ['{"command": "ls"}']
            health = httpx.get(front + "/health").json()
    finally:
        model.stop()
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    assert len(records) == 12
    assert {r["replica"] for r in records} == {"r0", "r1"}  # new conversations spread by load
    for r in records:
        assert r["replica"] == homes[r["conversation"]]
    assert sorted(r["verdict"] for r in records) == ["allow"] * 6 + ["deny"] * 6
    assert sum(x["requests"] for x in health["replicas"]) == 6
