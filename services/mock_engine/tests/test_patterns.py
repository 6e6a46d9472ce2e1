"""Text generated from regular expressions and EBNF grammars matches them."""

from __future__ import annotations

import random
import re

import pytest

from switchyard.mock_engine.grammars import parse_ebnf
from switchyard.mock_engine.patterns import Generator, PatternError, parse_regex

REGEXES = [
    r"\d{3}-\d{4}",
    r"(cat|dog|bird)s?",
    r"[A-Z][a-z]+ [a-z]{2,5}\.",
    r"^(?:yes|no)$",
    r"[^aeiou\s]{4,6}",
    r"\w+@\w+\.(com|org)",
    r"a{2,}b*c?",
    r"(?P<year>\d{4})-(0[1-9]|1[0-2])",
    r"\(\d+\)\[x\]\{y\}",
    r"[-+]?[0-9]*\.?[0-9]+",
    r"\x41\u00e9[a-c-]",
    r"(ab|cd){3}",
    r"\{ *\"[a-z]+\" *\}",
]


class TestRegex:
    @pytest.mark.parametrize("pattern", REGEXES)
    def test_generated_text_fully_matches(self, pattern: str) -> None:
        node = parse_regex(pattern)
        texts = {Generator(random.Random(seed)).text(node) for seed in range(20)}
        for text in texts:
            assert re.fullmatch(pattern, text), (pattern, text)

    def test_seeds_pick_different_matches(self) -> None:
        node = parse_regex(r"[a-z]{8}")
        texts = {Generator(random.Random(seed)).text(node) for seed in range(10)}
        assert len(texts) == 10

    def test_same_seed_same_text(self) -> None:
        node = parse_regex(r"(red|green|blue)-\d+")
        assert Generator(random.Random(5)).text(node) == Generator(random.Random(5)).text(node)

    @pytest.mark.parametrize(
        "pattern", [r"a(?=b)", r"(?!x)y", r"(a)\1", r"(?<=a)b", "[a-", "(ab", "ab)", "*a"]
    )
    def test_what_a_grammar_cannot_run_is_refused(self, pattern: str) -> None:
        with pytest.raises(PatternError):
            parse_regex(pattern)


ARITHMETIC = """
root ::= expr
expr ::= term ("+" term)*   # a sum
term ::= num | "(" expr ")"
num ::= [0-9]+
"""


def balanced_sum(text: str) -> bool:
    """A recognizer for ARITHMETIC: digits, '+' between terms, balanced parentheses."""
    while "(" in text:
        new = re.sub(r"\((\d+(?:\+\d+)*)\)", r"\1", text)
        if new == text:
            return False
        text = new
    return re.fullmatch(r"\d+(\+\d+)*", text) is not None


class TestEbnf:
    def test_recursive_grammar_output_is_accepted(self) -> None:
        rules = parse_ebnf(ARITHMETIC)
        for seed in range(30):
            text = Generator(random.Random(seed), rules).text(rules["root"])
            assert balanced_sum(text), text

    def test_strings_classes_and_quantifiers(self) -> None:
        grammar = r"""root ::= "say: \"" word ("," ws word){1,3} "\"\n"
word ::= [a-z]+
ws ::= " "?"""
        rules = parse_ebnf(grammar)
        for seed in range(20):
            text = Generator(random.Random(seed), rules).text(rules["root"])
            assert re.fullmatch(r'say: "[a-z]+(, ?[a-z]+){1,3}"\n', text), text

    @pytest.mark.parametrize(
        "grammar",
        [
            'start ::= "a"',  # no root
            'root ::= missing "a"',  # undefined rule
            'root ::= "a" (= "b")',  # lookahead assertion
            'root ::= "unterminated',
            "no rules here",
        ],
    )
    def test_grammars_that_cannot_be_built_are_refused(self, grammar: str) -> None:
        with pytest.raises(PatternError):
            parse_ebnf(grammar)
