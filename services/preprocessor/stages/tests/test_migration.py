"""The one migration policy (migration.judge, check_hop) and the engine request ids that
render a generation's lineage (generation.engine_request_id)."""

from __future__ import annotations

import pytest

from switchyard.common import errors
from switchyard.common.errors import EngineError
from switchyard.preprocessor.stages import endpoints
from switchyard.preprocessor.stages.context import CHAT, RequestContext
from switchyard.preprocessor.stages.generation import engine_request_id
from switchyard.preprocessor.stages.migration import (
    CannotResume,
    Placement,
    check_hop,
    judge,
    resumable,
)
from switchyard.preprocessor.stages.tests.fakes import (
    FakeDispatcher,
    FakeHttp,
    FakeRouter,
    deps,
    failed,
)
from switchyard.protos.messages import CONSTRAINT_JSON_SCHEMA, Constraint, SamplingParams


@pytest.fixture
def d(bundle):
    return deps(bundle, FakeRouter([1, 2]), FakeDispatcher(lambda r: []), migration_limit=2)


def request(d) -> RequestContext:
    return endpoints.new_request(d, CHAT, FakeHttp())


class TestJudge:
    async def test_a_fault_that_cannot_migrate_fails_the_request(self, d):
        with pytest.raises(EngineError) as raised:
            await judge(request(d), Placement(), failed("r", 1, errors.BAD_REQUEST))
        assert raised.value.kind == errors.BAD_REQUEST

    async def test_an_engine_at_fault_is_excluded_and_the_attempt_counted(self, d):
        ctx, placement = request(d), Placement()
        assert await judge(ctx, placement, failed("r", 1, errors.CANNOT_CONNECT)) is None
        assert placement == Placement(attempt=1, exclude=[1])
        assert ctx.migrations == 1

    async def test_a_fault_not_the_engines_excludes_nothing(self, d):
        placement = Placement()
        failure = failed("r", 1, errors.DISCONNECTED, engine_fault=False)
        assert await judge(request(d), placement, failure) is None
        assert placement == Placement(attempt=1)

    async def test_a_refusal_is_avoided_not_excluded(self, d):
        placement = Placement()
        assert await judge(request(d), placement, failed("r", 2, errors.REFUSED)) is None
        assert (placement.exclude, placement.refused) == ([], [2])

    async def test_an_overloaded_engine_is_marked_busy(self, d):
        await judge(request(d), Placement(), failed("r", 2, errors.OVERLOADED))
        assert d.router.busy_log == [2]

    async def test_the_migration_limit(self, d):
        placement = Placement(attempt=2)
        with pytest.raises(EngineError, match="gave up after 2 migrations: boom"):
            await judge(request(d), placement, failed("r", 1, errors.CANNOT_CONNECT))

    async def test_a_sampled_constrained_output_can_only_start_over(self, d):
        placement = Placement()
        failure = failed("r", 1, errors.CANNOT_CONNECT)
        over = await judge(request(d), placement, failure, 3, can_resume=False)
        assert isinstance(over, CannotResume) and "3 tokens in" in over.message
        assert over.placement == Placement(attempt=1, exclude=[1])
        assert over.placement.exclude is not placement.exclude
        # before its first token it migrates as any output does
        assert await judge(request(d), Placement(), failure, 0, False) is None


class TestResumable:
    @pytest.mark.parametrize(
        ("fields", "expected"),
        [
            ({}, True),
            ({"constraint": True, "temperature": 0.7}, False),
            ({"constraint": True, "temperature": 0.0}, True),
            ({"constraint": True, "temperature": 0.7, "seed": 5}, True),
            ({"constraint": True, "temperature": 0.7, "top_k": 1}, True),
        ],
    )
    def test_which_outputs_can_go_on_elsewhere(self, fields, expected):
        constrained = fields.pop("constraint", False)
        constraint = Constraint(kind=CONSTRAINT_JSON_SCHEMA, value="{}") if constrained else None
        sampling = SamplingParams(max_tokens=8, constraint=constraint, **fields)
        assert resumable(sampling) is expected


class TestCheckHop:
    def test_the_hop_is_tried_hop_attempts_times(self, d):
        failure = failed("r", 9, errors.DISCONNECTED)
        check_hop(d, Placement(hops=1), failure)
        with pytest.raises(EngineError, match="the prefill hop failed 2 times: boom"):
            check_hop(d, Placement(hops=2), failure)


class TestEngineRequestIds:
    @pytest.mark.parametrize(
        ("lineage", "rendered"),
        [
            ((0, -1, 0, 0), "x"),
            ((0, -1, 0, 2), "x.m2"),
            ((1, -1, 0, 0), "x.p1"),
            ((0, 3, 0, 1), "x.c3.m1"),
            ((2, 1, 1, 2), "x.p2.s1.c1.m2"),
        ],
    )
    def test_lineage_fields_render_into_the_id(self, lineage, rendered):
        assert engine_request_id("x", *lineage) == rendered
