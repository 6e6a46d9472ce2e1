"""The framework: filters -> weighted, clamped, timed scorers -> picker."""

import math
import random

from switchyard.router.framework import PluginStats, Profile
from switchyard.router.policies.max_score import MaxScore
from switchyard.router.policies.same_model import SameModel
from switchyard.router.tests.helpers import inst, req
from switchyard.router.timing import TimeModel
from switchyard.router.types import (
    EngineLoad,
    Needs,
    NoParams,
    PluginDeps,
    RouteContext,
    RouterLoad,
    Worker,
)

DEPS = PluginDeps(random.Random(0), TimeModel())


def workers(*ids, model="m"):
    return [Worker(inst(i, model=model), 0, RouterLoad(), EngineLoad()) for i in ids]


def ctx(dry_run=True):
    return RouteContext(req("r", [1, 2, 3], dry_run=dry_run), 0.0, DEPS.time, explain=dry_run)


class Fixed:
    needs = Needs.NONE

    def __init__(self, name, values):
        self.name, self.values = name, values

    def score(self, ctx, ws):
        return [self.values[w.instance_id] for w in ws]


class TestProfile:
    def test_weighted_sum_picks_the_best(self):
        profile = Profile(
            "p",
            [SameModel()],
            [(Fixed("a", {1: 1.0, 2: 0.0}), 1.0), (Fixed("b", {1: 0.0, 2: 1.0}), 3.0)],
            MaxScore(NoParams(), DEPS),
        )
        outcome = profile.run(ctx(), workers(1, 2))
        assert outcome.chosen.instance_id == 2
        assert outcome.totals == [1.0, 3.0]
        assert outcome.scores == {"a": [1.0, 0.0], "b": [0.0, 1.0]}

    def test_scores_are_clamped_and_counted(self):
        stats = PluginStats()
        profile = Profile(
            "p",
            [],
            [(Fixed("wild", {1: 7.0, 2: -3.0, 3: math.nan}), 1.0)],
            MaxScore(NoParams(), DEPS),
            stats,
        )
        outcome = profile.run(ctx(), workers(1, 2, 3))
        assert outcome.scores["wild"] == [1.0, 0.0, 0.0]
        assert stats.by_plugin["p/wild"].clamped == 3

    def test_one_nan_or_inf_among_valid_scores_is_clamped(self):
        """The in-range fast path (sums in C) must not let a lone NaN or inf through: a NaN
        after the first score escapes min() and max(), not the sum."""
        for bad, clamped_to in ((math.nan, 0.0), (math.inf, 1.0), (-math.inf, 0.0)):
            stats = PluginStats()
            profile = Profile(
                "p",
                [],
                [(Fixed("s", {1: 0.5, 2: bad, 3: 0.25}), 2.0)],
                MaxScore(NoParams(), DEPS),
                stats,
            )
            outcome = profile.run(ctx(), workers(1, 2, 3))
            assert outcome.scores["s"] == [0.5, clamped_to, 0.25]
            assert outcome.totals == [1.0, 2.0 * clamped_to, 0.5]
            assert stats.by_plugin["p/s"].clamped == 1

    def test_every_plugin_is_timed(self):
        stats = PluginStats()
        profile = Profile(
            "p", [SameModel()], [(Fixed("a", {1: 1.0}), 1.0)], MaxScore(NoParams(), DEPS), stats
        )
        profile.run(ctx(), workers(1))
        assert {k: v.calls for k, v in stats.by_plugin.items()} == {
            "p/same_model": 1,
            "p/a": 1,
            "p/max_score": 1,
        }
        assert all(v.seconds >= 0 for v in stats.by_plugin.values())

    def test_filter_that_empties_is_named_and_removals_explained(self):
        profile = Profile("p", [SameModel()], [], MaxScore(NoParams(), DEPS))
        outcome = profile.run(ctx(), workers(1, 2, model="other"))
        assert (outcome.chosen, outcome.emptied_by) == (None, "same_model")
        assert outcome.filtered == {(1, 0): "same_model", (2, 0): "same_model"}

    def test_needs_are_the_union_of_the_plugins(self):
        class Blocky(Fixed):
            needs = Needs.BLOCKS

        profile = Profile("p", [SameModel()], [(Blocky("b", {}), 1.0)], MaxScore(NoParams(), DEPS))
        assert profile.needs == Needs.BLOCKS

    def test_no_scorers_means_the_picker_alone(self):
        profile = Profile("p", [], [], MaxScore(NoParams(), DEPS))
        picks = {profile.run(ctx(False), workers(1, 2)).chosen.instance_id for _ in range(30)}
        assert picks == {1, 2}  # all tied: at random
