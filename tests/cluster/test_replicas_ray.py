"""Two ``fak serve`` replicas of the real 0.5B on the CPU as Ray actors of a local cluster, the
router in front: a conversation's turns stay on one replica (its prefix-cache hits prove it), 32
concurrent conversations spread over both, and a replica killed mid-run (its in-flight requests
are answered by the other or fail as an OpenAI-style 503; the router stops sending to it).

To add a case: use the ``cluster`` fixture (replica set, router, base URL) and leave the
killing test last in the file (it removes a replica for the rest of the module).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import time

import httpx
import pytest

from fak.gateway.server import BackgroundServer

SYSTEM = ("You are a careful coding assistant working inside a Python repository. Answer in one "
          "short sentence. Never invent file names; say when you do not know. Prefer the "
          "standard library, keep functions small, and explain nothing unless asked. ") * 3


@pytest.fixture(scope="module")
def cluster(ray_local, model_05b):
    from fak.cluster.replicas import ReplicaSet, ReplicaSpec
    from fak.cluster.router import create_router_app
    from fak.cluster.routing import Router

    spec = ReplicaSpec(gguf=str(model_05b), backend="cpu", n_ctx=1024, max_concurrency=32,
                       kv_cache_tokens=16384)
    replicas = ReplicaSet(spec, 2, num_cpus=1, host="127.0.0.1").start()
    router = Router(replicas.endpoints())
    server = BackgroundServer(create_router_app(router, probe_interval_s=0.5)).start()
    model = next(iter(replicas.infos.values()))["model"]
    try:
        yield {"replicas": replicas, "router": router, "url": server.url, "model": model}
    finally:
        server.stop()
        replicas.stop()


def engine_stats(url: str) -> dict:
    return httpx.get(url + "/health", timeout=10).json()["engine"]


def chat(cluster, conversation: str | None, messages: list[dict], max_tokens: int = 3,
         stream: bool = False, timeout: float = 300) -> httpx.Response:
    headers = {"X-Fak-Conversation": conversation} if conversation else {}
    return httpx.post(cluster["url"] + "/v1/chat/completions", headers=headers, timeout=timeout,
                      json={"model": cluster["model"], "messages": messages, "stream": stream,
                            "max_tokens": max_tokens, "temperature": 0})


def test_a_conversation_stays_on_the_replica_that_caches_it(cluster):
    urls = dict(cluster["replicas"].endpoints())
    before = {n: engine_stats(u)["native_prefix_cache_hit_tokens"] for n, u in urls.items()}
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "What does len([]) return?"}]
    homes = []
    for turn in range(3):
        r = chat(cluster, "conv/one", messages)
        assert r.status_code == 200, r.text
        homes.append((r.headers["x-fak-replica"], r.headers["x-fak-route"]))
        messages += [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                     {"role": "user", "content": f"And turn {turn}?"}]
    home = homes[0][0]
    assert homes[1:] == [(home, "conversation")] * 2
    after = {n: engine_stats(u)["native_prefix_cache_hit_tokens"] for n, u in urls.items()}
    # turns 2 and 3 reuse the KV blocks of the system prompt and the earlier turns (>= 32-token
    # blocks of a ~150-token prefix, twice); the other replica saw none of it
    assert after[home] - before[home] >= 2 * 96
    other = next(n for n in urls if n != home)
    assert after[other] == before[other]


def test_32_concurrent_conversations_spread_over_both_and_stay(cluster):
    def first_turn(i: int) -> tuple[int, str, str]:
        r = chat(cluster, f"fleet/i{i}", [{"role": "system", "content": SYSTEM},
                                          {"role": "user", "content": f"Name a prime above {i}."}],
                 max_tokens=2)
        assert r.status_code == 200, r.text
        return i, r.headers["x-fak-replica"], r.json()["choices"][0]["message"]["content"]

    with cf.ThreadPoolExecutor(32) as pool:
        firsts = list(pool.map(first_turn, range(32)))
    by_replica: dict[str, int] = {}
    for _, name, _ in firsts:
        by_replica[name] = by_replica.get(name, 0) + 1
    assert set(by_replica) == set(cluster["router"].replicas), by_replica
    assert min(by_replica.values()) >= 8, by_replica  # neither replica takes (nearly) all

    def second_turn(item: tuple[int, str, str]) -> tuple[str, str, str]:
        i, name, text = item
        r = chat(cluster, f"fleet/i{i}", [{"role": "system", "content": SYSTEM},
                                          {"role": "user", "content": f"Name a prime above {i}."},
                                          {"role": "assistant", "content": text},
                                          {"role": "user", "content": "Another?"}], max_tokens=2)
        assert r.status_code == 200, r.text
        return name, r.headers["x-fak-replica"], r.headers["x-fak-route"]

    with cf.ThreadPoolExecutor(32) as pool:
        seconds = list(pool.map(second_turn, firsts))
    assert all(first == second and why == "conversation" for first, second, why in seconds)


def test_a_replica_killed_mid_run(cluster):
    """Last in the module: replica-0 is gone afterwards."""
    replicas, router = cluster["replicas"], cluster["router"]

    def one(i: int) -> tuple[str, int, str, str]:
        kind = "stream" if i % 3 == 0 else "plain"
        r = chat(cluster, f"kill/i{i}", [{"role": "user", "content": f"Count from {i} upwards."}],
                 max_tokens=48, stream=kind == "stream")
        return kind, r.status_code, r.headers.get("x-fak-replica", ""), r.text

    with cf.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(one, i) for i in range(8)]
        deadline = time.monotonic() + 120
        while router.replicas["replica-0"].in_flight == 0:  # requests reach replica-0 first
            assert time.monotonic() < deadline, "no request reached replica-0"
            time.sleep(0.05)
        time.sleep(1.0)  # mid-generation
        replicas.kill("replica-0")
        results = [f.result(timeout=600) for f in futures]
    answered = 0
    for kind, status, name, text in results:
        if status == 503:  # failed cleanly, OpenAI-shaped
            assert json.loads(text)["error"]["code"] == "replica_unavailable"
            continue
        assert status == 200, text
        if kind == "stream" and '"replica_unavailable"' in text:
            # cut mid-stream: ends with an OpenAI-style error event
            last = [line for line in text.splitlines() if line.startswith("data: ")][-1]
            assert json.loads(last[6:])["error"]["type"] == "server_error"
            continue
        answered += 1
        if kind == "plain":
            assert json.loads(text)["choices"][0]["finish_reason"] in ("stop", "length")
    assert answered >= 4  # replica-1's own and the plain ones sent again
    assert router.replicas["replica-0"].up is False
    # from now on everything goes to replica-1
    for i in range(3):
        r = chat(cluster, f"after/i{i}", [{"role": "user", "content": "Hi"}], max_tokens=2)
        assert r.status_code == 200 and r.headers["x-fak-replica"] == "replica-1"
    health = httpx.get(cluster["url"] + "/health").json()
    assert {x["name"]: x["up"] for x in health["replicas"]} == {"replica-0": False, "replica-1": True}
    assert health["resent"] >= 1  # a plain request cut by the kill was answered by replica-1
