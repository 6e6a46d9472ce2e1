"""Random and mutated markup through every parser: nothing raises (or is logged as a
parser failure), the delta stream keeps OpenAI's shape, and the result does not depend
on how the text was cut into deltas."""

from __future__ import annotations

import json
import logging
import random
from typing import Any

import pytest
from support.parsers import collect, counter_ids, shape

from switchyard.preprocessor.parsers.constrained import NamedToolParser, RequiredToolParser
from switchyard.preprocessor.parsers.deepseek import DeepSeekV3ToolParser, DeepSeekV31ToolParser
from switchyard.preprocessor.parsers.hermes import HermesToolParser
from switchyard.preprocessor.parsers.kimi_k2 import KimiK2ToolParser
from switchyard.preprocessor.parsers.llama3 import Llama3JsonToolParser
from switchyard.preprocessor.parsers.mistral import MistralToolParser
from switchyard.preprocessor.parsers.output import OutputParser
from switchyard.preprocessor.parsers.reasoning import ReasoningParser

PIECES = [
    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "function", "\n```json\n", "\n```", "```json",
    "<tool_call>", "</tool_call>", "<|python_tag|>", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]",
    "<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
    "<|tool_call_end|>", "<|tool_calls_section_end|>", "functions.f:0", "<think>", "</think>",
    '{"name": "f", "arguments": ', '{"name": "g", "parameters": ', '{"a": 1}', "{", "}",
    "[", "]", ",", ";", '"', "\\", ":", " ", "\n", "f", "g", "text", "<", "|", "｜", "é",
]  # fmt: skip

TOOL_PARSERS = [
    DeepSeekV3ToolParser,
    DeepSeekV31ToolParser,
    HermesToolParser,
    Llama3JsonToolParser,
    MistralToolParser,
    KimiK2ToolParser,
    RequiredToolParser,
]


def soup(rng: random.Random) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 24)))


def value(rng: random.Random, depth: int = 0) -> object:
    kind = rng.randrange(6 if depth < 2 else 4)
    if kind == 0:
        return rng.choice(["", "a b", 'q"uo\\te', "}{][", "é✓", "<tool_call>", "\n"])
    if kind == 1:
        return rng.choice([0, -1.5, 10**12])
    if kind == 2:
        return rng.choice([True, False, None])
    if kind == 3:
        return "x"
    if kind == 4:
        return [value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {f"k{i}": value(rng, depth + 1) for i in range(rng.randint(0, 3))}


def arguments(rng: random.Random) -> str:
    obj = {f"p{i}": value(rng) for i in range(rng.randint(0, 3))}
    return json.dumps(obj, ensure_ascii=rng.random() < 0.3, indent=rng.choice([None, 2]))


def well_formed(family: str, rng: random.Random) -> str:
    """A reply in the family's markup: maybe text, one to three calls, maybe more text."""
    names = [rng.choice(["f", "g"]) for _ in range(rng.randint(1, 3))]
    args = [arguments(rng) for _ in names]
    if family == "deepseek_v3":
        calls = "\n".join(
            f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{n}\n```json\n{a}\n```<｜tool▁call▁end｜>"
            for n, a in zip(names, args, strict=True)
        )
        body = f"<｜tool▁calls▁begin｜>{calls}<｜tool▁calls▁end｜>"
    elif family == "deepseek_v31":
        calls = "".join(
            f"<｜tool▁call▁begin｜>{n}<｜tool▁sep｜>{a}<｜tool▁call▁end｜>"
            for n, a in zip(names, args, strict=True)
        )
        body = f"<｜tool▁calls▁begin｜>{calls}<｜tool▁calls▁end｜>"
    elif family == "kimi_k2":
        calls = "".join(
            f"<|tool_call_begin|>functions.{n}:{i}<|tool_call_argument_begin|>{a}<|tool_call_end|>"
            for i, (n, a) in enumerate(zip(names, args, strict=True))
        )
        body = f"<|tool_calls_section_begin|>{calls}<|tool_calls_section_end|>"
    elif family == "hermes":
        body = "\n".join(
            f'<tool_call>\n{{"name": "{n}", "arguments": {a}}}\n</tool_call>'
            for n, a in zip(names, args, strict=True)
        )
    elif family == "llama3_json":
        body = "<|python_tag|>" * rng.randint(0, 1) + "; ".join(
            f'{{"name": "{n}", "parameters": {a}}}' for n, a in zip(names, args, strict=True)
        )
        return body
    elif family == "mistral":
        if rng.random() < 0.5:
            items = ", ".join(
                f'{{"name": "{n}", "arguments": {a}}}' for n, a in zip(names, args, strict=True)
            )
            body = f"[TOOL_CALLS] [{items}]"
        else:
            body = "".join(f"[TOOL_CALLS]{n}[ARGS]{a}" for n, a in zip(names, args, strict=True))
    else:  # required
        items = ", ".join(
            f'{{"name": "{n}", "parameters": {a}}}' for n, a in zip(names, args, strict=True)
        )
        return f"[{items}]"
    before = rng.choice(["", "Sure. ", "a < b\n"])
    after = rng.choice(["", "", "\n\nDone."])
    return before + body + after


def mutate(rng: random.Random, text: str) -> str:
    for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
        at = rng.randint(0, len(text))
        kind = rng.randrange(4)
        if kind == 0:  # cut a span out
            text = text[:at] + text[at + rng.randint(1, 12) :]
        elif kind == 1:  # insert a piece
            text = text[:at] + rng.choice(PIECES) + text[at:]
        elif kind == 2:  # the output ends early
            text = text[:at]
        else:  # a tool name nobody declared
            text = text.replace('"f"', '"zz"', 1).replace(">f<", ">zz<", 1)
    return text


def sample(family: str, rng: random.Random) -> str:
    return soup(rng) if rng.random() < 0.2 else mutate(rng, well_formed(family, rng))


def cuts(rng: random.Random, text: str) -> list[str]:
    points = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 6))))
    chunks, last = [], 0
    for point in points:
        chunks.append(text[last:point])
        last = point
    chunks.append(text[last:])
    return chunks


