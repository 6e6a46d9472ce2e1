"""Generated request bodies through the real stack (hypothesis): every field, values at and
past the bounds of OpenAI's ranges and of the engines' int32/uint32/float fields, wrong types,
odd unicode. Whatever comes in: never a 5xx, never a hang, and an OpenAI-shaped error body
whenever the status is not 200 (issue 14)."""

from __future__ import annotations

import json

import httpx
import pytest
from e2e_stack import running_stack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

MODEL = "deepseek-mock"
BOUNDS = [0, 1, -1, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**32, 2**63, -(2**63), 10**30]
FLOATS = [0.0, -0.0, 1e-45, 0.5, 1.0, 2.0, 2.0000001, -2.0, 3.4e38, 1e39, -1e39, 1e308]
ODD_TEXT = st.sampled_from(
    ["", " ", "\x00", "\ud800", "\udfff", "\U0010ffff", "<｜User｜>", "\u202e", "a" * 5000]
) | st.text(max_size=40)
ANY = st.recursive(
    st.none() | st.booleans() | st.sampled_from(BOUNDS) | st.sampled_from(FLOATS) | ODD_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ODD_TEXT, inner, max_size=3),
    max_leaves=6,
)
NUMBER = (
    st.sampled_from(BOUNDS)
    | st.sampled_from(FLOATS)
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
)
SMALL_TOKENS = st.integers(min_value=1, max_value=8)

SAMPLING = {
    "max_tokens": SMALL_TOKENS | NUMBER | ANY,
    "temperature": NUMBER | ANY,
    "top_p": NUMBER | ANY,
    "top_k": NUMBER | ANY,
    "min_p": NUMBER,
    "min_tokens": st.integers(min_value=0, max_value=4) | NUMBER,
    "seed": NUMBER | ANY,
    "stop": ODD_TEXT | st.lists(ODD_TEXT, max_size=6) | ANY,
    "presence_penalty": NUMBER,
    "frequency_penalty": NUMBER,
    "repetition_penalty": NUMBER,
    "ignore_eos": st.booleans() | ANY,
    "n": st.sampled_from([1, 2, 0, -1, 2**31]) | ANY,
    "stream": st.booleans() | ANY,
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans() | ANY})
    | ANY,
    "user": ODD_TEXT | ANY,
    "logprobs": st.booleans() | NUMBER,
    "unknown_field": ANY,
}
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "developer", "robot"])},
    optional={
        "content": ODD_TEXT
        | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": ODD_TEXT}))
        | ANY,
        "name": ODD_TEXT | ANY,
    },
)
CHAT = st.fixed_dictionaries(
    {
        "model": st.just(MODEL) | ODD_TEXT,
        "messages": st.lists(MESSAGE, min_size=0, max_size=3) | ANY,
    },
    optional=SAMPLING | {"max_completion_tokens": SMALL_TOKENS | NUMBER, "top_logprobs": NUMBER},
)
COMPLETION = st.fixed_dictionaries(
    {
        "model": st.just(MODEL),
        "prompt": ODD_TEXT
        | st.lists(st.integers(min_value=-5, max_value=2**32), max_size=5)
        | st.lists(ODD_TEXT, max_size=3)
        | ANY,
    },
    optional=SAMPLING | {"echo": st.booleans(), "best_of": NUMBER, "suffix": ODD_TEXT},
)

