"""End to end: `switchyard up` with a mock engine of each protocol, driven by the openai SDK."""

from __future__ import annotations

import socket

import httpx
import openai
import pytest
from e2e_stack import running_stack

MODEL = "deepseek-mock"
PROTOCOLS = ["sglang", "vllm"]
QUESTION = [{"role": "user", "content": "Tell me about rail yards."}]
_outputs: dict[str, dict[str, str]] = {}


@pytest.fixture(scope="module", params=PROTOCOLS)
def stack(request):
    with running_stack("--mock-engines", request.param) as s:
        s.protocol = request.param
        yield s


@pytest.fixture
def client(stack):
    with openai.OpenAI(base_url=stack.base_url + "/v1", api_key="none", max_retries=0) as c:
        yield c


class TestModels:
    def test_lists_the_served_model(self, client):
        ids = [m.id for m in client.models.list().data]
        assert ids == [MODEL]

    def test_retrieves_the_served_model(self, client):
        model = client.models.retrieve(MODEL)
        assert model == client.models.list().data[0]
        assert (model.id, model.object, model.owned_by) == (MODEL, "model", "switchyard")
        with pytest.raises(openai.NotFoundError) as caught:
            client.models.retrieve("no-such/model")
        assert caught.value.code == "model_not_found"


class TestChat:
    def test_non_streaming(self, client, stack):
        reply = client.chat.completions.create(
            model=MODEL, messages=QUESTION, max_tokens=24, temperature=0
        )
        choice = reply.choices[0]
        assert choice.message.role == "assistant"
        assert choice.message.content
        assert choice.finish_reason in ("stop", "length")
        assert reply.usage.completion_tokens <= 24
        assert reply.usage.prompt_tokens > 5
        assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
        _outputs.setdefault("chat", {})[stack.protocol] = choice.message.content

    def test_streaming_matches_non_streaming(self, client):
        kwargs = dict(model=MODEL, messages=QUESTION, max_tokens=24, temperature=0)
        whole = client.chat.completions.create(**kwargs).choices[0].message.content
        stream = client.chat.completions.create(
            stream=True, stream_options={"include_usage": True}, **kwargs
        )
        parts, finish, usage, roles = [], None, None, []
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                if choice.delta.role:
                    roles.append(choice.delta.role)
                if choice.delta.content:
                    parts.append(choice.delta.content)
                if choice.finish_reason:
                    finish = choice.finish_reason
        assert roles == ["assistant"]
        assert "".join(parts) == whole
        assert finish in ("stop", "length")
        assert usage is not None and usage.completion_tokens >= 1
        assert usage.prompt_tokens_details.cached_tokens >= 0

    def test_max_tokens_gives_length(self, client):
        reply = client.chat.completions.create(
            model=MODEL,
            messages=QUESTION,
            max_tokens=3,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        assert reply.choices[0].finish_reason == "length"
        assert reply.usage.completion_tokens == 3

    def test_stop_string_is_trimmed(self, client):
        kwargs = dict(
            model=MODEL,
            messages=QUESTION,
            max_tokens=40,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        full = client.chat.completions.create(**kwargs).choices[0].message.content
        assert len(full) > 10
        stop = full[5:8]
        cut = full[: full.index(stop)]
        reply = client.chat.completions.create(stop=[stop], **kwargs)
        assert reply.choices[0].message.content == cut
        assert reply.choices[0].finish_reason == "stop"
        streamed = client.chat.completions.create(stop=[stop], stream=True, **kwargs)
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == cut


class TestCompletions:
    def test_non_streaming_and_streaming_agree(self, client, stack):
        kwargs = dict(model=MODEL, prompt="The switchyard at dawn", max_tokens=16, temperature=0)
        whole = client.completions.create(**kwargs)
        assert whole.choices[0].text
        assert whole.usage.completion_tokens <= 16
        streamed = client.completions.create(stream=True, **kwargs)
        assert "".join(c.choices[0].text for c in streamed if c.choices) == whole.choices[0].text
        _outputs.setdefault("completion", {})[stack.protocol] = whole.choices[0].text

    def test_token_id_prompt(self, client):
        reply = client.completions.create(
            model=MODEL,
            prompt=[100, 200, 300],
            max_tokens=4,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        assert reply.usage.prompt_tokens == 3
        assert reply.usage.completion_tokens == 4


class TestErrors:
    def _post(self, stack, path, body, **kw):
        return httpx.post(
            stack.base_url + path,
            content=body,
            timeout=30,
            headers={"content-type": "application/json"},
            **kw,
        )

    def _error(self, reply, status, code=None):
        assert reply.status_code == status, reply.text
        error = reply.json()["error"]
        assert set(error) >= {"message", "type", "code"}
        assert error["message"]
        if code:
            assert error["code"] == code
        return error

    def test_malformed_json(self, stack):
        self._error(self._post(stack, "/v1/chat/completions", b"{not json"), 400, "invalid_json")

    def test_missing_messages(self, stack):
        self._error(
            self._post(stack, "/v1/chat/completions", b'{"model": "deepseek-mock"}'),
            400,
            "missing_field",
        )

    def test_unknown_model(self, client):
        with pytest.raises(openai.NotFoundError) as info:
            client.chat.completions.create(model="no-such-model", messages=QUESTION)
        assert info.value.body["code"] == "model_not_found"

    def test_prompt_over_context(self, client):
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model=MODEL, prompt=list(range(100, 9300)), max_tokens=1)
        assert info.value.body["code"] == "context_length_exceeded"

    @pytest.mark.parametrize("max_tokens", [0, -1, 10**7])
    def test_max_tokens_out_of_range(self, client, max_tokens):
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=max_tokens)

    @pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
    def test_a_completion_longer_than_the_context_names_its_field(self, client, field):
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=MODEL, messages=QUESTION, **{field: 9000})
        assert (info.value.body["code"], info.value.body["param"]) == (
            "context_length_exceeded",
            field,
        )

    @pytest.mark.parametrize(
        ("fields", "param"),
        [
            ({"stream_options": {"include_usage": True}}, "stream_options"),
            ({"tool_choice": "auto"}, "tool_choice"),
            ({"parallel_tool_calls": False}, "parallel_tool_calls"),
        ],
    )
    def test_fields_with_nothing_to_act_on(self, client, fields, param):
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2, **fields)
        assert info.value.body["param"] == param

    @pytest.mark.parametrize(
        "field,value",
        [
            ("temperature", -1),
            ("temperature", 3),
            ("top_p", 0),
            ("top_p", 1.5),
            ("n", 0),
            ("n", 129),
        ],
    )
    def test_bad_sampling_values(self, client, field, value):
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model=MODEL, messages=QUESTION, **{field: value})

    @pytest.mark.parametrize(
        ("path", "fields", "param"),
        [
            ("/v1/chat/completions", '"guided_json": {"enum": [%s]}', "guided_json"),
            (
                "/v1/chat/completions",
                '"tools": [{"type": "function", "function": {"name": "f", '
                '"parameters": {"enum": [%s]}}}]',
                "tools[0].function.parameters",
            ),
            ("/v1/chat/completions", '"chat_template_kwargs": {"a": %s}', None),  # undecodable
            ("/v1/completions", '"response_format": {"type": "json_schema", "json_schema": '
             '{"name": "x", "schema": {"enum": [%s]}}}', "response_format.json_schema.schema"),
            ("/v1/responses", '"text": {"format": {"type": "json_schema", "name": "x", '
             '"schema": {"enum": [%s]}}}', "text.format.schema"),
            ("/debug/route", '"chat_template_kwargs": {"a": %s}', None),
        ],
    )  # fmt: skip
    def test_deeply_nested_values(self, stack, path, fields, param):
        """Nesting orjson cannot write (over 254 levels) or msgspec cannot read (~1000): a 400
        naming the field, or invalid_json, on a keep-alive connection that goes on serving."""
        depth = 300 if param else 5000
        head = '"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2'
        if path == "/v1/completions":
            head = '"prompt": "hi", "max_tokens": 2'
        elif path == "/v1/responses":
            head = '"input": "hi", "max_output_tokens": 2'
        value = "[" * depth + "1" + "]" * depth
        body = f'{{"model": "{MODEL}", {head}, {fields % value}}}'
        with httpx.Client(base_url=stack.base_url, timeout=30) as http:
            for stream in (False, True) if path.startswith("/v1") else (False,):
                sent = body[:-1] + ', "stream": true}' if stream else body
                reply = http.post(path, content=sent, headers={"content-type": "application/json"})
                error = self._error(reply, 400, "invalid_value" if param else "invalid_json")
                assert error["param"] == param
            assert http.get("/v1/models").status_code == 200

    def test_a_compressed_body_is_415(self, stack):
        import gzip

        body = gzip.compress(b'{"model": "deepseek-mock", "prompt": "hi", "max_tokens": 2}')
        headers = {"content-type": "application/json", "content-encoding": "gzip"}
        reply = httpx.post(stack.base_url + "/v1/completions", content=body, headers=headers)
        self._error(reply, 415, "unsupported_content_encoding")
        assert reply.headers["accept-encoding"] == "identity"

    def test_unknown_path_is_openai_shaped(self, stack):
        self._error(httpx.get(stack.base_url + "/v1/nope"), 404)


