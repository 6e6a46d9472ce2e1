"""The OpenAI surface agents and apps send, end to end with the openai SDK through the real
stack, on both engine protocols (issue 10): tool-calling loops for every parser family
(auto, required, a named tool; streaming and not), reasoning split, structured output, n,
logprobs, completions echo, batched prompts and best_of.

One mock engine per model family, each with that family's chat template and a script that
makes it write the family's own tool-call and reasoning markup (tokenized with the real
tokenizer, so it arrives split at real token boundaries). The preprocessor picks each model's
parsers by itself from its template.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import openai
import pytest
from e2e_stack import Processes, running_stack
from support.mock_engine import tokenizer_dir_with_template

from switchyard.preprocessor.parsers.deepseek import (
    CALL_BEGIN,
    CALL_END,
    CALLS_BEGIN,
    CALLS_END,
    SEP,
)

TEMPLATES = Path(__file__).resolve().parent.parent / "services/preprocessor/tests/templates"
ARGS = {"city": "Paris"}
ARGS_TEXT = json.dumps(ARGS)
QUESTION = "What is the WEATHER? in Paris"
TOOL_RESULT = "sunny, 21C"
ANSWER = "It is sunny in Paris."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
        },
    },
]
V3_CALL = (
    f"{CALLS_BEGIN}{CALL_BEGIN}function{SEP}get_weather\n```json\n{ARGS_TEXT}\n```"
    f"{CALL_END}{CALLS_END}"
)
# model -> (template file or None for the bundled DeepSeek-V3 one, the call's markup, the
# reasoning the model writes first, if any); MODEL_TYPES: the family's config.json model_type
FAMILIES: dict[str, tuple[str | None, str, str]] = {
    "ds-v3": (None, V3_CALL, ""),
    "ds-r1": ("deepseek_r1.jinja", V3_CALL, "I should look the weather up."),
    "qwen3": (
        "qwen3.jinja",
        f'<tool_call>\n{{"name": "get_weather", "arguments": {ARGS_TEXT}}}\n</tool_call>',
        "",
    ),
    "llama3": (
        "llama31_json.jinja",
        f'<|python_tag|>{{"name": "get_weather", "parameters": {ARGS_TEXT}}}',
        "",
    ),
    "mistral": (
        "mistral_v03.jinja",
        f'[TOOL_CALLS] [{{"name": "get_weather", "arguments": {ARGS_TEXT}}}]',
        "",
    ),
    "kimi-k2": (
        "kimi_k2.jinja",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        f"<|tool_call_argument_begin|>{ARGS_TEXT}<|tool_call_end|><|tool_calls_section_end|>",
        "",
    ),
}
MODEL_TYPES = {
    "ds-r1": "deepseek_v3",
    "qwen3": "qwen3",
    "llama3": "llama",
    "mistral": "mistral",
    "kimi-k2": "kimi_k2",
}
# Constrained output starts at the first token on the mock (it runs no reasoning parser), so
# families that always reason first are not asked for required / named tool calls here.
CONSTRAINED = [m for m, (_, _, reasoning) in FAMILIES.items() if not reasoning]
THINKING = "Counting the tracks first."
EMBED_MODEL = "yard-embed"


def script(model: str) -> list[dict[str, str]]:
    _, call, reasoning = FAMILIES[model]
    think = f"<think>{reasoning}</think>" if reasoning else ""
    final_think = "<think>The tool answered.</think>" if reasoning else ""
    return [
        {"marker": "WEATHER?", "output": think + "Let me check." + call},
        {"marker": TOOL_RESULT, "output": final_think + ANSWER},
        {"marker": "THINK-QWEN", "output": f"<think>{THINKING}</think>Seven tracks."},
        {"marker": "THINK-R1", "output": f"{THINKING}</think>Seven tracks."},
    ]


@contextlib.contextmanager
def family_stack(protocol: str, tmp: Path, models=tuple(FAMILIES), embed: bool = True):
    """The real stack over one mock engine per model family in `models` (each with its
    family's template and script), plus the embedding engine; `.client` is an OpenAI
    client. Used by the Responses API's e2e tests too."""
    with Processes() as procs:
        pending = []
        for model in models:
            template = FAMILIES[model][0]
            rules = tmp / f"{model}.json"
            rules.write_text(json.dumps(script(model)))
            args = ["mock-engine", "--protocol", protocol, "--port", "0"]
            args += ["--model-name", model, "--script", str(rules), "--speedup", "8"]
            if template is not None:
                source = (TEMPLATES / template).read_text()
                folder = tokenizer_dir_with_template(tmp / model, source)
                (folder / "config.json").write_text(json.dumps({"model_type": MODEL_TYPES[model]}))
                args += ["--tokenizer", str(folder)]
            pending.append(procs.start_ready(f"engine-{model}", *args))
        if embed:
            pending.append(
                procs.start_ready(
                    "engine-embed",
                    "mock-engine",
                    "--protocol",
                    protocol,
                    "--port",
                    "0",
                    "--model-name",
                    EMBED_MODEL,
                    "--embedding",
                    "--embedding-dim",
                    "64",
                )  # fmt: skip
            )
        workers = []
        for ready in pending:
            workers += ["--worker", f"grpc://127.0.0.1:{ready.result()['port']}"]
        with running_stack(*workers) as s:
            s.client = openai.OpenAI(base_url=s.base_url + "/v1", api_key="x", max_retries=0)
            try:
                _wait_for_tokenizers(s.client, models)
                yield s
            finally:
                s.client.close()


@pytest.fixture(scope="module", params=["sglang", "vllm"])
def stack(request, tmp_path_factory):
    with family_stack(request.param, tmp_path_factory.mktemp(f"surface-{request.param}")) as s:
        yield s


def _wait_for_tokenizers(client: openai.OpenAI, models=tuple(FAMILIES)) -> None:
    """The stack is ready once one model's tokenizer is in; the others follow."""
    import time

    for model in models:
        for _ in range(100):
            try:
                client.completions.create(model=model, prompt="x", max_tokens=1)
                break
            except openai.APIStatusError as exc:
                assert exc.status_code == 503, exc
                time.sleep(0.2)


def streamed(stream) -> dict:
    """Accumulate a streamed chat completion the way SDK users do."""
    content, reasoning, calls, finish, first_delta = "", "", {}, None, None
    for chunk in stream:
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            reasoning += getattr(delta, "reasoning_content", None) or ""
            for call in delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"id": None, "name": None, "arguments": ""})
                if call.id:
                    entry["id"] = call.id
                if call.function and call.function.name:
                    assert entry["name"] is None, "a call's name comes once, first"
                    assert entry["arguments"] == "", "the name comes before the arguments"
                    entry["name"] = call.function.name
                if call.function and call.function.arguments:
                    assert entry["name"] is not None, "arguments before the name"
                    entry["arguments"] += call.function.arguments
                if first_delta is None:
                    first_delta = call
            if choice.finish_reason:
                finish = choice.finish_reason
    return {"content": content, "reasoning": reasoning, "calls": calls, "finish": finish}