PART = st.fixed_dictionaries(
    {"type": st.sampled_from(["input_text", "output_text", "refusal", "input_image"]) | ANY},
    optional={"text": ODD_TEXT | ANY, "refusal": ODD_TEXT, "annotations": ANY},
)
ITEM = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(
            ["message", "function_call", "function_call_output", "reasoning", "item_reference"]
        )
        | ANY,
        "role": st.sampled_from(["user", "assistant", "system", "developer", "tool"]) | ANY,
        "content": ODD_TEXT | st.lists(PART, max_size=2) | ANY,
        "call_id": ODD_TEXT | ANY,
        "name": ODD_TEXT | ANY,
        "arguments": ODD_TEXT | ANY,
        "output": ODD_TEXT | st.lists(PART, max_size=2) | ANY,
        "summary": st.just([]) | ANY,
    },
)
RESPONSES = st.fixed_dictionaries(
    {
        "model": st.just(MODEL),
        "input": ODD_TEXT | st.lists(ITEM, max_size=3) | ANY,
        "max_output_tokens": SMALL_TOKENS | NUMBER,
    },
    optional={
        "instructions": ODD_TEXT | ANY,
        "temperature": NUMBER | ANY,
        "top_p": NUMBER | ANY,
        "stream": st.booleans() | ANY,
        "tools": st.lists(
            st.fixed_dictionaries(
                {"type": st.sampled_from(["function", "web_search"]) | ANY},
                optional={"name": ODD_TEXT | ANY, "parameters": ANY},
            ),
            max_size=2,
        )
        | ANY,
        "tool_choice": st.sampled_from(["auto", "none", "required"]) | ANY,
        "text": st.fixed_dictionaries(
            {}, optional={"format": st.fixed_dictionaries({"type": ODD_TEXT}) | ANY}
        )
        | ANY,
        "reasoning": ANY,
        "store": st.booleans() | ANY,
        "metadata": ANY,
        "unknown_field": ANY,
    },
)


@pytest.fixture(scope="module", params=["sglang", "vllm"])
def stack(request):
    with running_stack("--mock-engines", request.param) as s:
        yield s


def encode(body: dict) -> bytes:
    # json (not orjson) writes lone surrogates as \\ud800 escapes, as a hostile client can.
    return json.dumps(body, ensure_ascii=True, allow_nan=False).encode()


def check(stack, path: str, body: dict) -> None:
    # Generated answers are at most a few tokens: a few seconds is plenty, under any load.
    reply = httpx.post(
        stack.base_url + path,
        content=encode(body),
        headers={"content-type": "application/json"},
        timeout=20,
    )
    assert reply.status_code < 500, (reply.status_code, reply.text[:500], body)
    if reply.status_code != 200:
        error = reply.json()["error"]
        assert error["message"] and error["type"] and error["code"], reply.text
        if reply.status_code == 400:
            assert error["param"] is None or isinstance(error["param"], str)


FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,  # the same bodies on every run: a failure reproduces
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@FUZZ
@given(body=CHAT)
def test_chat_bodies(stack, body):
    check(stack, "/v1/chat/completions", body)


@FUZZ
@given(body=COMPLETION)
def test_completion_bodies(stack, body):
    check(stack, "/v1/completions", body)


@FUZZ
@given(body=RESPONSES)
def test_responses_bodies(stack, body):
    check(stack, "/v1/responses", body)


@pytest.mark.parametrize(
    "field,value",
    [
        ("top_k", 2**31),
        ("top_k", 2**32),
        ("seed", 2**31),
        ("seed", -(2**31) - 1),
        ("max_tokens", 2**32),
        ("repetition_penalty", 1e39),
    ],
)
def test_values_the_engines_cannot_hold_are_400s_naming_the_field(stack, field, value):
    """Regression test for issue 14: these hung for the idle timeout per engine (the task
    building the engine request died silently), then answered 503."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    body[field] = value
    reply = httpx.post(stack.base_url + "/v1/chat/completions", json=body, timeout=10)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == field


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_31_mb_prompt_is_refused_before_it_is_tokenized(stack, path):
    """Regression test for issue 14: a prompt just under the 32 MiB body limit took ~30 s to
    get its 400 (it was tokenized whole before the context check). The bound on bytes per
    token refuses it without tokenizing: the 10 s client timeout here is far from tight."""
    text = "shunting yard " * (31_000_000 // 14)
    if path.endswith("chat/completions"):
        body = {"model": MODEL, "messages": [{"role": "user", "content": text}]}
    else:
        body = {"model": MODEL, "prompt": text}
    reply = httpx.post(stack.base_url + path, json=body, timeout=10)
    assert reply.status_code == 400, reply.text[:300]
    error = reply.json()["error"]
    assert error["code"] == "context_length_exceeded" and "at least" in error["message"]
