"""Constrained output, scripted output and embedding mode over real gRPC, both protocols."""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from smg_grpc_proto import sglang_scheduler_pb2 as spb
from smg_grpc_proto import sglang_scheduler_pb2_grpc as sgrpc
from smg_grpc_proto import vllm_engine_pb2 as vpb
from smg_grpc_proto import vllm_engine_pb2_grpc as vgrpc

from switchyard.common.engines.sglang import choice_regex
from switchyard.mock_engine.config import MockEngineConfig, default_tokenizer_dir
from switchyard.mock_engine.server import start_mock_engine
from switchyard.mock_engine.tokenizer_facts import load_tokenizer_facts

pytestmark = pytest.mark.asyncio(loop_scope="module")

PROTOCOLS = ["sglang", "vllm"]
FACTS = load_tokenizer_facts(default_tokenizer_dir())
EOS = FACTS.eos_token_id
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
}


def generate_request(protocol: str, rid: str, prompt: list[int], **params: Any) -> Any:
    params.setdefault("temperature", 0.0)
    stream = params.pop("stream", True)
    if protocol == "sglang":
        if "max_tokens" in params:
            params["max_new_tokens"] = params.pop("max_tokens")
        return spb.GenerateRequest(
            request_id=rid,
            tokenized=spb.TokenizedInput(input_ids=prompt),
            sampling_params=spb.SamplingParams(**params),
            stream=stream,
            logprob_start_len=-1,
        )
    return vpb.GenerateRequest(
        request_id=rid,
        tokenized=vpb.TokenizedInput(input_ids=prompt),
        sampling_params=vpb.SamplingParams(**params),
        stream=stream,
    )


PROMPT = FACTS.encode("Tell me about the weather.")


def stub(protocol: str, sglang: Any, vllm: Any) -> Any:
    return sglang if protocol == "sglang" else vllm


async def output(engine: Any, req: Any) -> tuple[list[int], Any]:
    """Streamed output ids and the final complete."""
    ids: list[int] = []
    done = None
    async for reply in engine.Generate(req):
        if reply.HasField("chunk"):
            ids.extend(reply.chunk.token_ids)
        else:
            done = reply.complete
    return ids, done


def text_of(ids: list[int]) -> str:
    assert ids and ids[-1] == EOS  # a finished constrained output ends with EOS
    return FACTS.tokenizer.decode(ids[:-1], skip_special_tokens=False)


# The constraint of each kind, as each protocol's oneof carries it (SGLang: json_object as the
# schema {"type": "object"} and choice as a regex, the way the adapter sends them).
def constrained(protocol: str, kind: str) -> dict[str, Any]:
    choices = ["sunny", "rain or snow", "fog (dense)"]
    if protocol == "sglang":
        return {
            "json_schema": {"json_schema": json.dumps(SCHEMA)},
            "json_object": {"json_schema": '{"type": "object"}'},
            "regex": {"regex": r"[A-Z]{2}-\d{3}"},
            "ebnf": {"ebnf_grammar": 'root ::= "temp=" [0-9]+ ("C" | "F")'},
            "choice": {"regex": choice_regex(choices)},
        }[kind]
    vllm: dict[str, dict[str, Any]] = {
        "json_schema": {"json_schema": json.dumps(SCHEMA)},
        "json_object": {"json_object": True},
        "regex": {"regex": r"[A-Z]{2}-\d{3}"},
        "ebnf": {"grammar": 'root ::= "temp=" [0-9]+ ("C" | "F")'},
        "choice": {"choice": vpb.ChoiceConstraint(choices=choices)},
    }
    return vllm[kind]


def check(kind: str, text: str) -> None:
    if kind == "json_schema":
        value = json.loads(text)
        assert isinstance(value["city"], str) and 1 <= value["days"] <= 7
    elif kind == "json_object":
        assert isinstance(json.loads(text), dict)
    elif kind == "regex":
        assert re.fullmatch(r"[A-Z]{2}-\d{3}", text)
    elif kind == "ebnf":
        assert re.fullmatch(r"temp=[0-9]+[CF]", text)
    else:
        assert text in ("sunny", "rain or snow", "fog (dense)")


