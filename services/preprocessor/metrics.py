"""The preprocessor's Prometheus metrics, served on its HTTP port at GET /metrics.

Label sets are fixed (docs/operating.md's metrics table): `model` is a model some engine serves (""
for a request that named none: an unknown model or a body that did not parse), `endpoint`
one of the API's routes, `status` an HTTP status, `code` one of the stable error codes,
`kind` one of the engine fault kinds, `outcome` one of PREDICTION_OUTCOMES. Nothing takes a
value from the client unchecked, so the series stay bounded.

Latency histograms are LoopHistograms (no lock per observation): the inter-token latency is
observed per token-delta batch on the per-token path (the request's series is looked up once
per request); everything else once per request, in the `finish` stage. The counters every
request adds to (requests, tokens, KV predictions) are LoopCounters (no lock either).
`stage_seconds` is filled only with --stage-timing (a benchmark mode).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prometheus_client import Counter, Gauge

from switchyard.common.loop_counter import LoopCounter
from switchyard.common.loop_histogram import LoopHistogram
from switchyard.common.metrics import service_registry
from switchyard.common.replicas import ReplicaSet

_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)
_DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# 10 us to 1 s, six buckets a decade (x1.47): bench/stages.py reads the route stage's p50/p99
# from them (stage timing is a benchmark mode, so the finer buckets cost nothing in service).
_FLOW_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_STAGE_BUCKETS = tuple(round(10 ** (e / 6 - 5), 9) for e in range(31))

# The router's KV prediction against what the engine reported cached: within a block
# ("exact"), more predicted than cached ("over": the index was stale or optimistic), less
# ("under": the engine had more than the index knew).
PREDICTION_OUTCOMES = ("exact", "over", "under")


class PreprocessorMetrics:
    def __init__(self) -> None:
        r = self.registry = service_registry("preprocessor")
        self.requests = LoopCounter(
            "switchyard_preprocessor_requests",
            "API requests answered, by endpoint, model and HTTP status (499: the client left)",
            registry=r,
            labelnames=["endpoint", "model", "status"],
        )
        self.errors = Counter(
            "switchyard_preprocessor_errors",
            "failed requests by error code (in a stream too)",
            ["model", "code"],
            registry=r,
        )
        self.ttft = LoopHistogram(
            "switchyard_preprocessor_time_to_first_token_seconds",
            "time from request to first token",
            _TTFT_BUCKETS,
            ["model"],
            registry=r,
        )
        self.itl = LoopHistogram(
            "switchyard_preprocessor_inter_token_latency_seconds",
            "time between token deltas",
            _ITL_BUCKETS,
            ["model"],
            registry=r,
        )
        self.duration = LoopHistogram(
            "switchyard_preprocessor_request_duration_seconds",
            "time from request to last token",
            _DURATION_BUCKETS,
            ["model"],
            registry=r,
        )
        self.input_tokens = LoopCounter(
            "switchyard_preprocessor_input_tokens",
            "prompt tokens",
            registry=r,
            labelnames=["model"],
        )
        self.output_tokens = LoopCounter(
            "switchyard_preprocessor_output_tokens",
            "generated tokens",
            registry=r,
            labelnames=["model"],
        )
        self.cached_tokens = LoopCounter(
            "switchyard_preprocessor_cached_tokens",
            "prompt tokens the engines reported cached",
            registry=r,
            labelnames=["model"],
        )
        self.predicted_cached_tokens = LoopCounter(
            "switchyard_preprocessor_predicted_cached_tokens",
            "prompt tokens the KV router predicted cached on the worker it chose",
            registry=r,
            labelnames=["model"],
        )
        self.routed_prompt_tokens = LoopCounter(
            "switchyard_preprocessor_kv_routed_prompt_tokens",
            "prompt tokens of the generations the KV router placed (the two above's base)",
            registry=r,
            labelnames=["model"],
        )
        self.predictions = LoopCounter(
            "switchyard_preprocessor_route_predictions",
            "KV routing decisions by how the predicted cached prefix compared with the "
            "engine's report (exact: within one block)",
            registry=r,
            labelnames=["model", "outcome"],
        )
        self.migrations = Counter(
            "switchyard_preprocessor_migrations",
            "requests resent to another engine after a fault",
            ["model", "kind"],
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
        self.taken_over = Counter(
            "switchyard_preprocessor_connections_taken_over",
            "connections accepted from a sibling replica's socket, where they had waited past "
            "the standby grace (the sibling dead, restarting, frozen or busy)",
            registry=r,
        )
        # Flow control (--flow-config); `priority` and `flow` are the file's names (bounded:
        # switchyard.common.flow.config), `reason` one of the gate's.
        self.flow_wait = LoopHistogram(
            "switchyard_preprocessor_flow_wait_seconds",
            "time admitted requests waited for the flow gate, its round trip included",
            _FLOW_WAIT_BUCKETS,
            ["priority", "flow"],
            registry=r,
        )
        self.flow_refused = Counter(
            "switchyard_preprocessor_flow_refused",
            "requests the flow gate refused (queue_full, queue_timeout, flow_limit, "
            "ttft_objective)",
            ["priority", "flow", "reason"],
            registry=r,
        )
        self._by_model: dict[str, _ModelSeries] = {}  # models are bounded (see above)
        self.stage_seconds = LoopHistogram(
            "switchyard_preprocessor_stage_seconds",
            "time spent in each request stage on the event loop (--stage-timing only)",
            _STAGE_BUCKETS,
            ["stage"],
            registry=r,
        )

    def answered(self, endpoint: str, model: str, status: int) -> None:
        """A request answered (requests_total; endpoints, models and statuses are bounded)."""
        self.requests.inc_labels((endpoint, model, str(status)))

    def internal_error(self, stage: str) -> None:
        """A request failed by an unforeseen exception (a bug) in `stage`."""
        self.internal_errors.labels(stage).inc()

    def finished(
        self,
        model: str,
        duration: float,
        usage: Any,
        predictions: Sequence[tuple[int, int, int, int]] = (),
    ) -> None:
        """A request answered in full: its latency, its tokens, and for each generation the
        KV router placed, (predicted, reported cached tokens, block size, prompt tokens)."""
        series = self._by_model.get(model)
        if series is None:
            series = self._by_model[model] = _ModelSeries(self, model)
        series.duration.observe(duration)
        key = series.key
        self.input_tokens.inc_labels(key, usage.prompt_tokens)
        self.output_tokens.inc_labels(key, usage.completion_tokens)
        self.cached_tokens.inc_labels(key, usage.cached_tokens)
        if not predictions:
            return
        if not series.kv:  # only KV-routed models get these series
            series.add_kv(self, model)
        outcomes = series.outcomes
        for predicted, reported, block_size, prompt in predictions:
            self.predicted_cached_tokens.inc_labels(key, predicted)
            self.routed_prompt_tokens.inc_labels(key, prompt)
            if abs(predicted - reported) < block_size:
                self.predictions.inc_labels(outcomes["exact"])
            else:
                self.predictions.inc_labels(outcomes["over" if predicted > reported else "under"])


class _ModelSeries:
    """One model's series of the per-request metrics, looked up once: its duration
    histogram's series, and the counters' label values (LoopCounters: no lock per inc)."""

    __slots__ = ("duration", "key", "kv", "outcomes")

    def __init__(self, metrics: PreprocessorMetrics, model: str) -> None:
        self.duration = metrics.duration.labels(model)
        self.key = (model,)
        self.kv = False
        self.outcomes: dict[str, tuple[str, str]] = {}

    def add_kv(self, metrics: PreprocessorMetrics, model: str) -> None:
        """The KV series, each outcome's at 0 from the first KV-routed request on."""
        self.kv = True
        self.outcomes = {o: (model, o) for o in PREDICTION_OUTCOMES}
        for labels in self.outcomes.values():
            metrics.predictions.inc_labels(labels, 0)


class UpstreamsCollector:
    """The router and dispatcher replicas this preprocessor knows (each endpoint flag, and
    every address a name resolves to), read at scrape time: `connected` and `connecting` are
    in the rotation, `retired` left their name and finish their work."""

    def __init__(self, sets: dict[str, ReplicaSet[Any]]) -> None:
        self._sets = sets

    def collect(self):  # type: ignore[no-untyped-def]
        from prometheus_client.core import GaugeMetricFamily

        family = GaugeMetricFamily(
            "switchyard_preprocessor_upstreams",
            "router and dispatcher replicas by state (connected, connecting, retired)",
            labels=["service", "state"],
        )
        for service, replicas in self._sets.items():
            connected = sum(1 for r in replicas.live if r.connected)
            family.add_metric([service, "connected"], connected)
            family.add_metric([service, "connecting"], len(replicas.live) - connected)
            family.add_metric([service, "retired"], len(replicas.retired))
        yield family
