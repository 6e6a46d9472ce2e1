"""Per-delta cost of the output parsers (reasoning + tool calls), on vs off, in one run.

Streams of 256 tokens through the real DeepSeek tokenizer, detokenized one token at a time
as the per-token loop sees them: plain prose, R1-style reasoning then an answer, and an
answer with two DeepSeek-V3 tool calls. For each stream and parser configuration:

1. the parsers alone: microseconds per delta of OutputParser.feed (+ finish at the end);
2. the per-token loop around them: incremental detokenize -> stop strings -> parsers ->
   SSE framing of the chunk (orjson), per delta, with the parsers off and on, and the
   ratio on/off (the target at the whole-stack level: on within 10% of off).

Each cell is the fastest of --repeat passes over the whole stream, the configurations
taking turns within each round (on a shared machine the fastest pass is the least
disturbed one); compare ratios within one run.

    python bench/parsers.py [--repeat 200] [--out results/parsers.md]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from switchyard.preprocessor.detokenizer import IncrementalDetokenizer
from switchyard.preprocessor.parsers import OutputParser
from switchyard.preprocessor.parsers.deepseek import (
    CALL_BEGIN,
    CALL_END,
    CALLS_BEGIN,
    CALLS_END,
    SEP,
)
from switchyard.preprocessor.parsers.registry import REASONING_FORMATS, TOOL_PARSERS
from switchyard.preprocessor.stop_strings import StopMatcher
from switchyard.preprocessor.tokenizer import TokenizerBundle, default_tokenizer_dir

TOKENS = 256
PROSE = (
    "The switchyard at dawn is quiet: a few engines idle on the sidings, the signal lamps "
    "turn from red to green, and the first freight of the day rolls in from the north with "
    "forty cars of grain, timber and steel. The yardmaster checks the manifest, assigns each "
    "car a track, and the shunting locomotive begins its patient work of sorting them. "
)
TOOLS = ["get_weather", "get_time"]


def call(name: str, args: str) -> str:
    return f"{CALL_BEGIN}function{SEP}{name}\n```json\n{args}\n```{CALL_END}"


def streams(bundle: TokenizerBundle) -> dict[str, list[str]]:
    def cut(text: str, tokens: int) -> str:
        return bundle.decode(bundle.encode(text)[:tokens], skip_special_tokens=False)

    prose = cut(PROSE * 8, TOKENS)
    half = cut(PROSE * 4, TOKENS // 2 - 3)
    reasoning = "<think>\n" + half + "\n</think>\n\n" + half
    tool_args = (
        '{"city": "Paris", "country": "France", "units": "metric", "days": [1, 2, 3], '
        '"fields": ["temperature", "humidity", "wind", "precipitation"]}'
    )
    calls = (
        CALLS_BEGIN
        + call("get_weather", tool_args)
        + "\n"
        + call("get_time", '{"tz": "Europe/Paris", "format": "iso8601"}')
        + CALLS_END
    )
    texts = {
        "plain (no markup)": prose,
        "reasoning + answer": reasoning,
        "answer + 2 tool calls": cut(PROSE * 4, TOKENS - len(bundle.encode(calls))) + calls,
    }
    out = {}
    for name, text in texts.items():
        ids = bundle.encode(text)
        detok = IncrementalDetokenizer(bundle)
        out[name] = [detok.add([token]) for token in ids]
    return out


def parser_factories() -> dict[str, Callable[[], OutputParser | None]]:
    r1 = REASONING_FORMATS["deepseek_r1"]
    v3 = TOOL_PARSERS["deepseek_v3"]
    return {
        "off": lambda: None,
        "tools": lambda: OutputParser(None, v3(TOOLS)),
        "reasoning + tools": lambda: OutputParser(r1.parser(""), v3(TOOLS)),
    }


def run_parser(make: Callable[[], OutputParser | None], deltas: list[str]) -> float:
    """Microseconds per delta of the parsers alone, one pass over the stream."""
    parser = make()
    if parser is None:
        return 0.0
    feed = parser.feeder()
    start = time.perf_counter_ns()
    for delta in deltas:
        feed(delta)
    parser.finish()
    return (time.perf_counter_ns() - start) / len(deltas) / 1000


def run_loop(
    make: Callable[[], OutputParser | None], bundle: TokenizerBundle, ids: list[int]
) -> float:
    """Microseconds per token of detokenize -> stop strings -> parsers -> SSE, one pass."""
    dumps = orjson.dumps
    detok = IncrementalDetokenizer(bundle)
    stops = StopMatcher(["\n\nUser:"])
    parser = make()
    feed = parser.feeder() if parser is not None else None
    frames = []
    start = time.perf_counter_ns()
    for token in ids:
        text = detok.add([token])
        text, _ = stops.feed(text)
        if feed is None:
            if text:
                delta = {"content": text}
                frames.append(b"data: " + dumps({"choices": [{"delta": delta}]}) + b"\n\n")
            continue
        content, reasoning, calls = feed(text)
        if content or reasoning or calls:
            delta = {}
            if content:
                delta["content"] = content
            if reasoning:
                delta["reasoning_content"] = reasoning
            if calls:
                delta["tool_calls"] = [c.to_openai() for c in calls]
            frames.append(b"data: " + dumps({"choices": [{"delta": delta}]}) + b"\n\n")
    if parser is not None:
        parser.finish()
    return (time.perf_counter_ns() - start) / len(ids) / 1000


def interleaved(runs: dict[str, Callable[[], float]], repeat: int) -> dict[str, float]:
    """The fastest pass of each measurement (the one least disturbed by other processes on
    a shared machine), the configurations taking turns within every round so slow spells
    hit them alike."""
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeat):
        for name, run in runs.items():
            samples[name].append(run())
    return {name: min(values) for name, values in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=200, help="runs of each stream (median)")
    ap.add_argument("--out", type=Path, help="also write the tables here (markdown)")
    args = ap.parse_args()

    bundle = TokenizerBundle.from_dir(default_tokenizer_dir())
    all_deltas = streams(bundle)
    factories = parser_factories()
    on = [name for name in factories if name != "off"]
    lines = [
        f"Output parsers: fastest of {args.repeat} passes per cell, DeepSeek tokenizer.",
        "",
        "Parsers alone, us per delta:",
        "",
        "| stream | deltas | " + " | ".join(on) + " |",
        "|---|---|" + "---|" * len(on),
    ]
    for stream, deltas in all_deltas.items():
        alone = interleaved(
            {n: (lambda m=factories[n], d=deltas: run_parser(m, d)) for n in on}, args.repeat
        )
        lines.append(
            f"| {stream} | {len(deltas)} | " + " | ".join(f"{alone[n]:.2f}" for n in on) + " |"
        )
    lines += [
        "",
        "Per-token loop (detokenize -> stop strings -> parsers -> SSE frame), us per token, "
        "and on/off:",
        "",
        "| stream | off | " + " | ".join(f"{n} | ratio" for n in on) + " |",
        "|---|---|" + "---|---|" * len(on),
    ]
    for stream, deltas in all_deltas.items():
        ids = bundle.encode("".join(deltas))
        loop = interleaved(
            {n: (lambda m=make, i=ids: run_loop(m, bundle, i)) for n, make in factories.items()},
            args.repeat,
        )
        cells = [f"{loop['off']:.2f}"] + [
            f"{loop[n]:.2f} | {loop[n] / loop['off']:.3f}" for n in on
        ]
        lines.append(f"| {stream} | " + " | ".join(cells) + " |")
    report = "\n".join(lines)
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report + "\n")


if __name__ == "__main__":
    main()