class TestConstraints:
    @pytest.mark.parametrize("protocol", PROTOCOLS)
    @pytest.mark.parametrize("kind", ["json_schema", "json_object", "regex", "ebnf", "choice"])
    async def test_output_satisfies_the_constraint(
        self, protocol: str, kind: str, sglang: Any, vllm: Any
    ) -> None:
        engine = stub(protocol, sglang, vllm)
        params = constrained(protocol, kind)
        for sample in range(3):
            req = generate_request(
                protocol, f"{kind}-{sample}", PROMPT, max_tokens=200, temperature=1.0, **params
            )
            ids, done = await output(engine, req)
            check(kind, text_of(ids))
            assert done.finish_reason == "stop"

    @pytest.mark.parametrize("protocol", PROTOCOLS)
    async def test_structural_tag(self, protocol: str, sglang: Any, vllm: Any) -> None:
        tag = {
            "type": "structural_tag",
            "format": {
                "type": "triggered_tags",
                "triggers": ["<tool_call>"],
                "tags": [
                    {
                        "begin": '<tool_call>{"name": "get_weather", "arguments": ',
                        "content": {"type": "json_schema", "json_schema": SCHEMA},
                        "end": "}</tool_call>",
                    }
                ],
                "at_least_one": True,
            },
        }
        engine = stub(protocol, sglang, vllm)
        req = generate_request(
            protocol, "stag", PROMPT, max_tokens=200, structural_tag=json.dumps(tag)
        )
        text = text_of((await output(engine, req))[0])
        call = json.loads(text.removeprefix("<tool_call>").removesuffix("</tool_call>"))
        assert call["name"] == "get_weather" and 1 <= call["arguments"]["days"] <= 7

    @pytest.mark.parametrize("protocol", PROTOCOLS)
    async def test_greedy_is_deterministic_and_seeds_vary_it(
        self, protocol: str, sglang: Any, vllm: Any
    ) -> None:
        engine = stub(protocol, sglang, vllm)
        schema = constrained(protocol, "json_schema")
        greedy = [
            (
                await output(
                    engine, generate_request(protocol, f"g{i}", PROMPT, max_tokens=200, **schema)
                )
            )[0]
            for i in range(2)
        ]
        assert greedy[0] == greedy[1]
        sampled = {
            tuple((await output(engine, generate_request(
                protocol, f"t{i}", PROMPT, max_tokens=200, temperature=1.0, **schema
            )))[0])
            for i in range(4)
        }  # fmt: skip
        assert len(sampled) > 1

    @pytest.mark.parametrize("protocol", PROTOCOLS)
    async def test_max_tokens_cuts_the_output_short(
        self, protocol: str, sglang: Any, vllm: Any
    ) -> None:
        engine = stub(protocol, sglang, vllm)
        req = generate_request(
            protocol, "cut", PROMPT, max_tokens=3, **constrained(protocol, "json_schema")
        )
        ids, done = await output(engine, req)
        assert len(ids) == 3 and done.finish_reason == "length"

    @pytest.mark.parametrize("protocol", PROTOCOLS)
    @pytest.mark.parametrize(
        "field,value",
        [
            ("json_schema", "{broken"),
            ("regex", "(?=x)y"),
            ("structural_tag", json.dumps({"format": {"type": "dispatch"}})),
        ],
    )
    async def test_a_constraint_it_cannot_build_is_invalid_argument(
        self, protocol: str, field: str, value: str, sglang: Any, vllm: Any
    ) -> None:
        engine = stub(protocol, sglang, vllm)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await output(engine, generate_request(protocol, "bad", PROMPT, **{field: value}))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # A schema that is no JSON at all: xgrammar's words, as the real engines pass them on.
        words = "Invalid JSON grammar" if value == "{broken" else "constraint"
        assert words in (raised.value.details() or "")


TOOL_MARKUP = (
    "<think>The user wants weather.</think>"
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
    '```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
)


@contextlib.asynccontextmanager
async def served(protocol: str, **config: Any) -> AsyncIterator[Any]:
    engine_config = MockEngineConfig(
        protocol=protocol, port=0, speedup=1000.0, context_length=512, **config
    )
    async with start_mock_engine(engine_config) as engine:
        async with grpc.aio.insecure_channel(engine.target) as channel:
            if protocol == "sglang":
                yield sgrpc.SglangSchedulerStub(channel)
            else:
                yield vgrpc.VllmEngineStub(channel)


