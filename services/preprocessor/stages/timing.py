"""Stage timing, a benchmark mode (`preprocessor --stage-timing`), not per-request logging.

Each stage's time on the event loop goes into `switchyard_preprocessor_stage_seconds{stage}`;
bench/stages.py reads the sums and counts before and after a load run. The stages that wait
on another process (route: the router's answer) count their wall time; the per-token stages
count only their own work (`stream`: detokenize, stop strings, parsers, framing of each batch
of replies; `write`: handing the frames to the HTTP transport). With timing off, the request
path checks one `None` per stage and per batch.
"""

from __future__ import annotations

from switchyard.common.loop_histogram import HistogramSeries, LoopHistogram

STAGES = (
    "parse",
    "history",
    "model",
    "thinking",
    "template",
    "outputs",
    "tokenize",
    "check",
    "route",
    "hop",
    "dispatch",
    "stream",
    "write",
    "finish",
)


class StageTimer:
    __slots__ = ("_series",)

    def __init__(self, histogram: LoopHistogram) -> None:
        self._series: dict[str, HistogramSeries] = {s: histogram.labels(s) for s in STAGES}

    def add(self, stage: str, seconds: float) -> None:
        self._series[stage].observe(seconds)
