"""``fak router`` (a router in front of running servers) and ``fak serve --replicas N`` (replicas
as Ray actors behind the router). See ``docs/cluster.md``."""

from __future__ import annotations

import errno
import logging
from pathlib import Path
from typing import Any

import click

__all__ = ["router_cmd", "serve_replicas"]


def _bind(addr: str) -> Any:
    from fak.gateway.server import bind, parse_addr

    try:
        host, port = parse_addr(addr)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--addr") from None
    try:
        return bind(host, port)
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {addr}: {exc.strerror or exc}"
                                   + (" (another server is using that port; pick another with --addr)"
                                      if exc.errno == errno.EADDRINUSE else "")) from None


def _serve_router(endpoints: list[tuple[str, str]], addr: str, sock: Any, log_level: str,
                  policy: str) -> None:
    from fak.cluster.router import create_router_app
    from fak.cluster.routing import Router
    from fak.gateway.server import serve_forever

    router = Router(endpoints, prefix_aware=policy == "prefix")
    app = create_router_app(router)
    click.echo(f"fak router: {len(endpoints)} replica(s) ({', '.join(n for n, _ in endpoints)}) "
               f"on http://{addr}/v1, routing {policy}", err=True)
    serve_forever(app, addr, log_level=log_level, sock=sock)


@click.command("router")
@click.option("--replica", "replicas", multiple=True, required=True,
              help="A replica's URL (http://host:port), or NAME=URL; give it once per replica.")
@click.option("--addr", default="127.0.0.1:8080", show_default=True, help="HOST:PORT to listen on.")
@click.option("--routing", type=click.Choice(["prefix", "round-robin"]), default="prefix",
              show_default=True, help="prefix: conversation, then longest cached prefix, then "
              "least loaded; round-robin: in turn.")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]),
              default="info", show_default=True)
def router_cmd(replicas: tuple[str, ...], addr: str, routing: str, log_level: str) -> None:
    """One OpenAI endpoint in front of running fak serve replicas (no Ray needed)."""
    endpoints = []
    for i, spec in enumerate(replicas):
        name, sep, url = spec.partition("=")
        if not sep:
            name, url = f"replica-{i}", spec
        if not url.startswith(("http://", "https://")):
            url = "http://" + url
        endpoints.append((name, url.removesuffix("/v1").rstrip("/")))
    sock = _bind(addr)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        _serve_router(endpoints, addr, sock, log_level, routing)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def serve_replicas(*, gguf: Path, n: int, ray_address: str | None, addr: str, backend: str,
                   n_ctx: int, threads: int | None, kv_cache_tokens: int | None,
                   prefix_cache: bool, max_concurrency: int, max_queue: int,
                   policy_path: Path | None, audit_path: Path | None, api_key: str | None,
                   model_name: str | None, replica_cpus: float, replica_gpus: float,
                   log_level: str, rope: dict | None = None) -> None:
    """``fak serve --replicas N``: ``n`` replica actors on the Ray cluster at ``ray_address``
    (``None``: a local one), the router on ``addr`` in this process, until interrupted."""
    from fak.cluster.raycluster import RayMissing, connect
    from fak.cluster.replicas import ReplicaSet, ReplicaSpec

    sock = _bind(addr)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    local = ray_address in (None, "", "local")
    try:
        ray = connect(ray_address, num_cpus=int(max(1, replica_cpus) * n) if local else None)
    except RayMissing as exc:
        raise click.ClickException(str(exc)) from None
    spec = ReplicaSpec(gguf=str(gguf.resolve()), backend=backend, n_ctx=n_ctx, threads=threads,
                       kv_cache_tokens=kv_cache_tokens, prefix_cache=prefix_cache,
                       max_concurrency=max_concurrency, max_queue=max_queue,
                       policy_path=str(policy_path.resolve()) if policy_path else None,
                       audit_path=str((audit_path or Path("fak-audit.jsonl")).resolve())
                       if policy_path else None,
                       api_key=api_key, model_name=model_name, rope=dict(rope or {}))
    click.echo(f"fak serve: starting {n} replica(s) of {gguf.name} on Ray "
               f"({'local cluster' if local else ray_address}; {replica_cpus:g} CPU"
               f"{f', {replica_gpus:g} GPU' if replica_gpus else ''} each) ...", err=True)
    replicas = ReplicaSet(spec, n, num_cpus=replica_cpus, num_gpus=replica_gpus,
                          host="127.0.0.1" if local else None)
    try:
        replicas.start()
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        for name, info in replicas.infos.items():
            click.echo(f"  {name}: {info['url']} (pid {info['pid']}, backend {info['backend']})", err=True)
        if spec.audit_path:
            click.echo(f"  policy {policy_path}, one audit log {spec.audit_path}", err=True)
        _serve_router(replicas.endpoints(), addr, sock, log_level, "prefix")
    finally:
        replicas.stop()
        if local:
            ray.shutdown()
