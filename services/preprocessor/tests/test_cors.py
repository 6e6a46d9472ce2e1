"""CORS in front of the edge (cors.wrap): off by default, preflights answered before the key
check, allowed origins' answers (errors included) readable by the browser."""

from __future__ import annotations

import argparse

import httpx
import pytest
from fastapi import FastAPI

from switchyard.preprocessor import cors
from switchyard.preprocessor.auth import Access, KeyRing
from switchyard.preprocessor.edge import Edge

APP = "https://app.example.com"


def args(**kw) -> argparse.Namespace:
    base = {
        "cors_allow_origin": [],
        "cors_allow_method": [],
        "cors_allow_header": [],
        "cors_allow_credentials": False,
        "cors_max_age": 600,
    }
    return argparse.Namespace(**{**base, **kw})


def client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t")


@pytest.fixture
def edge():
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": []}

    return Edge(app, None, 1 << 20, access=Access(KeyRing(["k1"])))


PREFLIGHT = {
    "origin": APP,
    "access-control-request-method": "POST",
    "access-control-request-headers": "authorization, content-type, x-api-key",
}


class TestOff:
    def test_nothing_wraps_the_edge(self, edge):
        assert cors.wrap(edge, args()) is edge

    async def test_a_preflight_is_not_answered(self, edge):
        async with client(edge) as c:
            reply = await c.options("/v1/chat/completions", headers=PREFLIGHT)
        assert "access-control-allow-origin" not in reply.headers

    def test_methods_without_an_origin_are_refused(self):
        with pytest.raises(ValueError, match="needs --cors-allow-origin"):
            cors.wrap(None, args(cors_allow_method=["GET"]))


class TestOn:
    async def test_a_preflight_is_answered_without_a_key(self, edge):
        app = cors.wrap(edge, args(cors_allow_origin=[APP]))
        async with client(app) as c:
            reply = await c.options("/v1/messages", headers=PREFLIGHT)
        assert reply.status_code == 200
        assert reply.headers["access-control-allow-origin"] == APP
        assert "POST" in reply.headers["access-control-allow-methods"]
        assert (
            reply.headers["access-control-allow-headers"]
            == PREFLIGHT["access-control-request-headers"]
        )
        assert reply.headers["access-control-max-age"] == "600"

    async def test_another_origin_is_refused(self, edge):
        app = cors.wrap(edge, args(cors_allow_origin=[APP]))
        async with client(app) as c:
            reply = await c.options("/v1/messages", headers={**PREFLIGHT, "origin": "https://x"})
        assert reply.status_code == 400
        assert "access-control-allow-origin" not in reply.headers

    async def test_a_method_not_allowed(self, edge):
        app = cors.wrap(edge, args(cors_allow_origin=[APP], cors_allow_method=["GET"]))
        async with client(app) as c:
            reply = await c.options("/v1/messages", headers=PREFLIGHT)
        assert reply.status_code == 400

    async def test_answers_and_errors_carry_the_origin(self, edge):
        app = cors.wrap(edge, args(cors_allow_origin=[APP], cors_allow_credentials=True))
        async with client(app) as c:
            ok = await c.get("/v1/models", headers={"origin": APP, "x-api-key": "k1"})
            refused = await c.get("/v1/models", headers={"origin": APP})
        assert ok.status_code == 200 and refused.status_code == 401
        for reply in (ok, refused):
            assert reply.headers["access-control-allow-origin"] == APP
            assert reply.headers["access-control-allow-credentials"] == "true"
            assert "x-request-id" in reply.headers["access-control-expose-headers"]

    async def test_any_origin(self, edge):
        app = cors.wrap(edge, args(cors_allow_origin=["*"]))
        async with client(app) as c:
            reply = await c.get("/v1/models", headers={"origin": "https://y", "x-api-key": "k1"})
        assert reply.headers["access-control-allow-origin"] == "*"


class TestOriginFlag:
    @pytest.mark.parametrize("text", ["*", APP, "http://localhost:3000", APP + "/"])
    def test_accepted(self, text):
        assert cors.origin(text) == text.rstrip("/")

    @pytest.mark.parametrize("text", ["app.example.com", "https://a.com/path", "ftp://a.com"])
    def test_refused(self, text):
        with pytest.raises(argparse.ArgumentTypeError, match="not an origin"):
            cors.origin(text)

    def test_passed_on_by_up(self):
        a = args(cors_allow_origin=[APP], cors_allow_credentials=True)
        assert cors.argv(a) == [
            "--cors-allow-origin", APP, "--cors-allow-credentials", "--cors-max-age", "600"
        ]  # fmt: skip