MARKUP = ("<tool_call>", "TOOL_CALLS", "python_tag", "tool_call_begin", "tool▁call", "<think>")


def no_markup(text: str | None) -> None:
    for marker in MARKUP:
        assert marker not in (text or ""), text


class TestToolLoop:
    @pytest.mark.parametrize("model", list(FAMILIES))
    def test_auto_call_then_final_answer(self, stack, model):
        messages = [{"role": "user", "content": QUESTION}]
        first = stack.client.chat.completions.create(
            model=model, messages=messages, tools=TOOLS, max_tokens=120
        )
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls"
        (call,) = choice.message.tool_calls
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == ARGS
        assert choice.message.content == "Let me check."
        if FAMILIES[model][2]:
            assert choice.message.reasoning_content == FAMILIES[model][2]
        messages += [
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": TOOL_RESULT},
        ]
        final = stack.client.chat.completions.create(
            model=model, messages=messages, tools=TOOLS, max_tokens=60
        )
        assert final.choices[0].finish_reason == "stop"
        assert final.choices[0].message.content == ANSWER
        assert not final.choices[0].message.tool_calls
        # The history's call and result reached the prompt: it is longer than the question's.
        assert final.usage.prompt_tokens > first.usage.prompt_tokens

    @pytest.mark.parametrize("model", list(FAMILIES))
    def test_auto_streamed(self, stack, model):
        stream = stack.client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": QUESTION}],
            tools=TOOLS,
            max_tokens=120,
            stream=True,
        )
        got = streamed(stream)
        assert got["finish"] == "tool_calls"
        assert got["content"] == "Let me check."
        no_markup(got["content"])
        (call,) = got["calls"].values()
        assert call["name"] == "get_weather" and call["id"]
        assert json.loads(call["arguments"]) == ARGS
        assert got["reasoning"] == FAMILIES[model][2]

    @pytest.mark.parametrize("model", CONSTRAINED)
    @pytest.mark.parametrize("stream", [False, True])
    @pytest.mark.parametrize(
        "tool_choice", ["required", {"type": "function", "function": {"name": "get_time"}}]
    )
    def test_required_and_named(self, stack, model, stream, tool_choice):
        """The engine is constrained to the tools' JSON: a call is certain, not hoped for."""
        reply = stack.client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "anything at all"}],
            tools=TOOLS,
            tool_choice=tool_choice,
            max_tokens=400,
            stream=stream,
        )
        if stream:
            got = streamed(reply)
            calls = [(c["name"], c["arguments"]) for c in got["calls"].values()]
            finish = got["finish"]
            no_markup(got["content"])
        else:
            message = reply.choices[0].message
            calls = [(c.function.name, c.function.arguments) for c in message.tool_calls]
            finish = reply.choices[0].finish_reason
        assert finish == "tool_calls" and calls
        for name, arguments in calls:
            assert name in {"get_weather", "get_time"}
            assert isinstance(json.loads(arguments), dict)
        if isinstance(tool_choice, dict):
            assert [name for name, _ in calls] == ["get_time"]

    def test_tool_choice_none_leaves_markup_as_text(self, stack):
        reply = stack.client.chat.completions.create(
            model="qwen3",
            messages=[{"role": "user", "content": QUESTION}],
            tools=TOOLS,
            tool_choice="none",
            max_tokens=120,
        )
        assert reply.choices[0].finish_reason == "stop"
        assert not reply.choices[0].message.tool_calls
        assert "<tool_call>" in reply.choices[0].message.content


