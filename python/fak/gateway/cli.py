"""``fak serve``: run the OpenAI-compatible gateway over a GGUF model or an upstream server.

Engine mode: ``fak serve --gguf MODEL.gguf``. Proxy mode: ``fak serve --base-url URL``.
``--policy FILE`` adjudicates every tool call; ``--policy FILE --policy-check`` only validates the
file (prints ``OK`` or each error, exits 0/1). See ``docs/gateway.md``.
"""

from __future__ import annotations

import errno
import logging
import sys
from pathlib import Path
from typing import Any

import click

from fak.hub.cli import GGUF_PATH
from fak.rope_options import rope_click_options, rope_kwargs

__all__ = ["serve"]

DEFAULT_AUDIT_LOG = "fak-audit.jsonl"


def _load_policy(policy_path: Path | None, audit_path: Path | None,
                 replica_name: str | None = None) -> tuple[Any, Any]:
    if policy_path is None:
        if audit_path is not None:
            raise click.UsageError("--audit-log records policy decisions: it needs --policy.")
        return None, None
    from fak.policy import AuditLog, Policy, PolicyError

    try:
        policy = Policy.load(policy_path)
    except PolicyError as exc:
        raise click.ClickException(f"invalid policy {policy_path}: {exc}") from None
    audit = AuditLog(audit_path or Path(DEFAULT_AUDIT_LOG), replica=replica_name)
    return policy, audit


def _load_engine(gguf: Path, backend: str, n_ctx: int, threads: int | None, max_batch: int,
                 kv_cache_tokens: int | None, prefix_cache: bool = True, tensor_parallel: int = 1,
                 **rope: Any) -> Any:
    from fak.engine import Engine
    from fak.errors import FakError

    try:
        return Engine(str(gguf), backend=backend, n_ctx=n_ctx, threads=threads, max_batch=max_batch,
                      kv_cache_tokens=kv_cache_tokens, prefix_cache=prefix_cache,
                      tensor_parallel=tensor_parallel, **rope)
    except (FakError, OSError, ValueError) as exc:
        raise click.ClickException(f"could not load {gguf}: {exc}") from None


def _plan_context(gguf: Path, **kwargs: Any) -> Any:
    """``fak.gateway.context_window.plan_context`` with its errors as click's."""
    from fak.errors import FakError
    from fak.gateway.context_window import ContextPlanError, plan_context

    try:
        return plan_context(gguf, **kwargs)
    except ContextPlanError as exc:
        raise click.ClickException(str(exc)) from None
    except (FakError, OSError) as exc:
        raise click.ClickException(f"could not read {gguf}: {exc}") from None


@click.command("serve")
@click.option("--gguf", type=GGUF_PATH,
              help="GGUF model to serve (engine mode): a path, or hf://ORG/NAME/FILE.gguf (pulled first).")
@click.option("--engine", "engine_kind", type=click.Choice(["inkernel"]), default="inkernel", show_default=True,
              help="Inference engine: fak's own (the only one).")
