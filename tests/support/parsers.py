"""Helpers for tests of the parsers: feed chunks, rebuild the message a client would see.

`collect(parser, chunks)` feeds the chunks and finishes, checks the delta stream has
OpenAI's shape (each call's first delta has its id and name, later ones argument text
only, indexes from 0 in order) and returns the rebuilt `ParsedOutput`. `splits(text)`
yields the chunkings the tests use: every single split point, and every character apart.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator

from switchyard.preprocessor.parsers.types import ParsedOutput, StreamParser, ToolCall


def collect(parser: StreamParser, chunks: Iterable[str]) -> ParsedOutput:
    content: list[str] = []
    reasoning: list[str] = []
    calls: list[list[str]] = []  # [id, name, arguments...] per index
    deltas = [parser.feed(chunk) for chunk in chunks]
    deltas.append(parser.finish())
    for text, thought, tool_calls in deltas:
        content.append(text)
        reasoning.append(thought)
        for call in tool_calls:
            if call.name is not None:
                if call.index != len(calls):
                    raise AssertionError(f"call index {call.index} after {len(calls)} calls")
                if not call.id:
                    raise AssertionError(f"call {call.index} announced without an id")
                calls.append([call.id, call.name, call.arguments])
            else:
                if call.index != len(calls) - 1 or call.id is not None:
                    raise AssertionError(f"argument delta out of place: {call}")
                calls[call.index].append(call.arguments)
    return ParsedOutput(
        "".join(content),
        "".join(reasoning),
        tuple(ToolCall(c[0], c[1], "".join(c[2:])) for c in calls),
    )


def splits(text: str) -> Iterator[list[str]]:
    for at in range(len(text) + 1):
        yield [text[:at], text[at:]]
    yield list(text)


def pair_splits(text: str) -> Iterator[list[str]]:
    """Every way to cut the text in three (quadratic: for short texts)."""
    for i, j in itertools.combinations_with_replacement(range(len(text) + 1), 2):
        yield [text[:i], text[i:j], text[j:]]


def counter_ids(prefix: str = "call_") -> Callable[[], str]:
    """Deterministic ids call_0, call_1, ... so streamed and whole results compare equal."""
    count = itertools.count()
    return lambda: f"{prefix}{next(count)}"


def token_deltas(tokenizer: object, text: str) -> list[str]:
    """The text as the per-token loop sees it: encoded by the real tokenizer, then
    detokenized incrementally one token at a time (a preprocessor TokenizerBundle)."""
    from switchyard.preprocessor.detokenizer import IncrementalDetokenizer

    ids = tokenizer.encode(text)  # type: ignore[attr-defined]
    detokenizer = IncrementalDetokenizer(tokenizer)  # type: ignore[arg-type]
    return [detokenizer.add([token]) for token in ids]


def shape(output: ParsedOutput) -> tuple[str, str, tuple[tuple[str, str], ...]]:
    """Content, reasoning and (name, arguments) per call: what must agree across chunkings."""
    return (
        output.content,
        output.reasoning,
        tuple((call.name, call.arguments) for call in output.tool_calls),
    )


def check_chunkings(
    make: Callable[[bool], StreamParser],
    text: str,
    expected: tuple[str, str, tuple[tuple[str, str], ...]],
    *,
    tokenizer: object | None = None,
    strict_expected: tuple[str, str, tuple[tuple[str, str], ...]] | None = None,
) -> None:
    """`make(strict)` builds a fresh parser. Streams `text` at every split point, character
    by character and (with `tokenizer`) token by token, progressive and strict, and checks
    each rebuilt result against `expected` (`strict_expected` for the strict policy when
    it differs, as for malformed arguments of an announced call)."""
    want_strict = strict_expected if strict_expected is not None else expected
    chunkings = list(splits(text))
    if tokenizer is not None:
        chunkings.append(token_deltas(tokenizer, text))
    for strict, want in ((False, expected), (True, want_strict)):
        for chunks in chunkings:
            got = shape(collect(make(strict), chunks))
            if got != want:
                raise AssertionError(
                    f"strict={strict} chunks={chunks!r}:\n  got  {got!r}\n  want {want!r}"
                )