@pytest.fixture(autouse=True)
def no_parser_failures(caplog: pytest.LogCaptureFixture):  # type: ignore[no-untyped-def]
    with caplog.at_level(logging.ERROR, logger="switchyard.preprocessor.parsers"):
        yield
    failures = [r for r in caplog.records if r.name.startswith("switchyard.preprocessor.parsers")]
    assert not failures, failures[0].getMessage()


@pytest.mark.parametrize("parser", TOOL_PARSERS, ids=lambda p: p.name)
@pytest.mark.parametrize("strict", [False, True])
def test_tool_parsers(parser: Any, strict: bool) -> None:
    rng = random.Random(f"{parser.name}-{strict}")
    with_calls = 0
    for _ in range(400):
        text = sample(parser.name, rng)
        result = collect(parser(["f", "g"], strict=strict, new_id=counter_ids()), [text])
        with_calls += bool(result.tool_calls)
        whole = shape(result)
        for _ in range(3):
            chunks = cuts(rng, text)
            got = shape(collect(parser(["f", "g"], strict=strict, new_id=counter_ids()), chunks))
            assert got == whole, (text, chunks)
    assert with_calls > 100  # the samples do exercise the call paths


@pytest.mark.parametrize("strict", [False, True])
def test_named(strict: bool) -> None:
    rng = random.Random(f"named-{strict}")
    for _ in range(300):
        text = rng.choice([soup(rng), mutate(rng, arguments(rng))])
        whole = shape(collect(NamedToolParser("f", strict=strict), [text]))
        got = shape(collect(NamedToolParser("f", strict=strict), cuts(rng, text)))
        assert got == whole, text


@pytest.mark.parametrize("opened", [False, True])
def test_reasoning_with_tools(opened: bool) -> None:
    rng = random.Random(f"reasoning-{opened}")
    for _ in range(400):
        think = rng.choice(["", "<think>", "<think>\n"]) + rng.choice(["", "hmm", "a\n b "])
        text = think + rng.choice(["", "</think>", "</think>\n\n"]) + sample("deepseek_v3", rng)

        def make() -> OutputParser:
            return OutputParser(
                ReasoningParser(opened=opened, exits=("<｜tool▁calls▁begin｜>",)),
                DeepSeekV3ToolParser(["f", "g"], new_id=counter_ids()),
            )

        whole = shape(collect(make(), [text]))
        for _ in range(3):
            chunks = cuts(rng, text)
            assert shape(collect(make(), chunks)) == whole, (text, chunks)
