"""Stage timing knows every stage the endpoints time (an unknown name would fail the request)."""

from switchyard.common.loop_histogram import LoopHistogram
from switchyard.preprocessor.stages.endpoints import PIPELINES
from switchyard.preprocessor.stages.timing import STAGES, StageTimer


def test_every_endpoint_stage_has_a_series() -> None:
    names = {stage.name for stages in PIPELINES.values() for stage in stages if stage.timed}
    assert names <= set(STAGES), names - set(STAGES)


def test_a_stage_time_is_observed() -> None:
    timer = StageTimer(LoopHistogram("t_stage_seconds", "test", [0.01], ["stage"]))
    for name in STAGES:
        timer.add(name, 0.001)
