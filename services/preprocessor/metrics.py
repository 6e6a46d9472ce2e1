"""The preprocessor's Prometheus metrics, served on its own HTTP port at GET /metrics.

Observed per token-delta message (not per token) and per request; nothing here allocates per
token beyond prometheus-client's own bookkeeping.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from switchyard.protos.messages import GenerateFinished, TokenDelta

_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)
_DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class PreprocessorMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "switchyard_preprocessor_requests",
            "HTTP requests served",
            ["endpoint", "status"],
            registry=r,
        )
        self.ttft = Histogram(
            "switchyard_preprocessor_time_to_first_token_seconds",
            "time from request to first token",
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "switchyard_preprocessor_inter_token_latency_seconds",
            "time between token deltas",
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self.duration = Histogram(
            "switchyard_preprocessor_request_duration_seconds",
            "time from request to last token",
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.input_tokens = Counter(
            "switchyard_preprocessor_input_tokens", "prompt tokens", registry=r
        )
        self.output_tokens = Counter(
            "switchyard_preprocessor_output_tokens", "generated tokens", registry=r
        )
        self.cached_tokens = Counter(
            "switchyard_preprocessor_cached_tokens",
            "prompt tokens the engines found cached",
            registry=r,
        )
        self.migrations = Counter(
            "switchyard_preprocessor_migrations",
            "requests resent to another engine after a fault",
            ["kind"],
            registry=r,
        )
        self.router_fallback = Counter(
            "switchyard_preprocessor_router_fallback",
            "requests routed locally because no router answered",
            registry=r,
        )
        self.internal_errors = Counter(
            "switchyard_preprocessor_internal_errors",
            "requests failed by an unforeseen exception, by stage",
            ["stage"],
            registry=r,
        )
        self.active = Gauge(
            "switchyard_preprocessor_active_requests", "requests being generated", registry=r
        )

    async def observe(
        self, tokens: AsyncIterator[TokenDelta | GenerateFinished], started: float
    ) -> AsyncIterator[TokenDelta | GenerateFinished]:
        """Pass a pipeline stream through, timing it (`started`: time.perf_counter())."""
        now = time.perf_counter
        last = None
        self.active.inc()
        try:
            async for item in tokens:
                t = now()
                if type(item) is TokenDelta:
                    if last is None:
                        self.ttft.observe(t - started)
                    else:
                        self.itl.observe(t - last)
                    last = t
                elif type(item) is GenerateFinished:
                    self.duration.observe(t - started)
                    self.input_tokens.inc(item.prompt_tokens)
                    self.output_tokens.inc(item.completion_tokens)
                    self.cached_tokens.inc(item.cached_tokens)
                yield item
        finally:
            self.active.dec()
            await tokens.aclose()  # type: ignore[attr-defined]
