"""The preprocessor's Prometheus metrics, served on its HTTP port at GET /metrics.

Latency histograms are LoopHistograms (no lock per observation): the inter-token latency is
observed per token-delta batch on the per-token path; everything else once per request, in
the `finish` stage. `stage_seconds` is filled only with --stage-timing (a benchmark mode).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from switchyard.common.loop_histogram import LoopHistogram

_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)
_DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_STAGE_BUCKETS = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1)


class PreprocessorMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "switchyard_preprocessor_requests",
            "HTTP requests served",
            ["endpoint", "status"],
            registry=r,
        )
        self.ttft = LoopHistogram(
            "switchyard_preprocessor_time_to_first_token_seconds",
            "time from request to first token",
            _TTFT_BUCKETS,
            registry=r,
        )
        self.itl = LoopHistogram(
            "switchyard_preprocessor_inter_token_latency_seconds",
            "time between token deltas",
            _ITL_BUCKETS,
            registry=r,
        )
        self.duration = LoopHistogram(
            "switchyard_preprocessor_request_duration_seconds",
            "time from request to last token",
            _DURATION_BUCKETS,
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
        self.stage_seconds = LoopHistogram(
            "switchyard_preprocessor_stage_seconds",
            "time spent in each request stage on the event loop (--stage-timing only)",
            _STAGE_BUCKETS,
            ["stage"],
            registry=r,
        )