def test_both_protocols_give_the_same_tokens():
    """The mock engines are deterministic per context, whatever protocol they speak."""
    for kind, by_protocol in _outputs.items():
        if len(by_protocol) == 2:
            assert by_protocol["sglang"] == by_protocol["vllm"], kind


def test_no_engine_available_is_503():
    """An engine URL that does not answer: the stack serves, but requests get 503."""
    from switchyard.preprocessor.tokenizer import default_tokenizer_dir

    # A bound socket that never listens refuses connections, and its port stays ours.
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        dead = f"grpc://127.0.0.1:{hole.getsockname()[1]}"
        tokenizer = str(default_tokenizer_dir())
        with running_stack("--worker", dead, "--tokenizer", tokenizer, ready=False) as stack:
            assert httpx.get(stack.base_url + "/ready").status_code == 503
            reply = httpx.post(
                stack.base_url + "/v1/chat/completions",
                timeout=30,
                json={"model": MODEL, "messages": QUESTION},
            )
            assert reply.status_code == 503, reply.text
            assert reply.json()["error"]["code"] == "no_engine_available"


class TestMetrics:
    def test_preprocessor_metrics(self, client, stack):
        # Streamed (a whole reply has no TTFT) and 4 tokens for sure, so that the test holds
        # on its own, whatever ran before it on this stack.
        for _chunk in client.chat.completions.create(
            model=MODEL, messages=QUESTION, max_tokens=4, stream=True,
            extra_body={"ignore_eos": True},
        ):  # fmt: skip
            pass
        text = httpx.get(stack.base_url + "/metrics").text
        assert (
            "switchyard_preprocessor_requests_total"
            f'{{endpoint="chat_completions",model="{MODEL}",status="200"}}' in text
        )
        assert "switchyard_preprocessor_time_to_first_token_seconds_count" in text
        count = next(
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith(f'switchyard_preprocessor_output_tokens_total{{model="{MODEL}"}}')
        )
        assert count >= 4
