"""Prometheus metrics of one app: request latency by route, jobs by state, prompts scored."""

from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _JobCollector(Collector):
    """Reads the job table at scrape time, so the figures hold across restarts and worker processes."""

    def __init__(self, counts: Callable[[], dict[str, int]], scored: Callable[[], int]):
        self.counts, self.scored = counts, scored

    def collect(self) -> Iterator[Metric]:
        jobs = GaugeMetricFamily("cropi_jobs", "Jobs by state", labels=["state"])
        for state, n in self.counts().items():
            jobs.add_metric([state], n)
        yield jobs
        yield CounterMetricFamily("cropi_prompts_scored", "Pool prompts scored by succeeded scoring jobs",
                                  value=self.scored())


class Metrics:
    """A registry per app (so several apps in one process, as in tests, do not collide)."""

    def __init__(self, counts: Callable[[], dict[str, int]], scored: Callable[[], int]):
        self.registry = CollectorRegistry()
        self.latency = Histogram("cropi_http_request_duration_seconds", "Request latency by route",
                                 ["method", "route", "status"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.registry.register(_JobCollector(counts, scored))

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        self.latency.labels(method, route, str(status)).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