@click.option("--backend", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Compute backend; 'cuda' fails loudly without a GPU.")
@click.option("--addr", default="127.0.0.1:8080", show_default=True, help="HOST:PORT to listen on.")
@click.option("--policy", "policy_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Tool-call policy file (JSON); every tool call is adjudicated.")
@click.option("--policy-check", is_flag=True, help="Validate --policy, print OK or the errors, exit 0/1.")
@click.option("--audit-log", "audit_path", type=click.Path(dir_okay=False, path_type=Path),
              help=f"JSONL audit log of policy decisions [default with --policy: ./{DEFAULT_AUDIT_LOG}].")
@click.option("--api-key", envvar="FAK_API_KEY", help="Require 'Authorization: Bearer KEY' on /v1 (env FAK_API_KEY).")
@click.option("--max-concurrency", type=click.IntRange(min=1), default=64, show_default=True,
              help="Requests generating at once.")
@click.option("--max-queue", type=click.IntRange(min=0), default=256, show_default=True,
              help="Requests queued in the engine beyond --max-concurrency; past both, 429.")
@click.option("--n-ctx", type=click.IntRange(min=16), default=None,
              help="Context window in tokens [default: the model's trained context, capped by what the "
                   "KV-memory budget holds; printed at start, /v1/models max_model_len].")
@click.option("--kv-memory", "kv_memory", default=None, metavar="SIZE",
              help="KV-cache memory budget that sizes the default context window and KV cache (8GiB, "
                   "512MiB) [default: CUDA 90%% of the GPU less the weights and 1 GiB; CPU half of "
                   "MemAvailable less the weights].")
@rope_click_options
@click.option("--threads", type=click.IntRange(min=1), default=None, help="CPU threads of the engine.")
@click.option("--kv-cache-tokens", type=click.IntRange(min=16), default=None,
              help="KV cache size in tokens, shared by all sequences [default: the engine's, n_ctx x min(8, batch)].")
@click.option("--tensor-parallel", type=click.IntRange(min=1), default=1, show_default=True,
              help="Split the model into N tensor-parallel shards (attention heads, FFN columns, vocabulary; "
                   "docs/tensor-parallel.md). CPU backend: N shards on threads sharing --threads. Multi-GPU "
                   "(NCCL) is not built: with --backend cuda, N > 1 fails.")
@click.option("--speculative", default=None, metavar="none|ngram[:K]|suffix[:K]|draft[:K]",
              help="Speculative decoding of requests that do not ask otherwise (docs/speculative.md): drafts "
                   "of at most K tokens (default 4) from each sequence's own prompt and output, verified in "
                   "one forward; the same output. A request's 'speculative' field overrides it.")
@click.option("--draft-model", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              metavar="FILE",
              help="A smaller GGUF model with the same tokenizer (Qwen2.5-Coder-0.5B for the 1.5B) that drafts "
                   "tokens for speculative decoding in the same engine (docs/speculative.md); --speculative "
                   "defaults to draft with it.")
@click.option("--speculative-max-batch", type=click.IntRange(min=0), default=8, show_default=True, metavar="N",
              help="Speculation's off-switch: a step with more than N decoding sequences drafts nothing (its "
                   "verification rows would cost more than the forwards they save). Each sequence's draft "
                   "length also adapts to its recent acceptance within K.")
@click.option("--state-checkpoints", type=click.IntRange(min=0), default=None, metavar="N",
              help="A hybrid model's (Qwen3.5/3.6) checkpoints of recurrent state for the prefix cache: a prompt "
                   "resumes from the cache only up to a block whose state is checkpointed (docs/hybrid.md) "
                   "[default: the engine's, 8]. Each takes one sequence's state (63 MiB for Qwen3.6-35B-A3B), "
                   "counted in the KV memory. No effect on dense models.")
@click.option("--prefix-cache/--no-prefix-cache", default=True, show_default=True,
              help="Automatic prefix caching: reuse the KV cache of a shared prompt prefix (system prompt, earlier turns).")
@click.option("--tool-call-retries", type=click.IntRange(min=0), default=2, show_default=True,
              help="Extra samples of a forced tool call (tool_choice required or named) that does not fit its "
                   "tool's schema, before its text is returned as content.")
@click.option("--tool-call-format", type=click.Choice(["auto", "hermes", "qwen3_xml"]), default="auto",
              show_default=True,
              help="The form the model writes tool calls in: auto reads it from the chat template "
                   "(Qwen3-Coder's <function=...><parameter=...> XML form, else the <tool_call> JSON form).")
@click.option("--serve-inline-reads", is_flag=True,
              help="Answer a repeated read-only tool call (read/list/search, read-only bash) from the "
                   "conversation's earlier result and let the model continue (needs X-Fak-Conversation).")
@click.option("--model-name", help="Model id clients send and /v1/models lists [default: the engine's].")
@click.option("--model-alias", "model_aliases", multiple=True, metavar="NAME",
              help="Another model id served as --model-name (repeatable), for agents that ask for their vendor's "
                   "models (Claude Code's claude-...); '*' accepts any id.")
@click.option("--base-url", help="Upstream OpenAI base URL (…/v1): proxy mode instead of --gguf.")
@click.option("--upstream-key", envvar="FAK_UPSTREAM_KEY", help="API key for the upstream (env FAK_UPSTREAM_KEY).")
@click.option("--replica-name", help="This server's name in each audit record (a replica behind fak router).")
@click.option("--replicas", type=click.IntRange(min=1), default=1, show_default=True,
              help="Serve --gguf from this many replicas (Ray actors) behind a prefix-aware router on "
                   "--addr (needs Ray: pip install 'fak[ray]'; docs/cluster.md).")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None,
              help="The Ray cluster of the replicas: ADDRESS (auto, ray://host:10001), or no value for "
                   "a local cluster on this machine.")
