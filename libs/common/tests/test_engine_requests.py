"""The adapters' request building against the real generated protos: every neutral field
lands in each family's own field, and what a proto cannot hold is refused by name."""

import json

import pytest
from smg_grpc_proto.generated import sglang_scheduler_pb2 as spb
from smg_grpc_proto.generated import vllm_engine_pb2 as vpb

from switchyard.common import errors
from switchyard.common.engines.sglang import SglangClient, choice_regex, escape_regex
from switchyard.common.engines.vllm import VllmClient
from switchyard.common.errors import EngineError
from switchyard.protos import messages as m
from switchyard.protos.messages import Constraint, GenerateRequest, SamplingParams


def req(sampling: SamplingParams | None = None, **fields) -> GenerateRequest:
    return GenerateRequest(
        request_id="r",
        instance_id=1,
        token_ids=[1, 2, 3],
        sampling=sampling or SamplingParams(max_tokens=8),
        **fields,
    )


def both(request: GenerateRequest) -> tuple[spb.GenerateRequest, vpb.GenerateRequest]:
    built = SglangClient.build_request(request), VllmClient.build_request(request)
    for message, cls in zip(built, (spb.GenerateRequest, vpb.GenerateRequest), strict=True):
        assert cls.FromString(message.SerializeToString()) == message  # the wire holds it
    return built


FULL = SamplingParams(
    max_tokens=64,
    temperature=0.7,
    top_p=0.9,
    top_k=40,
    min_p=0.05,
    min_tokens=2,
    repetition_penalty=1.1,
    presence_penalty=0.5,
    frequency_penalty=0.25,
    stop_token_ids=[7, 8],
    ignore_eos=True,
    n=3,
    logit_bias={5: -100.0, 99: 2.5},
)


class TestSampling:
    def test_every_field_lands(self):
        sg, vl = both(req(FULL))
        s, v = sg.sampling_params, vl.sampling_params
        for params in (s, v):
            assert params.temperature == pytest.approx(0.7)
            assert params.top_p == pytest.approx(0.9) and params.min_p == pytest.approx(0.05)
            assert params.repetition_penalty == pytest.approx(1.1)
            assert params.presence_penalty == 0.5 and params.frequency_penalty == 0.25
            assert list(params.stop_token_ids) == [7, 8] and params.ignore_eos
            assert params.n == 3 and params.top_k == 40
        assert (s.max_new_tokens, s.min_new_tokens) == (64, 2)
        assert (v.max_tokens, v.min_tokens) == (64, 2)
        assert dict(s.logit_bias) == {"5": -100.0, "99": 2.5}  # map<string, float>
        assert dict(v.logit_bias) == {5: -100.0, 99: 2.5}  # map<int32, float>

    def test_defaults_are_explicit(self):
        sg, vl = both(req())
        assert sg.sampling_params.top_k == -1 and vl.sampling_params.top_k == 0
        assert sg.sampling_params.n == vl.sampling_params.n == 1
        assert not sg.return_logprob and sg.logprob_start_len == -1
        assert not vl.sampling_params.HasField("logprobs")
        assert not vl.sampling_params.HasField("prompt_logprobs")
        assert not vl.sampling_params.HasField("seed")
        assert sg.sampling_params.WhichOneof("constraint") is None
        assert vl.sampling_params.WhichOneof("constraint") is None
        assert not sg.require_reasoning and not vl.sampling_params.grammar_from_first_token

    def test_seed_goes_to_vllm_and_is_refused_by_sglang(self):
        request = req(SamplingParams(max_tokens=4, seed=42))
        assert VllmClient.build_request(request).sampling_params.seed == 42
        with pytest.raises(EngineError) as raised:
            SglangClient.build_request(request)
        assert raised.value.kind == errors.BAD_REQUEST and "seed" in raised.value.message

    @pytest.mark.parametrize(
        "sampling,field",
        [
            (SamplingParams(max_tokens=4, seed=2**31), "seed"),
            (SamplingParams(max_tokens=4, seed=-(2**31) - 1), "seed"),
            (SamplingParams(max_tokens=4, logit_bias={2**31: 1.0}), "logit_bias"),
            (SamplingParams(max_tokens=2**32), "max_tokens"),
            (SamplingParams(max_tokens=4, stop_token_ids=[-1]), "stop_token_ids"),
            (SamplingParams(max_tokens=4, n=0), "n"),
            (SamplingParams(max_tokens=4, min_tokens=-1), "min_tokens"),
        ],
    )
    def test_values_a_vllm_field_cannot_hold(self, sampling, field):
        with pytest.raises(EngineError) as raised:
            VllmClient.build_request(req(sampling))
        assert raised.value.kind == errors.BAD_REQUEST and field in raised.value.message

    @pytest.mark.parametrize(
        "sampling,field",
        [
            (SamplingParams(max_tokens=4, logit_bias={-3: 1.0}), "logit_bias"),
            (SamplingParams(max_tokens=4, top_k=2**31), "top_k"),
            (SamplingParams(max_tokens=4, stop_token_ids=[2**32]), "stop_token_ids"),
            (SamplingParams(max_tokens=4, n=2**32), "n"),
        ],
    )
    def test_values_an_sglang_field_cannot_hold(self, sampling, field):
        with pytest.raises(EngineError) as raised:
            SglangClient.build_request(req(sampling))
        assert raised.value.kind == errors.BAD_REQUEST and field in raised.value.message