NAMED = {"type": "function", "function": {"name": "get_time"}}


class TestToolCallCutOff:
    """Regression: a required / named tool call cut off by max_tokens spilled its raw JSON
    into `content` (named, not streamed: '{"city": "stone echo'; required, both ways:
    '[{"name": "get_weather", "' or ', {"name": ...' after a complete call). As vLLM: the
    named output is the call's arguments whatever their completeness; a required list keeps
    its complete calls and its last call once its name and arguments began (truncated
    arguments); finish_reason stays "length"; streamed and whole answers agree."""

    def ask(self, stack, model, tool_choice, max_tokens, stream):
        reply = stack.client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "anything at all"}],
            tools=TOOLS,
            tool_choice=tool_choice,
            max_tokens=max_tokens,
            temperature=0,  # the same output every time: the cuts are prefixes of it
            stream=stream,
        )
        if stream:
            got = streamed(reply)
            calls = [(c["name"], c["arguments"]) for c in got["calls"].values()]
            return got["content"], calls, got["finish"], None
        choice = reply.choices[0]
        message = choice.message
        calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
        return message.content or "", calls, choice.finish_reason, reply.usage

    @pytest.mark.parametrize("model", ["ds-v3", "qwen3"])
    @pytest.mark.parametrize("tool_choice", ["required", NAMED], ids=["required", "named"])
    def test_cut_by_max_tokens(self, stack, model, tool_choice):
        _, full, finish, usage = self.ask(stack, model, tool_choice, 400, False)
        assert finish == "tool_calls" and full
        n = usage.completion_tokens
        for max_tokens in sorted({1, 2, n // 3, n // 2, n - 2, n - 1}):
            if not 0 < max_tokens < n:
                continue
            whole = self.ask(stack, model, tool_choice, max_tokens, False)
            content, calls, finish, _ = whole
            where = f"max_tokens={max_tokens} of {n}: {whole[:3]}"
            assert content == "" and finish == "length", where
            assert self.ask(stack, model, tool_choice, max_tokens, True)[:3] == whole[:3]
            assert len(calls) <= len(full), where
            for (name, arguments), (full_name, full_arguments) in zip(calls, full, strict=False):
                assert name == full_name and full_arguments.startswith(arguments), where
            if tool_choice is NAMED or max_tokens == n - 1:
                assert calls, where  # the named output, or the list but its last token


class TestReasoning:
    @pytest.mark.parametrize("stream", [False, True])
    def test_r1_template_opens_the_block(self, stack, stream):
        """R1's template ends the prompt inside <think>: the output starts in reasoning."""
        reply = stack.client.chat.completions.create(
            model="ds-r1",
            messages=[{"role": "user", "content": "THINK-R1 how many tracks?"}],
            max_tokens=60,
            stream=stream,
            stream_options={"include_usage": True} if stream else None,
        )
        if stream:
            chunks = list(reply)
            got = streamed(chunks)
            content, reasoning = got["content"], got["reasoning"]
            usage = chunks[-1].usage
        else:
            content = reply.choices[0].message.content
            reasoning = reply.choices[0].message.reasoning_content
            usage = reply.usage
        assert (reasoning, content) == (THINKING, "Seven tracks.")
        assert usage.completion_tokens_details.reasoning_tokens > 0

    @pytest.mark.parametrize("enable_thinking", [True, False])
    def test_qwen3_switch(self, stack, enable_thinking):
        reply = stack.client.chat.completions.create(
            model="qwen3",
            messages=[{"role": "user", "content": "THINK-QWEN how many tracks?"}],
            max_tokens=60,
            extra_body={"chat_template_kwargs": {"enable_thinking": enable_thinking}},
        )
        message = reply.choices[0].message
        if enable_thinking:
            assert (message.reasoning_content, message.content) == (THINKING, "Seven tracks.")
        else:  # thinking off: nothing is taken as reasoning
            assert getattr(message, "reasoning_content", None) is None
            assert message.content == f"<think>{THINKING}</think>Seven tracks."

    def test_separate_reasoning_off(self, stack):
        reply = stack.client.chat.completions.create(
            model="ds-r1",
            messages=[{"role": "user", "content": "THINK-R1 how many tracks?"}],
            max_tokens=60,
            extra_body={"separate_reasoning": False},
        )
        assert reply.choices[0].message.content == f"{THINKING}</think>Seven tracks."


class TestStructuredOutput:
    SCHEMA = {
        "type": "object",
        "properties": {
            "track": {"type": "integer", "minimum": 1, "maximum": 9},
            "name": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["track", "name"],
        "additionalProperties": False,
    }

    @pytest.mark.parametrize("stream", [False, True])
    def test_json_schema(self, stack, stream):
        reply = stack.client.chat.completions.create(
            model="ds-v3",
            messages=[{"role": "user", "content": "a train as JSON"}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "train", "schema": self.SCHEMA, "strict": True},
            },
            max_tokens=300,
            stream=stream,
        )
        text = streamed(reply)["content"] if stream else reply.choices[0].message.content
        value = json.loads(text)
        assert set(value) <= {"track", "name", "tags"} and {"track", "name"} <= set(value)
        assert isinstance(value["track"], int) and 1 <= value["track"] <= 9
        assert isinstance(value["name"], str)

    def test_json_object_and_choice(self, stack):
        reply = stack.client.chat.completions.create(
            model="ds-v3",
            messages=[{"role": "user", "content": "JSON please"}],
            response_format={"type": "json_object"},
            max_tokens=300,
        )
        assert isinstance(json.loads(reply.choices[0].message.content), dict)
        reply = stack.client.chat.completions.create(
            model="ds-v3",
            messages=[{"role": "user", "content": "yes or no"}],
            max_tokens=20,
            extra_body={"guided_choice": ["yes", "no"]},
        )
        assert reply.choices[0].message.content in ("yes", "no")

    def test_regex(self, stack):
        reply = stack.client.completions.create(
            model="ds-v3",
            prompt="a track code:",
            max_tokens=20,
            extra_body={"regex": "T[0-9]{3}"},
        )
        import re

        assert re.fullmatch("T[0-9]{3}", reply.choices[0].text)

    @pytest.mark.parametrize(
        ("extra", "param"),
        [
            (
                {"response_format": {"type": "json_schema",
                                     "json_schema": {"name": "x", "schema": {"type": "wat"}}}},
                "response_format",
            ),
            ({"extra_body": {"regex": "[ab"}}, "regex"),
            (
                {"tools": [{"type": "function",
                            "function": {"name": "f", "parameters": {"type": "wat"}}}],
                 "tool_choice": "required"},
                "tools",
            ),
        ],
    )  # fmt: skip
    def test_a_constraint_the_engine_refuses_is_named(self, stack, extra, param):
        with pytest.raises(openai.BadRequestError) as info:
            stack.client.chat.completions.create(
                model="ds-v3", messages=[{"role": "user", "content": "hi"}], max_tokens=5, **extra
            )
        assert (info.value.body["code"], info.value.body["param"]) == ("engine_rejected", param)


class TestSampling:
    def test_n_choices(self, stack):
        reply = stack.client.chat.completions.create(
            model="ds-v3",
            messages=[{"role": "user", "content": "say something"}],
            n=3,
            max_tokens=6,
            temperature=1.0,
            extra_body={"ignore_eos": True},
        )
        assert [c.index for c in reply.choices] == [0, 1, 2]
        assert len({c.message.content for c in reply.choices}) == 3  # distinct samples
        assert reply.usage.completion_tokens == 18

    def test_n_choices_streamed_interleave(self, stack):
        stream = stack.client.chat.completions.create(
            model="ds-v3",
            messages=[{"role": "user", "content": "say something"}],
            n=2,
            max_tokens=6,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        texts, finished = {0: "", 1: ""}, set()
        for chunk in stream:
            for choice in chunk.choices:
                texts[choice.index] += choice.delta.content or ""
                if choice.finish_reason:
                    finished.add(choice.index)
        assert finished == {0, 1} and all(texts.values())

    def test_logprobs(self, stack):
        reply = stack.client.chat.completions.create(
            model="ds-v3",
            messages=[{"role": "user", "content": "hi"}],
            logprobs=True,
            top_logprobs=3,
            max_tokens=5,
            extra_body={"ignore_eos": True},
        )
        entries = reply.choices[0].logprobs.content
        assert len(entries) == 5
        assert "".join(e.token for e in entries) == reply.choices[0].message.content
        for entry in entries:
            assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
            tops = [t.logprob for t in entry.top_logprobs]
            assert tops == sorted(tops, reverse=True)
            assert entry.token in {t.token for t in entry.top_logprobs}  # the mock's argmax

    def test_logit_bias_changes_the_choice(self, stack):
        def first_token(**extra) -> str:
            reply = stack.client.completions.create(
                model="ds-v3",
                prompt="The yard master",
                max_tokens=1,
                temperature=0,
                logprobs=0,
                extra_body={"ignore_eos": True},
                **extra,
            )
            (token,) = reply.choices[0].logprobs.tokens
            return token

        token = first_token()
        banned = _token_id(stack, token)
        # Ban the token the model picks: it must pick another; force one: it must take it.
        assert first_token(logit_bias={str(banned): -100}) != token
        forced = _token_id(stack, " freight")
        assert first_token(logit_bias={str(forced): 100}) == " freight"


def _token_id(stack, text: str) -> int:
    from switchyard.preprocessor.tokenizer import TokenizerBundle, default_tokenizer_dir

    (token_id,) = TokenizerBundle.from_dir(default_tokenizer_dir()).encode(text)
    return token_id


class TestCompletions:
    def test_echo_with_logprobs(self, stack):
        reply = stack.client.completions.create(
            model="ds-v3", prompt="Once upon a time", max_tokens=3, echo=True, logprobs=2
        )
        choice = reply.choices[0]
        assert choice.text.startswith("Once upon a time")
        lp = choice.logprobs
        tokens = lp.tokens
        eos = "<｜end▁of▁sentence｜>"
        if choice.finish_reason == "stop":
            assert tokens[-1] == eos
        if tokens[-1] == eos:
            # As vLLM: an emitted EOS has its logprob entry, not its text. It can also be the
            # last token of a "length" finish (the length check runs before the EOS check).
            tokens = tokens[:-1]
        assert "".join(tokens) == choice.text
        assert lp.token_logprobs[0] is None  # nothing precedes the first prompt token
        assert len(lp.tokens) == reply.usage.prompt_tokens + reply.usage.completion_tokens
        assert lp.text_offset == sorted(lp.text_offset)

    def test_eos_drawn_at_the_length_limit(self, stack):
        # The length check runs before the EOS check (SGLang, vLLM): an EOS drawn as the last
        # allowed token ends the output by "length", keeps its logprob entry, adds no text.
        eos = _token_id(stack, "<｜end▁of▁sentence｜>")
        reply = stack.client.completions.create(
            model="ds-v3", prompt="Once upon a time", max_tokens=1, echo=True, logprobs=1,
            logit_bias={str(eos): 100},
        )  # fmt: skip
        choice = reply.choices[0]
        assert choice.finish_reason == "length"
        assert choice.logprobs.tokens[-1] == "<｜end▁of▁sentence｜>"
        assert "".join(choice.logprobs.tokens[:-1]) == choice.text

    def test_batched_prompts(self, stack):
        reply = stack.client.completions.create(
            model="ds-v3", prompt=["The first train", "The second train"], max_tokens=4, n=2
        )
        assert [c.index for c in reply.choices] == [0, 1, 2, 3]
        single = stack.client.completions.create(
            model="ds-v3", prompt="The second train", max_tokens=4, temperature=0
        )
        batch = stack.client.completions.create(
            model="ds-v3", prompt=["The first train", "The second train"], max_tokens=4,
            temperature=0,
        )  # fmt: skip
        assert batch.choices[1].text == single.choices[0].text

    def test_best_of(self, stack):
        reply = stack.client.completions.create(
            model="ds-v3", prompt="Pick a track", max_tokens=4, n=2, best_of=4
        )
        assert [c.index for c in reply.choices] == [0, 1]
        # best_of ranks by logprobs; the client who did not ask for them gets none
        assert [c.logprobs for c in reply.choices] == [None, None]
        reply = stack.client.completions.create(
            model="ds-v3", prompt="Pick a track", max_tokens=4, n=2, best_of=4, logprobs=1
        )
        assert all(len(c.logprobs.tokens) >= 1 for c in reply.choices)


class TestRefusals:
    @pytest.mark.parametrize(
        "extra,param",
        [
            ({"store": True}, "store"),
            ({"tool_choice": "required"}, "tool_choice"),
            ({"reasoning_effort": "high"}, "reasoning_effort"),
            ({"some_future_field": 1}, "some_future_field"),
        ],
    )
    def test_fields_that_cannot_take_effect_are_400s_naming_them(self, stack, extra, param):
        with pytest.raises(openai.BadRequestError) as info:
            stack.client.chat.completions.create(
                model="ds-v3",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=2,
                extra_body=extra,
            )
        assert info.value.body["param"] == param


class TestEmbeddings:
    def test_floats_for_a_batch(self, stack):
        reply = stack.client.embeddings.create(
            model=EMBED_MODEL, input=["the night freight", "track seven", "the night freight"]
        )
        vectors = [item.embedding for item in reply.data]
        assert [item.index for item in reply.data] == [0, 1, 2]
        assert all(len(v) == 64 for v in vectors)
        assert vectors[0] == vectors[2] != vectors[1]  # deterministic per input
        assert abs(sum(x * x for x in vectors[0]) - 1.0) < 1e-3  # the mock's unit vectors
        assert reply.usage.prompt_tokens > 0

    def test_base64_is_the_same_vector(self, stack):
        import base64
        from array import array

        as_floats = stack.client.embeddings.create(model=EMBED_MODEL, input="signal box")
        raw = httpx_post(stack, {"model": EMBED_MODEL, "input": "signal box",
                                 "encoding_format": "base64"})  # fmt: skip
        values = array("f")
        values.frombytes(base64.b64decode(raw["data"][0]["embedding"]))
        assert values.tolist() == pytest.approx(as_floats.data[0].embedding)

    def test_token_ids_and_dimensions(self, stack):
        reply = stack.client.embeddings.create(model=EMBED_MODEL, input=[[5, 6, 7]], dimensions=64)
        assert len(reply.data[0].embedding) == 64
        with pytest.raises(openai.BadRequestError) as info:
            stack.client.embeddings.create(model=EMBED_MODEL, input="x", dimensions=32)
        assert info.value.body["param"] == "dimensions"

    def test_kinds_do_not_mix(self, stack):
        with pytest.raises(openai.BadRequestError) as info:
            stack.client.embeddings.create(model="ds-v3", input="x")
        assert info.value.body["code"] == "model_not_supported"
        with pytest.raises(openai.BadRequestError) as info:
            stack.client.chat.completions.create(
                model=EMBED_MODEL, messages=[{"role": "user", "content": "hi"}]
            )
        assert info.value.body["code"] == "model_not_supported"


def httpx_post(stack, body: dict) -> dict:
    import httpx

    reply = httpx.post(stack.base_url + "/v1/embeddings", json=body, timeout=30)
    reply.raise_for_status()
    return reply.json()
