"""The server's Prometheus metrics (serve stage), in a registry of its own (no global state):
requests by endpoint and status, the engine's queue and active slots, tokens generated,
engine steps, time to first token and inter-token latency as histograms. `/metrics` serves
`exposition()` in Prometheus' text format."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                   30.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    def __init__(self, model: str):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("aotc_requests", "HTTP requests answered, by endpoint and "
                                "status code", ["endpoint", "status"], registry=r)
        self.queue = Gauge("aotc_queue_length", "Requests waiting for a cache slot", registry=r)
        self.active = Gauge("aotc_active_slots", "Cache slots serving a request", registry=r)
        self.tokens = Counter("aotc_generated_tokens", "Tokens generated (rate(): tokens/s)",
                              registry=r)
        self.prompt_tokens = Counter("aotc_prompt_tokens", "Prompt tokens prefilled",
                                     registry=r)
        self.steps = Histogram("aotc_engine_step_seconds", "One engine step (decode of every "
                               "running slot, prefill of new ones)", buckets=LATENCY_BUCKETS,
                               registry=r)
        self.ttft = Histogram("aotc_time_to_first_token_seconds", "From a request's arrival "
                              "to its first token", buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("aotc_inter_token_latency_seconds", "Between a request's "
                             "consecutive tokens", buckets=LATENCY_BUCKETS, registry=r)
        Gauge("aotc_model_info", "The model served", ["model"], registry=r).labels(model).set(1)

    def step(self, seconds: float, events) -> None:
        self.steps.observe(seconds)
        self.tokens.inc(sum(e.token is not None for e in events))

    def gauges(self, queued: int, active: int) -> None:
        self.queue.set(queued)
        self.active.set(active)

    def answered(self, endpoint: str, status: int) -> None:
        self.requests.labels(endpoint, str(status)).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
