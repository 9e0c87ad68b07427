"""The replica router and the Ray fleet: prefix-aware routing against round robin, and scale.

Three measurements, each run once (``benchmark.pedantic(rounds=1)``), one JSON line each on
stdout (MEASURED on the machine that ran them; ``benches/results/router.md`` records them):

- ``test_routing_policy[prefix|round_robin]``: two replicas of the real 0.5B on the CPU (Ray
  actors of a local cluster, 1 CPU each, started fresh for each policy so that no cache is warm),
  the router in front; a multi-turn fleet workload: ``FAK_BENCH_CONVERSATIONS`` (default 8)
  conversations at once, ``FAK_BENCH_TURNS`` (default 4) turns each, one shared system prompt,
  each turn adding the model's reply and a tool result. Prefix-cache hit rate (hit / queried
  prompt tokens, from the replicas' engine counters) and time to first token (streamed).
- ``test_router_scale[N]``: the router (``fak router``, its own process) in front of 2 scripted
  replicas (``fak.agent.scripted``, own processes, answering at once), N concurrent agents
  (1, 100, 1000, 5000) each sending requests one after another from one asyncio/aiohttp client
  process; the same load sent straight to the replicas is the peer: requests/s, and the router's
  added latency at p50/p99 (through the router minus straight, same N).
- ``test_ray_scheduler_overhead[N]``: N no-op Ray tasks of 1 CPU on a local cluster of 2 CPUs
  (1, 100, 1000, 5000): tasks/s and the scheduler's cost per task; plus the fleet itself
  (``test_ray_fleet_overhead``): 8 tiny instances on the scripted model, ``Fleet`` on Ray tasks against
  the threaded ``Fleet``, 2 at once each.

Run: ``PYTHONPATH=python python -m pytest benches/bench_router.py --benchmark-only -s``
(``FAK_BENCH_GGUF`` overrides the 0.5B; the routing part fetches it like the tests do).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "swebench"))

from fak_subprocess import fak_argv, fak_env, stop_process  # noqa: E402

SYSTEM = ("You are fak's coding agent. You work in one repository checkout (the workspace) and "
          "fix the issue you are given. Tools: read {path, start_line?, end_line?}, list {path?}, "
          "search {pattern, path?}, edit {path, old, new}, write {path, content}, bash {command}, "
          "submit {}. Read before you edit; keep edits minimal; run the tests that cover the "
          "change; submit when done. Never touch files outside the workspace. ") * 3


def machine() -> str:
    model = ""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next((ln.split(":", 1)[1].strip() for ln in out.splitlines()
                      if ln.startswith("Model name")), "")
    except OSError:
        pass
    return f"{platform.node()} · {model} · {os.cpu_count()} cpu"


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _real_05b() -> Path:
    import importlib.util

    spec = importlib.util.spec_from_file_location("fak_tests_conftest", ROOT / "tests" / "conftest.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod.real_model(mod.MODEL_05B)


# -- routing policy on real replicas --------------------------------------------------------------

def _conversation(url: str, model: str, c: int, turns: int) -> list[dict]:
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Issue {c}: function f{c} in module m{c}.py returns "
                                            f"the wrong value for input {c * 7}. " * 3}]
    out = []
    with httpx.Client(timeout=600) as client:
        for t in range(turns):
            t0 = time.perf_counter()
            ttft = None
            text = ""
            with client.stream("POST", url + "/v1/chat/completions",
                               headers={"X-Fak-Conversation": f"bench/c{c}"},
                               json={"model": model, "messages": messages, "stream": True,
                                     "max_tokens": 8, "temperature": 0}) as r:
                replica = r.headers.get("x-fak-replica", "")
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    delta = json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                    if delta and ttft is None:
                        ttft = time.perf_counter() - t0
                    text += delta
            out.append({"turn": t, "ttft_s": ttft if ttft is not None else time.perf_counter() - t0,
                        "total_s": time.perf_counter() - t0, "replica": replica})
            messages += [{"role": "assistant", "content": text or "ok"},
                         {"role": "user", "content": f"Tool result of turn {t}: "
                                                     + " ".join(f"line{c}_{t}_{k}" for k in range(40))}]
    return out


@pytest.mark.parametrize("policy", ["prefix", "round_robin"])
def test_routing_policy(benchmark, policy):
    from fak.cluster.raycluster import connect
    from fak.cluster.replicas import ReplicaSet, ReplicaSpec
    from fak.cluster.router import create_router_app
    from fak.cluster.routing import Router
    from fak.gateway.server import BackgroundServer

    gguf = Path(os.environ.get("FAK_BENCH_GGUF") or _real_05b())
    n_conv = int(os.environ.get("FAK_BENCH_CONVERSATIONS", "8"))
    turns = int(os.environ.get("FAK_BENCH_TURNS", "4"))
    ray = connect(None, num_cpus=2)
    spec = ReplicaSpec(gguf=str(gguf), backend="cpu", n_ctx=4096, max_concurrency=16,
                       kv_cache_tokens=32768)
    replicas = ReplicaSet(spec, 2, num_cpus=1, host="127.0.0.1").start()
    router = Router(replicas.endpoints(), prefix_aware=policy == "prefix")
    server = BackgroundServer(create_router_app(router, probe_interval_s=0)).start()
    model = next(iter(replicas.infos.values()))["model"]
    try:
        def stats() -> dict[str, dict]:
            return {n: httpx.get(u + "/health").json()["engine"] for n, u in replicas.endpoints()}

        before = stats()

        def run_once():
            with cf.ThreadPoolExecutor(n_conv) as pool:
                return [r for rs in pool.map(lambda c: _conversation(server.url, model, c, turns),
                                             range(n_conv)) for r in rs]

        t0 = time.perf_counter()
        results = benchmark.pedantic(run_once, rounds=1, iterations=1)
        wall = time.perf_counter() - t0
        after = stats()
    finally:
        server.stop()
        replicas.stop()
        ray.shutdown()
    hit = sum(after[n]["native_prefix_cache_hit_tokens"] - before[n]["native_prefix_cache_hit_tokens"]
              for n in after)
    query = sum(after[n]["native_prefix_cache_query_tokens"]
                - before[n]["native_prefix_cache_query_tokens"] for n in after)
    prefill = sum(after[n].get("native_prefill_tokens", 0) - before[n].get("native_prefill_tokens", 0)
                  for n in after)
    ttft = [r["ttft_s"] for r in results]
    later = [r["ttft_s"] for r in results if r["turn"] > 0]
    info = {"provenance": "MEASURED", "machine": machine(), "bench": "routing", "policy": policy,
            "model": gguf.name, "replicas": 2, "conversations": n_conv, "turns": turns,
            "requests": len(results), "prefix_hit_tokens": hit, "prefix_query_tokens": query,
            "prefix_hit_rate": round(hit / query, 4) if query else 0.0, "prefill_tokens": prefill,
            "ttft_p50_s": round(pct(ttft, 0.5), 3), "ttft_p90_s": round(pct(ttft, 0.9), 3),
            "ttft_mean_s": round(statistics.mean(ttft), 3),
            "ttft_later_turns_p50_s": round(pct(later, 0.5), 3),
            "wall_s": round(wall, 2),
            "per_replica_requests": {r["name"]: r["requests"] for r in router.snapshot()["replicas"]}}
    benchmark.extra_info.update(info)
    print(json.dumps(info))


# -- the router at scale, scripted replicas -------------------------------------------------------

def _spawn(argv: list[str], url: str) -> subprocess.Popen:
    proc = subprocess.Popen(argv, env=fak_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(url + "/health", timeout=1)
            return proc
        except httpx.HTTPError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{argv} did not start")
            time.sleep(0.1)


@pytest.fixture(scope="module")
def scripted_cluster(tmp_path_factory):
    script = tmp_path_factory.mktemp("script") / "script.json"
    script.write_text(json.dumps({"*": [{"content": "ok", "usage": {"prompt_tokens": 10,
                                                                      "completion_tokens": 1}}] * 50}))
    procs, urls = [], []
    try:
        for _ in range(2):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            procs.append(_spawn([sys.executable, "-m", "fak.agent.scripted", str(script),
                                 "--port", str(port)], url))
            urls.append(url)
        port = free_port()
        front = f"http://127.0.0.1:{port}"
        procs.append(_spawn(fak_argv("router", *[a for u in urls for a in ("--replica", u)],
                                     "--addr", f"127.0.0.1:{port}", "--log-level", "warning"), front))
        yield {"replicas": urls, "router": front}
    finally:
        for p in procs:
            stop_process(p)


async def _load(targets: list[str], agents: int, per_agent: int) -> tuple[list[float], float, dict]:
    # aiohttp, as the router: httpx's pool costs O(connections) per request and was the bound
    # of the load generator itself at 1,000 agents (py-spy: _assign_requests_to_connections)
    import aiohttp

    latencies: list[float] = []
    errors: dict[str, int] = {}
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=600)) as session:
        async def agent(a: int) -> None:
            url = targets[a % len(targets)] + "/v1/chat/completions"
            messages = [{"role": "system", "content": SYSTEM},
                        {"role": "user", "content": f"agent {a}"}]
            for _ in range(per_agent):
                t0 = time.perf_counter()
                try:
                    async with session.post(url, headers={"X-Fak-Conversation": f"scale/{a}"},
                                            json={"model": "scripted", "messages": messages}) as r:
                        await r.read()
                        status = r.status
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:  # counted: what bounds it
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                    continue
                latencies.append(time.perf_counter() - t0)
                if status != 200:
                    errors[str(status)] = errors.get(str(status), 0) + 1
                messages = messages + [{"role": "assistant", "content": "ok"},
                                       {"role": "user", "content": "next"}]
        t0 = time.perf_counter()
        await asyncio.gather(*(agent(a) for a in range(agents)))
        return latencies, time.perf_counter() - t0, errors


@pytest.mark.parametrize("agents", [1, 100, 1000, 5000])
def test_router_scale(benchmark, scripted_cluster, agents):
    per_agent = max(2, min(100, 1000 // agents))
    direct, direct_wall, direct_err = asyncio.run(_load(scripted_cluster["replicas"], agents, per_agent))
    routed, routed_wall, routed_err = benchmark.pedantic(
        lambda: asyncio.run(_load([scripted_cluster["router"]], agents, per_agent)), rounds=1, iterations=1)
    n = agents * per_agent
    info = {"provenance": "MEASURED", "machine": machine(), "bench": "router_scale",
            "agents": agents, "requests": n, "errors_routed": routed_err, "errors_direct": direct_err,
            "routed_req_s": round(n / routed_wall, 1), "direct_req_s": round(n / direct_wall, 1),
            "routed_p50_ms": round(pct(routed, 0.5) * 1e3, 2),
            "routed_p99_ms": round(pct(routed, 0.99) * 1e3, 2),
            "direct_p50_ms": round(pct(direct, 0.5) * 1e3, 2),
            "direct_p99_ms": round(pct(direct, 0.99) * 1e3, 2),
            "added_p50_ms": round((pct(routed, 0.5) - pct(direct, 0.5)) * 1e3, 2),
            "added_p99_ms": round((pct(routed, 0.99) - pct(direct, 0.99)) * 1e3, 2)}
    benchmark.extra_info.update(info)
    print(json.dumps(info))


# -- the Ray fleet --------------------------------------------------------------------------------

@pytest.mark.parametrize("tasks", [1, 100, 1000, 5000])
def test_ray_scheduler_overhead(benchmark, tasks):
    from fak.cluster.raycluster import connect

    def _noop() -> int:  # defined here: pickled by value (the workers cannot import benches/)
        return 0

    ray = connect(None, num_cpus=2)
    try:
        task = ray.remote(_noop).options(num_cpus=1)
        ray.get(task.remote())  # a worker up before timing

        def run_once():
            t0 = time.perf_counter()
            ray.get([task.remote() for _ in range(tasks)])
            return time.perf_counter() - t0

        wall = benchmark.pedantic(run_once, rounds=1, iterations=1)
    finally:
        ray.shutdown()
    info = {"provenance": "MEASURED", "machine": machine(), "bench": "ray_scheduler",
            "tasks": tasks, "cluster_cpus": 2, "wall_s": round(wall, 3),
            "tasks_per_s": round(tasks / wall, 1),
            "ms_per_task_per_cpu": round(wall * 2 / tasks * 1e3, 3)}
    benchmark.extra_info.update(info)
    print(json.dumps(info))


@pytest.mark.parametrize("kind", ["threads", "ray"])
def test_ray_fleet_overhead(benchmark, kind, tmp_path):
    from tiny import make_instances, tools_script_fix_add

    from fak.agent.scripted import ScriptedServer
    from fak.swebench.fleet import Fleet, RaySettings
    from fak.swebench.instance import FleetConfig

    tiny = make_instances(tmp_path / "tiny")
    rows = [dict(tiny["rows"][0], instance_id=f"fak-test__calc-{i}") for i in range(8)]
    server = ScriptedServer({"*": tools_script_fix_add()}).start()
    ray = None
    try:
        cfg = FleetConfig(gateway=server.url, model="scripted", output=tmp_path / "out", workers=2,
                          repos_dir=tiny["repos"], live=False)
        if kind == "ray":
            from fak.cluster.raycluster import connect

            ray = connect(None, num_cpus=2)
            fleet = Fleet(cfg, rows, ray=RaySettings())
        else:
            fleet = Fleet(cfg, rows)
        t0 = time.perf_counter()
        summary = benchmark.pedantic(fleet.run, rounds=1, iterations=1)
        wall = time.perf_counter() - t0
    finally:
        server.stop()
        if ray is not None:
            ray.shutdown()
    assert summary["n_finished"] == 8
    info = {"provenance": "MEASURED", "machine": machine(), "bench": "fleet", "kind": kind,
            "instances": 8, "workers": 2, "wall_s": round(wall, 2),
            "s_per_instance": round(wall / 8, 3)}
    benchmark.extra_info.update(info)
    print(json.dumps(info))