@click.option("--replica-cpus", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="CPUs Ray reserves per replica (its engine threads with --backend cpu).")
@click.option("--replica-gpus", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="GPUs Ray reserves per replica (1: one replica per GPU).")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]),
              default="info", show_default=True)
def serve(gguf: Path | None, engine_kind: str, backend: str, addr: str, policy_path: Path | None,
          policy_check: bool, audit_path: Path | None, api_key: str | None, max_concurrency: int,
          max_queue: int, n_ctx: int | None, threads: int | None, kv_cache_tokens: int | None,
          prefix_cache: bool, tool_call_retries: int, model_name: str | None, base_url: str | None,
          upstream_key: str | None, log_level: str, serve_inline_reads: bool = False,
          rope_scaling: str | None = None, rope_scale: float | None = None,
          yarn_orig_ctx: int | None = None, sliding_window: int | None = None,
          replica_name: str | None = None, replicas: int = 1,
          ray_address: str | None = None, replica_cpus: float = 1.0,
          replica_gpus: float = 0.0, tensor_parallel: int = 1, tool_call_format: str = "auto",
          cpu_moe: bool = False, n_cpu_moe: int | None = None, model_aliases: tuple[str, ...] = (),
          kv_memory: str | None = None, speculative: str | None = None,
          draft_model: Path | None = None, speculative_max_batch: int = 8,
          state_checkpoints: int | None = None) -> None:
    """Serve OpenAI's API (chat, completions, responses, models) and Anthropic's messages, with a tool-call policy."""
    if policy_check:
        if policy_path is None:
            raise click.UsageError("--policy-check needs --policy FILE.")
        from fak.policy import check_main

        sys.exit(check_main(policy_path))
    if (gguf is None) == (base_url is None):
        raise click.UsageError("give exactly one of --gguf MODEL (engine mode) or --base-url URL (proxy mode).")
    if upstream_key and base_url is None:
        raise click.UsageError("--upstream-key only applies with --base-url.")
    if speculative is not None:
        from fak import _native

        problem = _native.check_sampling({"speculative": speculative})
        if problem is not None:
            raise click.BadParameter(problem[1], param_hint="--speculative")
    if draft_model is not None and base_url is not None:
        raise click.UsageError("--draft-model drafts for the engine's model: it needs --gguf.")
    if draft_model is not None and tensor_parallel > 1:
        raise click.UsageError("--draft-model does not run with --tensor-parallel (speculative decoding is off "
                               "for tensor parallelism).")
    if tensor_parallel > 1 and backend == "cuda":
        raise click.UsageError(f"--tensor-parallel {tensor_parallel} with --backend cuda: multi-GPU tensor "
                               "parallelism (NCCL) is not built in this fak; it runs on --backend cpu only "
                               "(docs/tensor-parallel.md).")
    kv_memory_bytes = None
    if kv_memory is not None:
        from fak.gateway.context_window import parse_size

        try:
            kv_memory_bytes = parse_size(kv_memory)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--kv-memory") from None
        if base_url is not None:
            raise click.UsageError("--kv-memory sizes the engine's KV cache: it needs --gguf.")

    def plan() -> Any:
        assert gguf is not None
        return _plan_context(gguf, backend=backend, max_concurrency=max_concurrency, n_ctx=n_ctx,
                             kv_cache_tokens=kv_cache_tokens, kv_memory=kv_memory_bytes, replicas=replicas,
                             rope_scaling=rope_scaling, rope_scale=rope_scale, yarn_orig_ctx=yarn_orig_ctx,
                             state_checkpoints=state_checkpoints if prefix_cache else 0)
    if replicas > 1 or ray_address is not None:
        if gguf is None:
            raise click.UsageError("--replicas and --ray serve a --gguf model (engine mode).")
        if serve_inline_reads or replica_name:
            raise click.UsageError("--serve-inline-reads and --replica-name apply to one server, "
                                   "not to --replicas.")
        if tensor_parallel > 1:
            raise click.UsageError("--tensor-parallel applies to one server's engine, not to --replicas.")
        if tool_call_format != "auto":
            raise click.UsageError("--tool-call-format applies to one server; the replicas read the form "
                                   "from the model's chat template.")
        from fak.cluster.cli import serve_replicas

        context = plan()
        click.echo(f"fak serve: {context.describe()} per replica", err=True)

        return serve_replicas(gguf=gguf, n=replicas, ray_address=ray_address, addr=addr,
                              backend=backend, n_ctx=context.n_ctx, threads=threads,
                              kv_cache_tokens=context.kv_cache_tokens, prefix_cache=prefix_cache,
                              max_concurrency=max_concurrency, max_queue=max_queue,
                              policy_path=policy_path, audit_path=audit_path, api_key=api_key,
                              model_name=model_name, replica_cpus=replica_cpus,
                              replica_gpus=replica_gpus, log_level=log_level,
                              rope={**rope_kwargs(rope_scaling, rope_scale, yarn_orig_ctx, sliding_window, cpu_moe, n_cpu_moe),
                                    **({"speculative": speculative} if speculative else {}),
                                    **({"draft_model": str(draft_model)} if draft_model else {}),
                                    **({"speculative_max_batch": speculative_max_batch} if speculative_max_batch != 8 else {}),
                                    **({"state_checkpoints": state_checkpoints} if state_checkpoints is not None else {})})

    from fak.gateway.app import GatewayConfig, create_app
    from fak.gateway.proxy import Upstream
    from fak.gateway.server import bind, parse_addr, serve_forever

    try:
        host, port = parse_addr(addr)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--addr") from None
    try:  # bound before the model loads: a busy port fails at once, and nothing says "serving" before
        sock = bind(host, port)
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {addr}: {exc.strerror or exc}"
                                   + (" (another server is using that port; pick another with --addr)"
                                      if exc.errno == errno.EADDRINUSE else "")) from None
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    policy, audit = _load_policy(policy_path, audit_path, replica_name)
    config = GatewayConfig(model_name=model_name, api_key=api_key, max_concurrency=max_concurrency,
                           max_queue=max_queue, tool_call_retries=tool_call_retries,
                           serve_inline_reads=serve_inline_reads, tool_call_format=tool_call_format,
                           model_aliases=tuple(model_aliases))
    engine = None
    if gguf is not None:
        rope = rope_kwargs(rope_scaling, rope_scale, yarn_orig_ctx, sliding_window, cpu_moe, n_cpu_moe)
        if speculative:
            rope["speculative"] = speculative
        if draft_model is not None:
            rope["draft_model"] = str(draft_model)
        if speculative_max_batch != 8:
            rope["speculative_max_batch"] = speculative_max_batch
        if state_checkpoints is not None:
            rope["state_checkpoints"] = state_checkpoints
        context = plan()
        click.echo(f"fak serve: {context.describe()}", err=True)
        engine = _load_engine(gguf, backend, context.n_ctx, threads, max_batch=max_concurrency,
                              kv_cache_tokens=context.kv_cache_tokens, prefix_cache=prefix_cache,
                              tensor_parallel=tensor_parallel, **rope)
        app = create_app(config, engine=engine, policy=policy, audit=audit)
        what = f"{app.state.gateway.model_name} ({gguf.name}, backend {getattr(engine, 'backend', backend)}"
        what += f", {tensor_parallel} tensor-parallel shards" if tensor_parallel > 1 else ""
        what += f", tool calls {app.state.gateway.tool_call_format.value})"
    else:
        assert base_url is not None
        app = create_app(config, upstream=Upstream(base_url, upstream_key), policy=policy, audit=audit)
        what = f"proxy to {base_url}"
    click.echo(f"fak serve: {what} on http://{addr}/v1"
               + (f", policy {policy_path}" if policy_path else ", no policy"), err=True)
    try:
        serve_forever(app, addr, log_level=log_level, sock=sock)
    finally:
        if engine is not None:
            engine.close()
        if audit is not None:
            audit.close()
