"""The gateway's Prometheus metrics, one registry per app.

Counters and histograms are updated by the serving code; gauges of the engine (batch size, KV
cache use) and the requests in flight are read at scrape time by a collector, so
they are exact at the moment of the scrape. Names follow Prometheus conventions (``_total`` on
counters, ``_seconds`` on durations) and vLLM's choice of metrics (time to first token, time per
output token, KV cache usage).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["KNOWN_ENDPOINTS", "GatewayMetrics"]

# `*_created` timestamp series double the exposition size and no dashboard uses them.
disable_created_metrics()

KNOWN_ENDPOINTS = frozenset({
    "/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens", "/v1/responses",
    "/v1/responses/{response_id:str}", "/v1/models", "/v1/models/{model_id:path}", "/v1/fak/quarantine", "/health",
    "/metrics", "/schema/openapi.json",
})

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                 7.5, 10.0, 20.0, 40.0, 80.0)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                 0.75, 1.0, 2.5)
_E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0, 600.0)


class _StateCollector(Collector):
    """Scrape-time gauges from ``engine.stats()`` and the requests in flight."""

    def __init__(self, engine_stats: Callable[[], dict[str, Any]] | None,
                 in_flight: Callable[[], int] | None) -> None:
        self.engine_stats = engine_stats
        self.in_flight = in_flight

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        if self.in_flight is not None:
            yield GaugeMetricFamily("fak_requests_running", "Requests in flight: admitted, running or queued in the "
                                    "engine core (fak_engine_batch_size / fak_engine_waiting split them).",
                                    value=self.in_flight())
        if self.engine_stats is None:
            return
        try:
            stats = self.engine_stats()
        except Exception:  # noqa: BLE001 - a failing engine must not break the scrape
            return
        def num(key: str) -> float:
            value = stats.get(key)
            return float(value) if isinstance(value, (int, float)) else 0.0
        used, total = num("kv_blocks_used"), num("kv_blocks_total")
        yield GaugeMetricFamily("fak_engine_batch_size", "Sequences running in the engine (decode batch size).",
                                value=num("running"))
        yield GaugeMetricFamily("fak_engine_waiting", "Sequences waiting in the engine.", value=num("waiting"))
        yield GaugeMetricFamily("fak_kv_cache_blocks_used", "KV cache blocks in use.", value=used)
        yield GaugeMetricFamily("fak_kv_cache_blocks_total", "KV cache blocks in the pool.", value=total)
        yield GaugeMetricFamily("fak_kv_cache_usage_ratio", "Fraction of KV cache blocks in use (0..1).",
                                value=used / total if total else 0.0)
        # Prefix cache (vLLM's prefix_cache_queries / prefix_cache_hits, in tokens).
        yield CounterMetricFamily("fak_prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                                  value=num("native_prefix_cache_query_tokens"))
        yield CounterMetricFamily("fak_prefix_cache_hits", "Prompt tokens found in the prefix cache (prefill skipped).",
                                  value=num("native_prefix_cache_hit_tokens"))
        yield GaugeMetricFamily("fak_prefix_cache_blocks", "KV cache blocks holding cached prefixes (in use or evictable).",
                                value=num("native_prefix_cache_blocks"))
        # Speculative decoding (vLLM's spec_decode_num_draft_tokens / _accepted_tokens / _drafts).
        yield CounterMetricFamily("fak_spec_decode_drafts", "Verification steps: a sequence's step with a draft.",
                                  value=num("native_spec_steps"))
        yield CounterMetricFamily("fak_spec_decode_draft_tokens", "Draft tokens verified by the target model.",
                                  value=num("native_spec_draft_tokens"))
        yield CounterMetricFamily("fak_spec_decode_accepted_tokens", "Draft tokens accepted (emitted as drafted).",
                                  value=num("native_spec_accepted_tokens"))
        yield CounterMetricFamily("fak_spec_decode_draft_model_forwards",
                                  "Forwards of the draft model (--draft-model) proposing draft tokens.",
                                  value=num("native_spec_draft_forwards"))

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())


class GatewayMetrics:
    """All metrics of one gateway app in their own ``CollectorRegistry``.

    Args:
        engine_stats: ``engine.stats`` (engine mode) or ``None`` (proxy mode).
        in_flight: callable returning the requests in flight (``Admission.in_flight``).
    """

    def __init__(self, engine_stats: Callable[[], dict[str, Any]] | None = None,
                 in_flight: Callable[[], int] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.requests = Counter("fak_requests", "HTTP requests by endpoint and status code.",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("fak_prompt_tokens", "Prompt tokens submitted to the engine.", registry=r)
        self.completion_tokens = Counter("fak_completion_tokens", "Tokens generated by the engine.", registry=r)
        self.ttft = Histogram("fak_time_to_first_token_seconds",
                              "From request arrival to the first generated token.", buckets=_TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("fak_time_per_output_token_seconds",
                              "Mean time between generated tokens of one request.", buckets=_TPOT_BUCKETS, registry=r)
        self.e2e = Histogram("fak_request_latency_seconds", "From arrival to the end of the response.",
                             buckets=_E2E_BUCKETS, registry=r)
        self.cancelled = Counter("fak_requests_cancelled",
                                 "Generations ended before they finished (client disconnect or error).", registry=r)
        self.rejected = Counter("fak_requests_rejected",
                                "Requests refused before their first token, by reason (the error code: "
                                "rate_limit_exceeded, context_length_exceeded, kv_cache_full, invalid_value, "
                                "engine_error).", ["reason"], registry=r)
        self.tool_calls_rejected = Counter("fak_tool_calls_rejected",
                                           "Proposed tool calls that did not fit the offered tools, by reason "
                                           "(unknown_tool, invalid_json, schema, malformed).", ["reason"], registry=r)
        self.tool_call_retries = Counter("fak_tool_call_retries",
                                         "Forced tool calls sampled again because the first did not fit.", registry=r)
        self.policy_verdicts = Counter("fak_policy_verdicts", "Tool-call policy decisions by tool and verdict.",
                                       ["tool", "verdict"], registry=r)
        r.register(_StateCollector(engine_stats, in_flight))

    def count_request(self, path: str, status: int) -> None:
        """Count one finished HTTP response (unknown paths are counted as ``other``)."""
        self.requests.labels(path if path in KNOWN_ENDPOINTS else "other", str(status)).inc()

    def count_rejected(self, reason: str) -> None:
        """Count one request refused before its first token."""
        self.rejected.labels(reason).inc()

    def count_tool_call_rejected(self, problem: Any) -> None:
        """Count one proposed call that did not fit the offered tools (a ``CallProblem``)."""
        self.tool_calls_rejected.labels(str(getattr(problem, "kind", problem))).inc()

    def count_tool_call_retry(self) -> None:
        """Count one more attempt at a forced tool call."""
        self.tool_call_retries.inc()

    def count_verdict(self, tool: str, allowed: bool) -> None:
        """Count one policy decision."""
        self.policy_verdicts.labels(tool, "allow" if allowed else "deny").inc()

    def render(self) -> bytes:
        """The registry in Prometheus text exposition format 0.0.4."""
        return generate_latest(self.registry)
