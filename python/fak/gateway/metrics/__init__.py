"""Prometheus metrics of the gateway (``GET /metrics``)."""

from fak.gateway.metrics.collector import GatewayMetrics

__all__ = ["GatewayMetrics"]
