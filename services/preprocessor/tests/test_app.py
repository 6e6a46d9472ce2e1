"""The FastAPI app behind the edge (edge.Edge in front, as in production): the model objects of
/v1/models and /v1/models/{model}, and OpenAI-shaped HTTP errors."""

from __future__ import annotations

import httpx
import pytest

from switchyard.preprocessor.app import create_app
from switchyard.preprocessor.auth import Access, KeyRing
from switchyard.preprocessor.catalog import ModelEntry
from switchyard.preprocessor.edge import Edge

KEY = "sk-test-key"
MODELS = ("deepseek-ai/DeepSeek-V3", "yard-chat")


@pytest.fixture
async def state(offline_state):
    s = offline_state
    s.catalog = {name: ModelEntry(name, 4096, 1) for name in MODELS}
    yield s
    await s.dispatcher.close()
    await s.router.close()
    await s.fleet.close()


@pytest.fixture
async def client(state):
    """The app behind the edge, with a client key configured (no lifespan: nothing to run)."""
    edge = Edge(create_app(state), None, 1 << 20, access=Access(KeyRing([KEY])))
    headers = {"authorization": f"Bearer {KEY}"}
    transport = httpx.ASGITransport(edge)
    async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=headers) as c:
        yield c


class TestRetrieveModel:
    """Regression: GET /v1/models/{model} was 404 for a served model, so the openai SDK's
    `client.models.retrieve` raised NotFoundError."""

    @pytest.mark.parametrize("model", MODELS)
    async def test_the_object_the_list_has(self, client, model):
        listed = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
        reply = await client.get(f"/v1/models/{model}")
        assert reply.status_code == 200
        assert reply.headers["content-type"] == "application/json"
        assert reply.json() == listed[model]
        assert reply.json()["object"] == "model" and reply.json()["id"] == model

    async def test_a_slash_sent_percent_encoded(self, client):
        # The openai SDK quotes the id as one path segment: deepseek-ai%2FDeepSeek-V3.
        reply = await client.get("/v1/models/deepseek-ai%2FDeepSeek-V3")
        assert reply.status_code == 200
        assert reply.json()["id"] == "deepseek-ai/DeepSeek-V3"

    @pytest.mark.parametrize("model", ["gpt-9", "deepseek-ai/DeepSeek-R1", "yard-chat/extra"])
    async def test_an_unknown_model_is_404_model_not_found(self, client, model):
        reply = await client.get(f"/v1/models/{model}")
        assert reply.status_code == 404
        assert reply.json() == {
            "error": {
                "message": f"The model '{model}' does not exist.",
                "type": "not_found_error",
                "param": "model",
                "code": "model_not_found",
            }
        }

    async def test_needs_a_client_key_as_the_list_does(self, client):
        for path in ("/v1/models", "/v1/models/yard-chat", "/v1/models/nope"):
            for headers in ({"authorization": ""}, {"authorization": "Bearer sk-wrong"}):
                reply = await client.get(path, headers=headers)
                assert reply.status_code == 401
                assert reply.json()["error"]["code"] == "invalid_api_key"


class TestHttpErrors:
    async def test_a_wrong_method_is_405_with_allow(self, client):
        reply = await client.post("/v1/models/yard-chat")
        assert reply.status_code == 405
        assert reply.headers["allow"] == "GET"
        assert reply.json()["error"]["code"] == "method_not_allowed"

    async def test_an_unknown_path_is_404(self, client):
        reply = await client.get("/v1/nothing-here")
        assert reply.status_code == 404
        assert reply.json()["error"]["code"] == "not_found"

    async def test_without_a_store_stored_objects_are_404(self, client):
        """--store none: nothing is kept, so nothing can be read or deleted."""
        for method, path in [
            ("GET", "/v1/responses/resp_1"),
            ("DELETE", "/v1/responses/resp_1"),
            ("GET", "/v1/responses/resp_1/input_items"),
            ("GET", "/v1/conversations/conv_1"),
            ("POST", "/v1/conversations"),
        ]:
            reply = await client.request(method, path)
            assert reply.status_code == 404
            assert reply.json()["error"]["code"] == "store_disabled"

    @pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
    async def test_generation_paths_answer_405_to_other_methods(self, client, method):
        reply = await client.request(method, "/v1/chat/completions")
        assert reply.status_code == 405
        assert reply.headers["allow"] == "POST"
        assert reply.json()["error"]["code"] == "method_not_allowed"