SCHEMA = json.dumps({"type": "object", "properties": {"a": {"type": "string"}}})


def constrained(kind: str, value: str = "", choices=(), **fields) -> GenerateRequest:
    constraint = Constraint(kind=kind, value=value, choices=list(choices))
    return req(SamplingParams(max_tokens=8, constraint=constraint), **fields)


class TestConstraints:
    @pytest.mark.parametrize(
        "kind,value,sglang,vllm",
        [
            (m.CONSTRAINT_JSON_SCHEMA, SCHEMA, ("json_schema", SCHEMA), ("json_schema", SCHEMA)),
            (
                m.CONSTRAINT_JSON_OBJECT,
                "",
                ("json_schema", '{"type": "object"}'),
                ("json_object", True),
            ),
            (m.CONSTRAINT_REGEX, r"\d+", ("regex", r"\d+"), ("regex", r"\d+")),
            (m.CONSTRAINT_EBNF, 'root ::= "a"', ("ebnf_grammar", 'root ::= "a"'),
             ("grammar", 'root ::= "a"')),
            (m.CONSTRAINT_STRUCTURAL_TAG, "{}", ("structural_tag", "{}"), ("structural_tag", "{}")),
        ],
    )  # fmt: skip
    def test_each_kind_in_each_familys_oneof(self, kind, value, sglang, vllm):
        sg, vl = both(constrained(kind, value))
        field, expected = sglang
        assert sg.sampling_params.WhichOneof("constraint") == field
        assert getattr(sg.sampling_params, field) == expected
        field, expected = vllm
        assert vl.sampling_params.WhichOneof("constraint") == field
        assert getattr(vl.sampling_params, field) == expected

    def test_choice(self):
        choices = ["a.b", "x|y", "(z)", "plain text"]
        sg, vl = both(constrained(m.CONSTRAINT_CHOICE, choices=choices))
        assert list(vl.sampling_params.choice.choices) == choices
        assert sg.sampling_params.regex == r"(a\.b|x\|y|\(z\)|plain text)"
        assert sg.sampling_params.regex == choice_regex(choices)

    def test_escape_regex_matches_the_literal(self):
        import re

        for text in ["a.b*c", "[x]{2}", r"back\slash", "^$?+()"]:
            assert re.fullmatch(escape_regex(text), text)

    @pytest.mark.parametrize(
        "request_",
        [constrained("xml"), constrained(m.CONSTRAINT_CHOICE, choices=[])],
    )
    def test_unknown_kind_or_empty_choice_is_refused(self, request_):
        for client in (SglangClient, VllmClient):
            with pytest.raises(EngineError) as raised:
                client.build_request(request_)
            assert raised.value.kind == errors.BAD_REQUEST
            assert "constraint" in raised.value.message

    def test_reasoning(self):
        sg, vl = both(constrained(m.CONSTRAINT_JSON_OBJECT, reasoning=True))
        assert sg.require_reasoning and not vl.sampling_params.grammar_from_first_token
        sg, vl = both(constrained(m.CONSTRAINT_JSON_OBJECT, reasoning=False))
        assert not sg.require_reasoning and vl.sampling_params.grammar_from_first_token
        sg, _ = both(req(reasoning=True))
        assert sg.require_reasoning  # SGLang counts reasoning tokens without a constraint too


class TestLogprobOptions:
    def test_output_logprobs(self):
        sg, vl = both(req(logprobs=5))
        assert sg.return_logprob and sg.top_logprobs_num == 5 and sg.logprob_start_len == -1
        assert vl.sampling_params.logprobs == 5
        assert not vl.sampling_params.HasField("prompt_logprobs")

    def test_zero_alternatives_is_still_logprobs(self):
        sg, vl = both(req(logprobs=0))
        assert sg.return_logprob and sg.top_logprobs_num == 0
        assert vl.sampling_params.HasField("logprobs") and vl.sampling_params.logprobs == 0

    def test_prompt_logprobs(self):
        sg, vl = both(req(logprobs=1, prompt_logprobs=3))
        assert sg.return_logprob and sg.logprob_start_len == 0
        assert sg.top_logprobs_num == 3  # one count serves both on SGLang
        assert (vl.sampling_params.logprobs, vl.sampling_params.prompt_logprobs) == (1, 3)

    def test_prompt_logprobs_alone(self):
        sg, vl = both(req(prompt_logprobs=0))
        assert sg.return_logprob and sg.logprob_start_len == 0
        assert not vl.sampling_params.HasField("logprobs")
        assert vl.sampling_params.prompt_logprobs == 0


class TestEmbedRequests:
    def test_both_families(self):
        for client, pb in ((SglangClient, spb), (VllmClient, vpb)):
            built = client.build_embed_request("e", [4, 5, 6])
            assert isinstance(built, pb.EmbedRequest)
            assert built.request_id == "e" and list(built.tokenized.input_ids) == [4, 5, 6]
