"""/tokenize and /detokenize (vLLM's shapes): counts equal to what the generation endpoints
bill (usage.prompt_tokens, through the real `serve`), round trips, refusals by name."""

from __future__ import annotations

import orjson
import pytest

from switchyard.preprocessor.errors import RequestError
from switchyard.preprocessor.local_endpoints import detokenize, tokenize
from switchyard.preprocessor.stages.context import CHAT, COMPLETIONS, TOKENIZE, RequestContext
from switchyard.preprocessor.stages.endpoints import new_request
from switchyard.preprocessor.stages.tests.fakes import (
    MODEL,
    FakeDispatcher,
    FakeHttp,
    FakeRouter,
    deps,
    done,
    serve,
    tokens,
)

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is the weather in Paris, today and tomorrow?"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


@pytest.fixture
def d(bundle):
    def script(req):
        return [tokens(req.request_id, 7), done(req.request_id, "stop")]

    return deps(bundle, FakeRouter([1]), FakeDispatcher(script), context_length=4096)


def local(d) -> RequestContext:
    return new_request(d, TOKENIZE, FakeHttp(), request_id="tokenize-1", path="/tokenize")


async def call(handler, d, **body) -> dict:
    return orjson.loads(await handler(local(d), orjson.dumps(body)))


async def billed(d, endpoint: str, **body) -> int:
    """usage.prompt_tokens of a generation request with this body."""
    http = FakeHttp()
    status = await serve(d, endpoint, orjson.dumps({"model": MODEL, **body}), http)
    assert status == 200, http.body
    return int(http.json()["usage"]["prompt_tokens"])


class TestCountsAreWhatIsBilled:
    @pytest.mark.parametrize(
        "extra",
        [
            {},
            {"tools": TOOLS},
            {"add_generation_prompt": False},
            {"chat_template_kwargs": {"thinking": True}},
        ],
    )
    async def test_messages_count_usage_prompt_tokens(self, d, extra):
        got = await call(tokenize, d, model=MODEL, messages=MESSAGES, **extra)
        assert got["count"] == len(got["tokens"])
        assert got["count"] == await billed(d, CHAT, messages=MESSAGES, max_tokens=4, **extra)
        assert got["max_model_len"] == 4096 and got["token_strs"] is None

    async def test_prompt_counts_completions_usage(self, d):
        text = "Once upon a time, in a city of bridges,"
        got = await call(tokenize, d, model=MODEL, prompt=text)
        assert got["count"] == await billed(d, COMPLETIONS, prompt=text, max_tokens=4)

    async def test_model_may_be_left_out_with_one_model(self, d):
        got = await call(tokenize, d, prompt="hello")
        assert got["tokens"] == (await call(tokenize, d, model=MODEL, prompt="hello"))["tokens"]


class TestRoundTrips:
    async def test_detokenize_gives_the_rendered_prompt_back(self, d, bundle):
        got = await call(tokenize, d, messages=MESSAGES)
        text = (await call(detokenize, d, tokens=got["tokens"]))["prompt"]
        assert text.startswith("<｜begin▁of▁sentence｜>")  # special tokens kept
        assert (await call(tokenize, d, prompt=text, add_special_tokens=False))["tokens"] == (
            got["tokens"]
        )

    async def test_token_strs_are_the_vocabulary_entries(self, d, bundle):
        got = await call(tokenize, d, prompt="hello world", return_token_strs=True)
        assert got["token_strs"] == [bundle.tokenizer.id_to_token(i) for i in got["tokens"]]
        assert len(got["token_strs"]) == got["count"]

    async def test_empty_token_list(self, d):
        assert await call(detokenize, d, tokens=[]) == {"prompt": ""}


