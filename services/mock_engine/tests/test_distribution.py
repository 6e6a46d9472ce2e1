"""The mock's next-token distribution: logit_bias and logprobs over the oracle."""

from __future__ import annotations

import math

from switchyard.mock_engine.distribution import CANDIDATES, Distribution
from switchyard.mock_engine.tokens import TokenOracle, absorb_all, salt_for_seed

ORDINARY = tuple(range(100, 1100))
EOS = 1
VOCAB = 2000
STATE = absorb_all([3, 4, 5])


def dist() -> Distribution:
    return Distribution(TokenOracle(ORDINARY, EOS), VOCAB)


def choose(d: Distribution, bias: dict[int, float], **kw: object) -> int:
    args: dict[str, object] = {"salt": 0, "allow_eos": True, "banned": ()}
    args.update(kw)
    return d.choose(STATE, bias=bias, **args)  # type: ignore[arg-type]


class TestLogitBias:
    def test_no_bias_keeps_the_oracles_token(self) -> None:
        d = dist()
        assert choose(d, {}) == d.oracle.pick(STATE)

    def test_plus_100_forces_a_token(self) -> None:
        d = dist()
        assert choose(d, {1500: 100.0}) == 1500  # any token, even one outside the candidates
        assert choose(d, {EOS: 100.0}) == EOS

    def test_minus_100_bans_the_drawn_token(self) -> None:
        d = dist()
        drawn = d.oracle.pick(STATE)
        second = d.score(STATE, drawn, top=2).ranked[1][0]
        assert choose(d, {drawn: -100.0}) == second

    def test_small_bias_lifts_a_close_candidate(self) -> None:
        d = dist()
        drawn = d.oracle.pick(STATE)
        (_, top1), (runner_up, top2) = d.score(STATE, drawn, top=2).ranked
        assert choose(d, {runner_up: (top1 - top2) + 0.01}) == runner_up
        assert choose(d, {runner_up: (top1 - top2) - 0.01}) == drawn

    def test_bias_respects_bans_and_eos(self) -> None:
        d = dist()
        assert choose(d, {EOS: 100.0}, allow_eos=False) != EOS
        assert choose(d, {1500: 100.0}, banned=frozenset({1500})) != 1500


class TestScores:
    def test_emitted_token_is_the_argmax(self) -> None:
        d = dist()
        drawn = d.oracle.pick(STATE)
        scored = d.score(STATE, drawn, top=5)
        assert scored.ranked[0] == (drawn, scored.logprob)
        values = [lp for _, lp in scored.ranked]
        assert values == sorted(values, reverse=True) and len(set(values)) == 5

    def test_same_context_same_scores(self) -> None:
        assert dist().score(STATE, 120, top=8) == dist().score(STATE, 120, top=8)

    def test_alternatives_do_not_depend_on_the_salt(self) -> None:
        d = dist()
        greedy = d.oracle.pick(STATE)
        salted = d.oracle.pick(STATE, salt=salt_for_seed(7))
        assert greedy != salted
        a = {t for t, _ in d.score(STATE, greedy, top=CANDIDATES).ranked[1:]}
        b = {t for t, _ in d.score(STATE, salted, top=CANDIDATES).ranked[1:]}
        assert len(a & b) >= CANDIDATES - 3  # the same alternatives, minus the two leaders

    def test_a_distribution_over_the_whole_vocabulary(self) -> None:
        d = dist()
        drawn = d.oracle.pick(STATE)
        ranked = d.score(STATE, drawn, top=CANDIDATES).ranked
        mass = sum(math.exp(lp) for _, lp in ranked)
        floor = d.score(STATE, 1999, top=0, first=drawn).logprob  # not a candidate
        rest = (VOCAB - CANDIDATES) * math.exp(floor)
        assert math.isclose(mass + rest, 1.0, rel_tol=1e-9)

    def test_more_alternatives_than_candidates_sit_at_the_floor(self) -> None:
        d = dist()
        drawn = d.oracle.pick(STATE)
        ranked = d.score(STATE, drawn, top=CANDIDATES + 5).ranked
        assert len(ranked) == CANDIDATES + 5 and len({t for t, _ in ranked}) == CANDIDATES + 5
        floor = d.score(STATE, 1999, top=0, first=drawn).logprob
        assert all(math.isclose(lp, floor) for _, lp in ranked[CANDIDATES:])

    def test_biased_scores_rank_the_forced_token_first(self) -> None:
        d = dist()
        drawn = d.oracle.pick(STATE)
        scored = d.score(STATE, 1500, top=3, first=drawn, bias={1500: 100.0})
        assert scored.ranked[0][0] == 1500 and scored.logprob > -0.01


class TestPromptScores:
    def test_first_position_has_none_and_the_rest_score_the_prompt_token(self) -> None:
        d = dist()
        prompt = [100, 200, 300, 400]
        scores = d.prompt_scores(prompt, 0, 2)
        assert scores[0] is None
        assert [s.token_id for s in scores[1:] if s is not None] == prompt[1:]
        third = scores[2]
        assert third is not None
        assert third == d.score(
            absorb_all(prompt[:2]), 300, top=2, first=d.oracle.pick(absorb_all(prompt[:2]))
        )

    def test_start_skips_the_leading_positions(self) -> None:
        scores = dist().prompt_scores([100, 200, 300, 400], 2, 0)
        assert len(scores) == 2 and all(s is not None for s in scores)
