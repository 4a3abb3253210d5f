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


class _BoundsCollector(Collector):
    """The service's bounded memory at scrape time: each cache's bytes against its budget, and the
    answers in flight (issue 26), so an operator sees which budget a load fills."""

    def __init__(self, bounds: Callable[[], dict]):
        self.bounds = bounds

    def collect(self) -> Iterator[Metric]:
        b = self.bounds()
        used = GaugeMetricFamily("cropi_cache_bytes", "Bytes held by each in-memory cache", labels=["cache"])
        budget = GaugeMetricFamily("cropi_cache_budget_bytes", "Each cache's budget (its setting)", labels=["cache"])
        entries = GaugeMetricFamily("cropi_cache_entries", "Entries held by each cache", labels=["cache"])
        for name, (n_bytes, n_budget, n_entries) in b["caches"].items():
            used.add_metric([name], n_bytes)
            budget.add_metric([name], n_budget)
            entries.add_metric([name], n_entries)
        yield used
        yield budget
        yield entries
        yield GaugeMetricFamily("cropi_answer_bytes_in_flight", "Bytes of answers made and not yet sent",
                                value=b["answers"]["bytes"])
        yield GaugeMetricFamily("cropi_answers_in_flight", "Answers counted in the ledger",
                                value=b["answers"]["answers"])
        yield GaugeMetricFamily("cropi_batches_waiting", "Gradient batches waiting for a turn", value=b["waiting"])


class Metrics:
    """A registry per app (so several apps in one process, as in tests, do not collide)."""

    def __init__(self, counts: Callable[[], dict[str, int]], scored: Callable[[], int],
                 bounds: Callable[[], dict] | None = None):
        self.registry = CollectorRegistry()
        self.latency = Histogram("cropi_http_request_duration_seconds", "Request latency by route",
                                 ["method", "route", "status"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.registry.register(_JobCollector(counts, scored))
        if bounds is not None:
            self.registry.register(_BoundsCollector(bounds))

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        self.latency.labels(method, route, str(status)).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