@pytest.fixture(scope="module")
def script_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("script") / "script.json"
    rules = [
        {"marker": "weather in Paris", "output": TOOL_MARKUP},
        {"marker": "tool result: 21C", "output": "It is 21C in Paris."},
    ]
    path.write_text(json.dumps(rules))
    return path


class TestScript:
    @pytest.mark.parametrize("protocol", PROTOCOLS)
    async def test_marker_picks_the_output_split_at_real_token_boundaries(
        self, protocol: str, script_file: Path
    ) -> None:
        async with served(protocol, script_path=script_file) as engine:
            first = FACTS.encode("User: what is the weather in Paris?\nAssistant:")
            ids, done = await output(engine, generate_request(protocol, "s1", first))
            assert text_of(ids) == TOOL_MARKUP and done.finish_reason == "stop"
            assert FACTS.tokenizer.token_to_id("<｜tool▁calls▁begin｜>") in ids  # one special id
            second = first + FACTS.encode(" ... tool result: 21C\nAssistant:")
            ids, _ = await output(engine, generate_request(protocol, "s2", second))
            assert text_of(ids) == "It is 21C in Paris."
            other = FACTS.encode("Something else entirely")
            ids, _ = await output(engine, generate_request(protocol, "s3", other, max_tokens=5))
            assert len(ids) <= 5  # no rule: the next-token function as usual

    async def test_a_constraint_wins_over_the_script(self, script_file: Path) -> None:
        async with served("vllm", script_path=script_file) as engine:
            prompt = FACTS.encode("weather in Paris")
            req = generate_request("vllm", "c", prompt, max_tokens=100, json_object=True)
            assert isinstance(json.loads(text_of((await output(engine, req))[0])), dict)


def embed_request(protocol: str, rid: str, prompt: list[int] | None) -> Any:
    pb = spb if protocol == "sglang" else vpb
    if prompt is None:
        return pb.EmbedRequest(request_id=rid)
    return pb.EmbedRequest(request_id=rid, tokenized=pb.TokenizedInput(input_ids=prompt))


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


class TestEmbedding:
    @pytest.mark.parametrize("protocol", PROTOCOLS)
    async def test_embedding_mode(self, protocol: str) -> None:
        pb = spb if protocol == "sglang" else vpb
        async with served(protocol, embedding=True, embedding_dim=64) as engine:
            info = await engine.GetModelInfo(pb.GetModelInfoRequest())
            assert info.is_generation is False
            cats = FACTS.encode("cats are small furry animals")
            reply = await engine.Embed(embed_request(protocol, "e1", cats))
            vector = list(reply.embedding)
            assert reply.embedding_dim == 64 == len(vector)
            assert reply.prompt_tokens == len(cats)
            assert math.isclose(math.sqrt(sum(v * v for v in vector)), 1.0, rel_tol=1e-5)
            again = await engine.Embed(embed_request(protocol, "e2", cats))
            assert list(again.embedding) == vector
            kittens = list((await engine.Embed(embed_request(protocol, "e3", FACTS.encode(
                "cats are small furry pets")))).embedding)  # fmt: skip
            stocks = list((await engine.Embed(embed_request(protocol, "e4", FACTS.encode(
                "quarterly bond yields rose sharply")))).embedding)  # fmt: skip
            assert cosine(vector, kittens) > cosine(vector, stocks)
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await output(engine, generate_request(protocol, "g", cats, max_tokens=2))
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert raised.value.details() == "This model does not support generation"
            for bad in ([], None, [10**7]):
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    await engine.Embed(embed_request(protocol, "bad", bad))
                assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    @pytest.mark.parametrize("protocol", PROTOCOLS)
    async def test_a_generation_model_refuses_embed(
        self, protocol: str, sglang: Any, vllm: Any
    ) -> None:
        engine = stub(protocol, sglang, vllm)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await engine.Embed(embed_request(protocol, "x", PROMPT))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
