"""argtypes: the shared argparse types refuse bad values with a one-line message."""

from __future__ import annotations

import argparse

import pytest

from switchyard.common.argtypes import positive_seconds, seconds, whole_number


class TestWholeNumber:
    @pytest.mark.parametrize(("minimum", "text", "value"), [(0, "0", 0), (1, "1", 1), (1, " 7", 7)])
    def test_takes_a_whole_number_at_the_minimum_or_above(self, minimum, text, value):
        assert whole_number(minimum)(text) == value

    @pytest.mark.parametrize("text", ["abc", "1.5", "", "nan"])
    def test_refuses_what_is_not_a_whole_number(self, text):
        with pytest.raises(argparse.ArgumentTypeError, match=f"^not a whole number: {text!r}$"):
            whole_number(1)(text)

    @pytest.mark.parametrize(("minimum", "text"), [(1, "0"), (1, "-3"), (0, "-1")])
    def test_refuses_a_number_below_the_minimum(self, minimum, text):
        message = f"^must be at least {minimum}, got {int(text)}$"
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            whole_number(minimum)(text)

    def test_a_bad_value_is_a_usage_error_naming_the_flag(self, capsys):
        parser = argparse.ArgumentParser()
        parser.add_argument("--routers", type=whole_number(1))
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args(["--routers", "0"])
        assert exit_.value.code == 2
        assert "argument --routers: must be at least 1, got 0" in capsys.readouterr().err


class TestSeconds:
    @pytest.mark.parametrize(("text", "value"), [("0", 0.0), ("2.5", 2.5), ("inf", float("inf"))])
    def test_takes_zero_and_more(self, text, value):
        assert seconds(text) == value

    @pytest.mark.parametrize("text", ["-1", "nan", "-inf"])
    def test_refuses_a_negative_number_and_nan(self, text):
        with pytest.raises(argparse.ArgumentTypeError, match=f"^must be >= 0, got {text}$"):
            seconds(text)

    def test_refuses_what_is_not_a_number(self):
        with pytest.raises(argparse.ArgumentTypeError, match="^not a number of seconds: 'soon'$"):
            seconds("soon")


class TestPositiveSeconds:
    @pytest.mark.parametrize(("text", "value"), [("0.001", 0.001), ("120", 120.0)])
    def test_takes_a_finite_number_above_zero(self, text, value):
        assert positive_seconds(text) == value

    @pytest.mark.parametrize("text", ["0", "-1", "nan", "inf", "-inf"])
    def test_refuses_zero_negative_nan_and_inf(self, text):
        message = f"^must be a finite number > 0, got {text}$"
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            positive_seconds(text)

    def test_refuses_what_is_not_a_number(self):
        with pytest.raises(argparse.ArgumentTypeError, match="^not a number of seconds: 'x'$"):
            positive_seconds("x")