class TestRefused:
    @pytest.mark.parametrize(
        "body, param",
        [
            ({"prompt": "x", "messages": MESSAGES}, "prompt"),
            ({}, "prompt"),
            ({"messages": MESSAGES, "chat_template": "{{ x }}"}, "chat_template"),
            ({"messages": MESSAGES, "mm_processor_kwargs": {}}, "mm_processor_kwargs"),
            ({"prompt": "x", "tools": TOOLS}, "tools"),
            ({"prompt": "x", "temperature": 0}, "temperature"),
            (
                {
                    "messages": [
                        {
                            "role": "user",
                            "content": [{"type": "image_url", "image_url": {"url": "x"}}],
                        }
                    ]
                },
                "messages[0].content[0].type",
            ),  # fmt: skip
        ],
    )
    async def test_a_400_naming_the_field(self, d, body, param):
        with pytest.raises(RequestError) as err:
            await tokenize(local(d), orjson.dumps(body))
        assert err.value.status == 400 and err.value.param == param

    async def test_unknown_model_is_404(self, d):
        with pytest.raises(RequestError) as err:
            await tokenize(local(d), orjson.dumps({"model": "nope", "prompt": "x"}))
        assert err.value.status == 404

    async def test_a_token_past_the_vocabulary(self, d, bundle):
        with pytest.raises(RequestError) as err:
            await detokenize(local(d), orjson.dumps({"tokens": [1, bundle.vocab_size]}))
        assert err.value.status == 400 and err.value.param == "tokens[1]"


class TestSpecialTokens:
    def test_a_bos_adding_tokenizer(self, bundle, tmp_path):
        """with_special_tokens gives what encode(add_special_tokens=True) gives: what
        completions send (vLLM adds a Llama's BOS) and what /tokenize counts."""
        import shutil

        from tokenizers import processors

        from switchyard.preprocessor.tokenizer import TokenizerBundle, default_tokenizer_dir

        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(default_tokenizer_dir() / name, tmp_path / name)
        tok = TokenizerBundle.from_dir(tmp_path).tokenizer
        bos = "<｜begin▁of▁sentence｜>"
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))]
        )
        tok.save(str(tmp_path / "tokenizer.json"))
        with_bos = TokenizerBundle.from_dir(tmp_path)
        text = "Once upon a time"
        bare = with_bos.encode(text)
        assert with_bos.with_special_tokens(bare) == with_bos.encode(text, True)
        assert with_bos.with_special_tokens(bare)[0] == tok.token_to_id(bos)
        assert bundle.with_special_tokens(bare) == bare  # the DeepSeek one adds none


class TestOverHttp:
    """Through the edge: vLLM's paths and /v1's, client keys (Bearer or x-api-key), 405."""

    @pytest.fixture
    def edge(self, d):
        from switchyard.preprocessor.auth import Access, KeyRing
        from switchyard.preprocessor.edge import Edge

        async def app(scope, receive, send):
            raise AssertionError("not for the app")

        return Edge(app, d, 1 << 20, access=Access(KeyRing(["k1"])))

    @pytest.mark.parametrize("path", ["/tokenize", "/v1/tokenize"])
    @pytest.mark.parametrize("auth", [{"authorization": "Bearer k1"}, {"x-api-key": "k1"}])
    async def test_served_with_a_key(self, edge, path, auth):
        from switchyard.preprocessor.tests.asgi_client import post

        got = await post(edge, path, orjson.dumps({"prompt": "hi"}), auth)
        assert got.status == 200 and got.json()["count"] >= 1
        assert got.headers["x-request-id"].startswith("tokenize-")

    @pytest.mark.parametrize("path", ["/detokenize", "/v1/detokenize", "/tokenize"])
    async def test_refused_without_one(self, edge, path):
        from switchyard.preprocessor.tests.asgi_client import post

        got = await post(edge, path, orjson.dumps({"tokens": [1]}), {"x-api-key": "nope"})
        assert got.status == 401 and got.json()["error"]["code"] == "invalid_api_key"

    async def test_a_bad_body_is_a_400_with_the_openai_shape(self, edge):
        from switchyard.preprocessor.tests.asgi_client import post

        got = await post(edge, "/detokenize", b"{", {"x-api-key": "k1"})
        assert got.status == 400 and got.json()["error"]["code"] == "invalid_json"
