"""Prometheus metrics of the reward server, on a registry of its own (several servers may share a process).

HTTP counters and the latency histogram are observed by the edge per request; the executor's numbers
(queue depth, workers, restarts, outcomes by type) are read from `Executor.stats()` at scrape time, so
there is one source of truth and nothing to keep in sync.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class ServerMetrics:
    """What the server counts. `stats()` returns the executor's stats plus the admission numbers."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, stats: Callable[[], dict]):
        self.registry = CollectorRegistry()
        self.requests = Counter("sirius_reward_requests", "HTTP requests by endpoint and status code",
                                ["endpoint", "code"], registry=self.registry)
        self.latency = Histogram("sirius_reward_request_seconds", "HTTP request latency by endpoint",
                                 ["endpoint"], buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.items = Counter("sirius_reward_items", "items answered by endpoint", ["endpoint"],
                             registry=self.registry)
        self.registry.register(_ExecutorCollector(stats))

    def observe(self, endpoint: str, code: int, seconds: float) -> None:
        self.requests.labels(endpoint, str(code)).inc()
        self.latency.labels(endpoint).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _ExecutorCollector:
    def __init__(self, stats: Callable[[], dict]):
        self._stats = stats

    def collect(self):
        s = self._stats()
        yield GaugeMetricFamily("sirius_reward_queue_depth", "items submitted to the workers and not yet answered",
                                value=s["queue_depth"])
        yield GaugeMetricFamily("sirius_reward_admitted_items", "items of accepted requests not yet answered",
                                value=s["admitted_items"])
        yield GaugeMetricFamily("sirius_reward_max_queue_items", "admission limit (beyond it: 429)",
                                value=s["max_queue_items"])
        yield GaugeMetricFamily("sirius_reward_workers", "sandboxed worker processes", value=s["workers"])
        yield CounterMetricFamily("sirius_reward_worker_restarts", "workers replaced after a crash, kill or hang",
                                  value=s["restarts"])
        outcomes = CounterMetricFamily("sirius_reward_outcomes", "executions by outcome type (predictions when "
                                       "scoring)", labels=["status"])
        for status in ("ok", "empty", "error", "timeout", "rejected"):
            outcomes.add_metric([status], s["outcomes"].get(status, 0))
        yield outcomes
