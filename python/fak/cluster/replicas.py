"""``fak serve`` replicas as Ray actors: one engine and its gateway per actor, on a node of the cluster.

Each ``ReplicaServer`` actor loads the GGUF into a ``fak.Engine``, builds the same app as
``fak serve`` (``fak.gateway.app.create_app``: policy, audit log, metrics) and serves it under
uvicorn on a port of its node; the router (``fak.cluster.router``) sends requests there over
HTTP. The actor declares its resources to Ray (``num_cpus``, ``num_gpus``, ``memory``), so Ray
places one replica per GPU or per machine; killing the actor (``ray.kill``, or its node dying)
ends the engine and the server with it. All replicas append to one audit log (``audit_path``,
on a shared path across machines), each record carrying ``"replica": NAME``.

``fak.cluster.raycluster.connect`` starts or joins the Ray cluster; without Ray installed this
module is never imported, so ``fak serve`` without ``--replicas`` works as before.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fak.cluster.raycluster import require_ray

__all__ = ["ReplicaSet", "ReplicaSpec", "ReplicaServer"]


@dataclass(frozen=True)
class ReplicaSpec:
    """What every replica serves: the arguments of ``fak serve`` in engine mode.

    Attributes:
        gguf: the model file (the same path on every node).
        backend, n_ctx, threads, kv_cache_tokens, prefix_cache, max_concurrency, max_queue:
            as ``fak serve`` (``threads`` ``None``: the actor's ``num_cpus``).
        policy_path: the tool-call policy file, or ``None``.
        audit_path: the shared audit log (needs ``policy_path``).
        api_key: required ``Authorization: Bearer`` key, or ``None``.
        model_name: the served model id, or ``None`` (the engine's).
        rope: the long-context keyword arguments of ``fak.Engine`` (``rope_scaling``,
            ``rope_scale``, ``yarn_orig_ctx``, ``sliding_window``; empty: the GGUF's).
        log_level: uvicorn's log level in the actor.
    """

    gguf: str
    backend: str = "auto"
    n_ctx: int = 4096
    threads: int | None = None
    kv_cache_tokens: int | None = None
    prefix_cache: bool = True
    max_concurrency: int = 64
    max_queue: int = 256
    policy_path: str | None = None
    audit_path: str | None = None
    api_key: str | None = None
    model_name: str | None = None
    rope: dict = field(default_factory=dict)
    log_level: str = "warning"


class ReplicaServer:
    """One replica (the body of the Ray actor; also usable in-process).

    Args:
        name: the replica's name (audit records, ``X-Fak-Replica``).
        spec: ``ReplicaSpec`` as a dict (Ray passes plain data).
        host: the address to listen on (default: this node's IP as Ray knows it).

    Raises:
        fak.FakError / OSError / ValueError: the model does not load (the actor dies and the
        error reaches ``ReplicaSet.start``).
    """

    def __init__(self, name: str, spec: dict[str, Any], host: str | None = None) -> None:
        from fak.engine import Engine
        from fak.gateway.app import GatewayConfig, create_app
        from fak.gateway.server import BackgroundServer

        s = ReplicaSpec(**spec)
        self.name = name
        policy = audit = None
        if s.policy_path is not None:
            from fak.policy import AuditLog, Policy

            policy = Policy.load(s.policy_path)
            audit = AuditLog(s.audit_path or "fak-audit.jsonl", replica=name)
        if host is None:
            import ray

            host = ray.util.get_node_ip_address()
        self.engine = Engine(s.gguf, backend=s.backend, n_ctx=s.n_ctx, threads=s.threads,
                             max_batch=s.max_concurrency, kv_cache_tokens=s.kv_cache_tokens,
                             prefix_cache=s.prefix_cache, **s.rope)
        self.audit = audit
        config = GatewayConfig(model_name=s.model_name, api_key=s.api_key,
                               max_concurrency=s.max_concurrency, max_queue=s.max_queue)
        app = create_app(config, engine=self.engine, policy=policy, audit=audit)
        self.server = BackgroundServer(app, host=host, port=0, log_level=s.log_level,
                                       start_timeout=120.0).start()

    def info(self) -> dict[str, Any]:
        """``{"name", "url", "pid", "backend", "model"}`` of this replica."""
        return {"name": self.name, "url": self.server.url, "pid": os.getpid(),
                "backend": getattr(self.engine, "backend", ""),
                "model": getattr(self.engine, "model_name", "")}

    def stop(self) -> None:
        """Stop serving and close the engine and the audit log."""
        self.server.stop()
        self.engine.close()
        if self.audit is not None:
            self.audit.close()


class ReplicaSet:
    """``n`` replica actors of one ``ReplicaSpec`` on the connected Ray cluster.

    ``with ReplicaSet(spec, 2, num_cpus=1) as rs: Router(rs.endpoints())``.

    Args:
        spec: what each replica serves.
        n: how many replicas.
        num_cpus, num_gpus: Ray resources per replica (one GPU each puts one replica per GPU).
        memory_bytes: Ray memory reservation per replica, or ``None``.
        host: the address replicas listen on (``None``: their node's IP; ``"127.0.0.1"`` for
            a cluster on one machine).
        prefix: replica names are ``{prefix}{i}``.

    Raises:
        click-free ``RuntimeError`` from ``start`` when a replica does not come up (its error
        in the message).
    """

    def __init__(self, spec: ReplicaSpec, n: int, *, num_cpus: float = 1, num_gpus: float = 0,
                 memory_bytes: int | None = None, host: str | None = None,
                 prefix: str = "replica-") -> None:
        if n < 1:
            raise ValueError(f"replicas must be >= 1, got {n}")
        self.spec = spec
        self.n = n
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.memory_bytes = memory_bytes
        self.host = host
        self.prefix = prefix
        self.actors: dict[str, Any] = {}
        self.infos: dict[str, dict[str, Any]] = {}

    def start(self) -> ReplicaSet:
        """Create the actors and wait until every one serves (model loaded, port bound)."""
        ray = require_ray()
        spec = asdict(self.spec)
        if spec["threads"] is None and self.spec.backend != "cuda":
            spec["threads"] = max(1, int(self.num_cpus))
        if spec["audit_path"] is not None:
            spec["audit_path"] = str(Path(spec["audit_path"]).resolve())
        options: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus,
                                   "max_restarts": 0, "max_concurrency": 4}
        if self.memory_bytes:
            options["memory"] = self.memory_bytes
        actor_cls = ray.remote(ReplicaServer)
        for i in range(self.n):
            name = f"{self.prefix}{i}"
            self.actors[name] = actor_cls.options(**options).remote(name, spec, self.host)
        try:
            infos = ray.get([a.info.remote() for a in self.actors.values()])
        except Exception as exc:
            self.stop()
            raise RuntimeError(f"a replica did not start: {exc}") from exc
        self.infos = {i["name"]: i for i in infos}
        return self

    def endpoints(self) -> list[tuple[str, str]]:
        """``(name, url)`` of every replica, for ``fak.cluster.routing.Router``."""
        return [(name, info["url"]) for name, info in self.infos.items()]

    def kill(self, name: str) -> None:
        """Kill replica ``name``'s actor at once (its process, engine and server end)."""
        ray = require_ray()
        actor = self.actors.pop(name, None)
        if actor is not None:
            ray.kill(actor, no_restart=True)

    def stop(self) -> None:
        """Stop every replica (cleanly where it answers, else killed)."""
        ray = require_ray()
        for name, actor in list(self.actors.items()):
            try:
                ray.get(actor.stop.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - a dead or stuck replica is killed below
                pass
            ray.kill(actor, no_restart=True)
            del self.actors[name]

    def __enter__(self) -> ReplicaSet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
