"""Switchyard over two real vLLM engines (gRPC mode): prefix caching, exact KV-routing
predictions from the engines' own KV events (ZMQ publisher on one, SubscribeKvEvents on the
other), the client going away (engine Abort), the tokenizer from GetTokenizer, /v1/responses,
tool calls and structured outputs."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import httpx
import openai
import pytest
from direct import generate, running
from e2e_stack import running_stack, wait_until

MODEL = "tiny-llama"
BLOCK = 128

pytestmark = pytest.mark.timeout(600)


def random_prompt(seed: int, length: int) -> list[int]:
    """Token ids of ordinary vocabulary pieces (no special tokens), the same for a seed."""
    rng = random.Random(seed)
    return [rng.randrange(1000, 100_000) for _ in range(length)]


def debug_route(base_url: str, prompt: list[int]) -> dict:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 1}
    reply = httpx.post(base_url + "/debug/route", json=body, timeout=30)
    reply.raise_for_status()
    return dict(reply.json())


def overlaps(route: dict) -> dict[str, int]:
    return {w["url"]: w["overlap_blocks"] for w in route["workers"]}


class TestPrefixCaching:
    def test_a_held_prompt_reports_its_cached_blocks(self, sy, grpc_a, grpc_b):
        prompt = random_prompt(1, 300)
        # Both engines hold the prompt's two full 128-token blocks, so the answer does not
        # hang on the router's choice: on the tiny model a 256-token hit saves so little
        # prefill time that the rest of the router's costs (the engines' learned speeds, the
        # request it may still count in flight) can send the repeat to the other engine, as
        # it once did in CI. Which engine a prefix draws is tested below, with its scores.
        held = [generate(engine, prompt) for engine in (grpc_a, grpc_b)]
        first = sy.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
        again = sy.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
        assert [h.cached_tokens for h in held] == [0, 0]  # nothing earlier held this prompt
        assert first.usage.prompt_tokens == again.usage.prompt_tokens == 300
        assert first.usage.prompt_tokens_details.cached_tokens == 2 * BLOCK
        assert again.usage.prompt_tokens_details.cached_tokens == 2 * BLOCK
        assert again.choices[0].text == first.choices[0].text


class TestKvRoutingPredictions:
    """The router's index follows the real publisher: the overlap it predicts for an engine is
    exactly the prefix the engine then reports cached."""

    @pytest.mark.parametrize("which", ["grpc_a", "grpc_b"], ids=["zmq", "grpc-stream"])
    def test_prediction_is_what_the_engine_reports(self, request, stack, sy, which):
        engine = request.getfixturevalue(which)
        seed = 100 if which == "grpc_a" else 200
        # Ten blocks: on the tiny model a hit saves little prefill time, and a long one keeps
        # it well above the other costs (the engines' learned speeds) that weigh the choice.
        held = 10
        prefix = random_prompt(seed, held * BLOCK + 40)
        generate(engine, prefix)  # straight to the engine: only it holds the prefix
        prompt = prefix + random_prompt(seed + 1, 30)
        route = wait_until(
            lambda: (
                (r := debug_route(stack.base_url, prompt))
                and max(overlaps(r).values()) >= held
                and r
            ),
            timeout=30,
            what="the engine's KV events indexed",
        )
        predicted = overlaps(route)
        assert predicted[engine.url] == held, predicted
        assert sorted(predicted.values()) == [0, held]
        assert route["chosen"]["url"] == engine.url, route  # the scores, when it is not
        reply = sy.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0)
        assert reply.usage.prompt_tokens_details.cached_tokens == held * BLOCK


class TestClientGoesAway:
    def test_a_closed_stream_aborts_the_engine_request(self, stack, grpc_a, grpc_b):
        def aborts() -> int:  # earlier tests abort too (the wire-shapes test's Abort)
            return (grpc_a.log() + grpc_b.log()).count("Abort requests")

        before = aborts()
        with httpx.Client(base_url=stack.base_url, timeout=60) as client:
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": "Tell me about every siding."}],
                "max_tokens": 1900,
                "ignore_eos": True,
                "stream": True,
            }
            with client.stream("POST", "/v1/chat/completions", json=body) as reply:
                # Closed at the first output, whatever the chunking (a chunk carries a batch
                # of tokens: how many depends on the machine's speed). `lines` is held: a
                # dropped line iterator closes the connection at once.
                lines = reply.iter_lines()
                for line in lines:
                    if line.startswith("data: {") and any(
                        c["delta"].get("content") for c in json.loads(line[6:])["choices"]
                    ):
                        break
                assert running(grpc_a) + running(grpc_b) == 1
        wait_until(lambda: aborts() > before, timeout=60, what="the engine told to abort")
        wait_until(
            lambda: running(grpc_a) + running(grpc_b) == 0,
            timeout=60,
            what="the engine request gone",
        )


class TestTokenizerFromTheEngine:
    def test_fetched_over_gettokenizer_and_its_files_removed_once_loaded(self, grpc_b):
        """Regression: the folder GetTokenizer's zip was unpacked into stayed in the system
        temp folder after every preprocessor start (6.4 MB each)."""
        with running_stack("--worker", grpc_b.url, timeout=300) as stack:
            with openai.OpenAI(base_url=stack.base_url + "/v1", api_key="x") as client:
                reply = client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
                )
                assert reply.choices[0].message.content is not None
            log = stack.log()
            match = re.search(r"fetched from \S+ \(\d+ bytes\), unpacked in (\S+)", log)
            assert match, log[-3000:]
            folder = Path(match.group(1))
            assert folder.parent.name.startswith("switchyard-proc-")
            assert not folder.exists() and not folder.parent.exists()


class TestResponsesApi:
    def test_output_matches_the_same_chat(self, sy, vl):
        question = "Which siding takes the grain cars?"
        chat = sy.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": question}],
            max_tokens=12,
            temperature=0,
        )
        ours = sy.responses.create(model=MODEL, input=question, max_output_tokens=12, temperature=0)
        theirs = vl.responses.create(
            model=MODEL, input=question, max_output_tokens=12, temperature=0
        )
        assert ours.output_text == chat.choices[0].message.content
        assert ours.output_text == theirs.output_text
        assert ours.usage.output_tokens == theirs.usage.output_tokens
        assert ours.usage.input_tokens == theirs.usage.input_tokens


TOOL = {
    "type": "function",
    "function": {
        "name": "route_car",
        "description": "Send a freight car to a track.",
        "parameters": {
            "type": "object",
            # enums keep the grammar's output short (random weights ramble inside a string)
            "properties": {"track": {"enum": [1, 2, 3]}, "car": {"enum": ["coal", "grain"]}},
            "required": ["track", "car"],
        },
    },
}


class TestToolCalls:
    """Random weights never write a tool call of their own: a named tool_choice makes the
    engine's grammar write one. They ramble whitespace inside the JSON (the grammar allows
    it), so max_tokens cuts the call on both sides, which shows a documented difference:
    Switchyard returns the call so far (finish_reason "length", the arguments' text so far),
    as OpenAI does with a cut call; vLLM's server returns no call and empty content."""

    def test_named_tool_choice_cut_by_max_tokens(self, sy, vl):
        kwargs = dict(
            model=MODEL,
            messages=[{"role": "user", "content": "Route car 7 to track 3."}],
            tools=[TOOL],
            tool_choice={"type": "function", "function": {"name": "route_car"}},
            max_tokens=120,
            temperature=0,
        )
        ours = sy.chat.completions.create(**kwargs)
        theirs = vl.chat.completions.create(**kwargs)
        assert ours.choices[0].finish_reason == theirs.choices[0].finish_reason == "length"
        assert ours.usage.completion_tokens == theirs.usage.completion_tokens == 120
        [call] = ours.choices[0].message.tool_calls
        assert call.function.name == "route_car"
        assert call.function.arguments.startswith("{")
        assert not theirs.choices[0].message.tool_calls
        assert not theirs.choices[0].message.content
