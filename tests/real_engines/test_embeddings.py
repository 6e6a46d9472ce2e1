"""/v1/embeddings through Switchyard on a real pooling engine (`--runner pooling --convert
embed`), against the servicer's own Embed answers on the same engine: the same vectors, bit
for bit, and the same token counts. (vLLM's own /v1/embeddings would need a fifth engine,
an HTTP pooling one: not in the CI budget.)"""

from __future__ import annotations

import array
import base64
import uuid
from collections.abc import Iterator

import httpx
import openai
import pytest
from direct import stub
from e2e_stack import Stack, running_stack
from engines import EMBED_MODEL
from smg_grpc_proto import vllm_engine_pb2 as pb

pytestmark = pytest.mark.timeout(600)
TEXTS = ["The coal train takes track three.", "Grain cars wait on the siding."]


@pytest.fixture(scope="module")
def embed_stack(grpc_e) -> Iterator[Stack]:
    with running_stack("--worker", grpc_e.url, timeout=300) as stack:
        yield stack


@pytest.fixture(scope="module")
def client(embed_stack) -> Iterator[openai.OpenAI]:
    base = embed_stack.base_url + "/v1"
    with openai.OpenAI(base_url=base, api_key="none", max_retries=0) as c:
        yield c


def direct_embed(engine, token_ids: list[int]) -> tuple[list[float], int]:
    """The engine's own answer (Embed straight over gRPC), as float32 values."""
    channel, engine_stub = stub(engine)
    with channel:
        reply = engine_stub.Embed(
            pb.EmbedRequest(
                request_id=f"direct-{uuid.uuid4().hex[:8]}",
                tokenized=pb.TokenizedInput(input_ids=token_ids),
            ),
            timeout=120,
        )
    return list(array.array("f", reply.embedding)), reply.prompt_tokens


def f32(values: list[float]) -> list[float]:
    return list(array.array("f", values))


def tokens_of(base: str, text: str) -> list[int]:
    reply = httpx.post(base + "/tokenize", json={"model": EMBED_MODEL, "prompt": text}, timeout=60)
    assert reply.status_code == 200, reply.text
    return list(reply.json()["tokens"])


def test_the_engine_is_an_embedding_model(client):
    [model] = client.models.list().data
    assert model.id == EMBED_MODEL
    with pytest.raises(openai.BadRequestError):  # not a generation model
        client.chat.completions.create(
            model=EMBED_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )


def test_token_ids_give_the_engines_own_vectors(client, grpc_e):
    ids = [[1000, 2000, 3000, 4000], [5000, 6000, 7000]]
    reply = client.embeddings.create(model=EMBED_MODEL, input=ids)
    assert [d.index for d in reply.data] == [0, 1]
    total = 0
    for data, prompt in zip(reply.data, ids, strict=True):
        vector, tokens = direct_embed(grpc_e, prompt)
        assert f32(data.embedding) == vector
        total += tokens
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == total == 7


def test_texts_are_the_vectors_of_their_tokens(client, embed_stack, grpc_e):
    reply = client.embeddings.create(model=EMBED_MODEL, input=TEXTS)
    total = 0
    for data, text in zip(reply.data, TEXTS, strict=True):
        ids = tokens_of(embed_stack.base_url, text)
        vector, tokens = direct_embed(grpc_e, ids)
        assert f32(data.embedding) == vector and tokens == len(ids)
        total += tokens
    assert reply.usage.prompt_tokens == total
    assert len(reply.data[0].embedding) == 128  # the model's hidden size


def test_base64_is_the_same_floats(client):
    floats = client.embeddings.create(model=EMBED_MODEL, input=TEXTS[0])
    packed = client.embeddings.with_raw_response.create(
        model=EMBED_MODEL, input=TEXTS[0], encoding_format="base64"
    ).http_response.json()
    raw = array.array("f", base64.b64decode(packed["data"][0]["embedding"]))
    assert list(raw) == f32(floats.data[0].embedding)


def test_dimensions(client):
    assert client.embeddings.create(model=EMBED_MODEL, input="x", dimensions=128).data
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model=EMBED_MODEL, input="x", dimensions=64)
    assert "dimensions" in str(refused.value)
