from __future__ import annotations

import random

import pytest

from switchyard.preprocessor.stop_strings import StopMatcher


def run(stops: list[str], deltas: list[str]) -> tuple[str, bool, list[str]]:
    matcher = StopMatcher(stops)
    emitted, stopped = [], False
    for delta in deltas:
        text, stopped = matcher.feed(delta)
        emitted.append(text)
        if stopped:
            break
    if not stopped:
        emitted.append(matcher.flush())
    return "".join(emitted), stopped, emitted


def reference(stops: list[str], text: str) -> tuple[str, bool]:
    hits = [text.find(s) for s in stops if s and s in text]
    if not hits:
        return text, False
    return text[: min(hits)], True


class TestNoStop:
    def test_passthrough_without_stops(self) -> None:
        matcher = StopMatcher([])
        assert matcher.feed("abc") == ("abc", False)
        assert matcher.flush() == ""

    def test_text_without_match_is_released(self) -> None:
        assert run(["STOP"], ["hello ", "world"]) == ("hello world", False, ["hello ", "world", ""])

    def test_partial_match_is_held_then_flushed(self) -> None:
        matcher = StopMatcher(["STOP"])
        assert matcher.feed("abc ST") == ("abc ", False)
        assert matcher.feed("O") == ("", False)
        assert matcher.flush() == "STO"
        assert matcher.flush() == ""

    def test_false_start_is_released(self) -> None:
        matcher = StopMatcher(["STOP"])
        assert matcher.feed("ST") == ("", False)
        assert matcher.feed("AR") == ("STAR", False)


class TestStop:
    def test_within_one_delta(self) -> None:
        assert run(["\n\n"], ["one\n\ntwo"])[:2] == ("one", True)

    def test_split_across_deltas(self) -> None:
        text, stopped, pieces = run(["<END>"], ["abc<", "E", "N", "D>tail"])
        assert (text, stopped) == ("abc", True)
        assert pieces == ["abc", "", "", ""]

    def test_stop_at_very_start(self) -> None:
        assert run(["x"], ["xyz"])[:2] == ("", True)

    def test_multiple_stops_earliest_wins(self) -> None:
        matcher = StopMatcher(["world", "lo"])
        assert matcher.feed("hello world") == ("hel", True)
        assert matcher.matched == "lo"

    def test_longer_stop_prefix_held_while_shorter_completes(self) -> None:
        # "ab" could still become "abcd" but "b" is already complete at index 1.
        matcher = StopMatcher(["abcd", "b"])
        assert matcher.feed("xa") == ("x", False)
        assert matcher.feed("b") == ("a", True)

    def test_after_stop_everything_is_dropped(self) -> None:
        matcher = StopMatcher(["."])
        assert matcher.feed("end. more") == ("end", True)
        assert matcher.feed("later") == ("", True)
        assert matcher.flush() == ""

    def test_repeated_char_prefix(self) -> None:
        """The held tail must be the longest suffix that begins a stop, e.g. "aa" for "aab"."""
        matcher = StopMatcher(["aab"])
        assert matcher.feed("xaaa") == ("xa", False)
        assert matcher.feed("b") == ("", True)

    def test_unicode_stop(self) -> None:
        assert run(["。"], ["你好", "。再见"])[:2] == ("你好", True)

    def test_empty_and_duplicate_stops_ignored(self) -> None:
        assert run(["", "z", "z"], ["abc"])[:2] == ("abc", False)


class TestRandomised:
    @pytest.mark.parametrize("seed", range(30))
    def test_matches_reference(self, seed: int) -> None:
        rng = random.Random(seed)
        alphabet = "ab c\n"
        stops = [
            "".join(rng.choices(alphabet, k=rng.randint(1, 4))) for _ in range(rng.randint(1, 4))
        ]
        text = "".join(rng.choices(alphabet, k=60))
        cuts = sorted(rng.sample(range(1, len(text)), 10))
        deltas = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        out, stopped, _ = run(stops, deltas)
        assert (out, stopped) == reference(stops, text)
