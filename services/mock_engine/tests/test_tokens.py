"""The deterministic next-token function."""

from __future__ import annotations

from switchyard.mock_engine.tokens import (
    INITIAL_STATE,
    TokenOracle,
    absorb,
    absorb_all,
    salt_for_seed,
)

ORDINARY = tuple(range(100, 1100))
EOS = 1


def run(oracle: TokenOracle, prompt: list[int], steps: int, **kwargs: object) -> list[int]:
    state = absorb_all(prompt)
    out = []
    for _ in range(steps):
        token = oracle.pick(state, **kwargs)  # type: ignore[arg-type]
        out.append(token)
        state = absorb(state, token)
    return out


class TestState:
    def test_incremental_equals_whole(self) -> None:
        tokens = [5, 9, 2, 2, 700]
        state = INITIAL_STATE
        for token in tokens:
            state = absorb(state, token)
        assert state == absorb_all(tokens)

    def test_order_matters(self) -> None:
        assert absorb_all([1, 2]) != absorb_all([2, 1])


class TestPick:
    def test_same_context_same_token(self) -> None:
        oracle = TokenOracle(ORDINARY, EOS)
        assert run(oracle, [3, 4, 5], 50) == run(TokenOracle(ORDINARY, EOS), [3, 4, 5], 50)

    def test_resume_continues_exactly(self) -> None:
        oracle = TokenOracle(ORDINARY, EOS)
        whole = run(oracle, [3, 4, 5], 40, allow_eos=False)
        resumed = run(oracle, [3, 4, 5, *whole[:15]], 25, allow_eos=False)
        assert whole[15:] == resumed

    def test_tokens_are_ordinary_or_eos(self) -> None:
        out = run(TokenOracle(ORDINARY, EOS), [7], 2000)
        assert set(out) <= set(ORDINARY) | {EOS}
        assert 10 < out.count(EOS) < 150  # about one in 40

    def test_no_eos_when_not_allowed(self) -> None:
        assert EOS not in run(TokenOracle(ORDINARY, EOS), [7], 2000, allow_eos=False)

    def test_banned_tokens_are_skipped(self) -> None:
        oracle = TokenOracle(ORDINARY, EOS)
        banned = frozenset(range(100, 1050))
        out = run(oracle, [7], 200, allow_eos=False, banned=banned)
        assert not set(out) & banned

    def test_everything_banned_still_answers(self) -> None:
        oracle = TokenOracle((100, 101), EOS)
        assert oracle.pick(123, allow_eos=False, banned=frozenset({100, 101})) in (100, 101)

    def test_salt_changes_the_draw(self) -> None:
        oracle = TokenOracle(ORDINARY, EOS)
        greedy = run(oracle, [3], 30, allow_eos=False)
        seeded = run(oracle, [3], 30, allow_eos=False, salt=salt_for_seed(42))
        assert seeded != greedy
        assert seeded == run(oracle, [3], 30, allow_eos=False, salt=salt_for_seed(42))
