"""Client keys and the admin token through `switchyard up`, on every route: 401 without a key
and with a wrong one, 200 with the right one; /health open; the operator's routes with the
admin token on the API port, or without it on the admin listener; a keys file reloaded on
change; no key in any log."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from e2e_stack import Processes, running_stack, wait_until

MODEL = "deepseek-mock"
EMBED = "embed-mock"
KEY, SECOND, ADMIN = "sk-first-0123456789", "sk-second-abcdef", "admin-token-xyz"
V1 = [
    ("GET", "/v1/models", None),
    ("GET", f"/v1/models/{MODEL}", None),
    (
        "POST",
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
    ),  # noqa: E501
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 3}),
    ("POST", "/v1/embeddings", {"model": EMBED, "input": "signal box"}),
]
ADMIN_ROUTES = [
    ("GET", "/ready", None),
    ("GET", "/metrics", None),
    ("POST", "/debug/route", {"model": MODEL, "prompt": "hi"}),
    ("GET", "/admin/workers", None),
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text(f"# keys of the test\n{SECOND}\n")
    with Processes() as procs:
        embed = procs.serve(
            "engine-embed", "mock-engine", "--protocol", "vllm", "--port", "0",
            "--model-name", EMBED, "--embedding", "--embedding-dim", "16",
        )  # fmt: skip
        with running_stack(
            "--mock-engines", "sglang",
            "--worker", f"grpc://127.0.0.1:{embed['port']}",
            "--api-key", KEY,
            "--api-keys-file", str(keys),
            "--admin-token", ADMIN,
        ) as s:  # fmt: skip
            s.keys_file = keys
            s.admin = f"http://127.0.0.1:{s.report()['children']['preprocessor']['admin_port']}"
            wait_until(
                lambda: call(s.base_url, "POST", V1[-1][1], V1[-1][2], KEY).status_code == 200,
                timeout=60,
                what="both models served",
            )
            yield s


def call(base, method, path, body=None, token=None) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.request(method, base + path, json=body, headers=headers, timeout=30)


@pytest.mark.parametrize(("method", "path", "body"), V1, ids=[p for _, p, _ in V1])
class TestClientRoutes:
    def test_no_key_is_401(self, stack, method, path, body):
        reply = call(stack.base_url, method, path, body)
        assert reply.status_code == 401
        error = reply.json()["error"]
        assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"
        assert reply.headers["www-authenticate"].startswith("Bearer")

    def test_wrong_key_is_401(self, stack, method, path, body):
        for wrong in ("sk-nope", ADMIN):  # the admin token is no client key
            reply = call(stack.base_url, method, path, body, wrong)
            assert reply.status_code == 401
            assert wrong not in reply.text

    def test_right_keys_are_200(self, stack, method, path, body):
        for key in (KEY, SECOND):  # from the flag, and from the keys file
            assert call(stack.base_url, method, path, body, key).status_code == 200


@pytest.mark.parametrize(
    ("method", "path", "body"), ADMIN_ROUTES, ids=[p for _, p, _ in ADMIN_ROUTES]
)
class TestOperatorRoutes:
    def test_need_the_admin_token_on_the_api_port(self, stack, method, path, body):
        assert call(stack.base_url, method, path, body).status_code == 401
        assert call(stack.base_url, method, path, body, KEY).status_code == 401
        assert call(stack.base_url, method, path, body, ADMIN).status_code == 200

    def test_open_on_the_admin_listener(self, stack, method, path, body):
        assert call(stack.admin, method, path, body).status_code == 200


class TestAccess:
    def test_health_is_open(self, stack):
        assert call(stack.base_url, "GET", "/health").status_code == 200

    def test_the_admin_listener_serves_no_client_route(self, stack):
        assert call(stack.admin, "GET", "/v1/models", None, KEY).status_code == 404

    def test_openai_sdk(self, stack):
        with openai.OpenAI(base_url=stack.base_url + "/v1", api_key="wrong", max_retries=0) as c:
            with pytest.raises(openai.AuthenticationError):
                c.models.list()
        with openai.OpenAI(base_url=stack.base_url + "/v1", api_key=KEY, max_retries=0) as c:
            stream = c.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
            )
            assert sum(1 for _ in stream) > 0

    def test_keys_file_is_reloaded(self, stack):
        third = "sk-third-added-later"
        stack.keys_file.write_text(f"{third}\n")
        wait_until(
            lambda: call(stack.base_url, "GET", "/v1/models", None, third).status_code == 200,
            timeout=20,
            what="the new key accepted",
        )
        assert call(stack.base_url, "GET", "/v1/models", None, SECOND).status_code == 401
        assert call(stack.base_url, "GET", "/v1/models", None, KEY).status_code == 200  # flag
        stack.keys_file.write_text(f"{SECOND}\n")
        wait_until(
            lambda: call(stack.base_url, "GET", "/v1/models", None, SECOND).status_code == 200,
            timeout=20,
            what="the key back",
        )

    def test_no_key_is_logged(self, stack):
        time.sleep(0.2)
        log = stack.log()
        for secret in (KEY, SECOND, ADMIN):
            assert secret not in log


class TestOpenByDefault:
    def test_an_open_server_says_so(self):
        with running_stack("--mock-engines", "vllm") as s:
            assert call(s.base_url, "GET", "/v1/models").status_code == 200
            assert call(s.base_url, "GET", "/metrics").status_code == 200
            assert "NO API KEY IS CONFIGURED" in s.log()
