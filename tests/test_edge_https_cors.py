"""HTTPS and CORS at the edge through `switchyard up`, with real clients: the openai and
anthropic SDKs over mutual TLS with a test CA (trustme), a client without a certificate and a
plaintext client refused, a renewed certificate served without a restart, and a browser's
CORS preflight and simple request."""

from __future__ import annotations

import ssl
import time

import anthropic
import httpx
import openai
import pytest
import trustme
from e2e_stack import running_stack, wait_until

MODEL = "deepseek-mock"
APP = "https://app.example.com"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    folder = tmp_path_factory.mktemp("edge-pki")
    ca, clients = trustme.CA(), trustme.CA()
    files = {name: folder / f"{name}.pem" for name in ("ca", "cert", "key", "clients")}
    ca.cert_pem.write_to_path(str(files["ca"]))
    clients.cert_pem.write_to_path(str(files["clients"]))
    server = ca.issue_cert("127.0.0.1")
    server.private_key_and_cert_chain_pem.write_to_path(str(files["cert"]))
    server.private_key_pem.write_to_path(str(files["key"]))
    return {"files": files, "ca": ca, "client": clients.issue_cert("client.example")}


def tls_context(pki, with_cert: bool = True) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    pki["ca"].configure_trust(ctx)
    if with_cert:
        pki["client"].configure_cert(ctx)
    return ctx


@pytest.fixture(scope="module")
def stack(pki):
    f = pki["files"]
    with running_stack(
        "--mock-engines", "vllm",
        "--tls-cert", str(f["cert"]), "--tls-key", str(f["key"]),
        "--tls-client-ca", str(f["clients"]),
        "--cors-allow-origin", APP,
        "--api-key", "sk-edge",
    ) as s:  # fmt: skip
        assert s.base_url.startswith("https://")
        yield s


def peer_cert(stack, pki) -> bytes:
    host, port = stack.base_url.removeprefix("https://").split(":")
    import socket

    with socket.create_connection((host, int(port))) as raw:
        with tls_context(pki).wrap_socket(raw, server_hostname=host) as conn:
            der = conn.getpeercert(binary_form=True)
            assert der is not None
            return der


class TestMutualTls:
    def test_openai_sdk(self, stack, pki):
        http = httpx.Client(verify=tls_context(pki))
        with openai.OpenAI(
            base_url=stack.base_url + "/v1", api_key="sk-edge", http_client=http, max_retries=0
        ) as client:
            reply = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "over HTTPS"}], max_tokens=5
            )
            assert reply.usage.completion_tokens >= 1
            stream = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "streamed over HTTPS"}],
                max_tokens=6,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
            assert [c.usage for c in stream if c.usage][-1].completion_tokens == 6

    def test_anthropic_sdk(self, stack, pki):
        """x-api-key over TLS; a wrong key is a 401 in Anthropic's shape. (The SDK brings
        its own HTTP client package, httpx2.)"""
        http = anthropic.DefaultHttpxClient(verify=tls_context(pki))
        with anthropic.Anthropic(
            base_url=stack.base_url, api_key="sk-edge", http_client=http, max_retries=0
        ) as client:
            message = client.messages.create(
                model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "over HTTPS"}]
            )
            assert message.type == "message" and message.usage.output_tokens >= 1
            count = client.messages.count_tokens(
                model=MODEL, messages=[{"role": "user", "content": "over HTTPS"}]
            )
            assert count.input_tokens == message.usage.input_tokens + (
                message.usage.cache_read_input_tokens or 0
            )
        with anthropic.Anthropic(
            base_url=stack.base_url,
            api_key="sk-wrong",
            http_client=anthropic.DefaultHttpxClient(verify=tls_context(pki)),
            max_retries=0,
        ) as client:
            with pytest.raises(anthropic.AuthenticationError) as err:
                client.messages.create(
                    model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "x"}]
                )
            assert err.value.body["error"]["type"] == "authentication_error"

    def test_a_client_without_a_certificate_is_refused(self, stack, pki):
        with httpx.Client(verify=tls_context(pki, with_cert=False)) as http:
            with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
                http.get(stack.base_url + "/health").raise_for_status()

    def test_plain_http_gets_no_answer(self, stack):
        with httpx.Client() as http:
            with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError, httpx.ConnectError)):
                http.get(stack.base_url.replace("https://", "http://") + "/health")


class TestCors:
    def test_a_preflight(self, stack, pki):
        with httpx.Client(verify=tls_context(pki)) as http:
            reply = http.options(
                stack.base_url + "/v1/messages",
                headers={
                    "origin": APP,
                    "access-control-request-method": "POST",
                    "access-control-request-headers": "x-api-key, anthropic-version, content-type",
                },
            )
        assert reply.status_code == 200
        assert reply.headers["access-control-allow-origin"] == APP
        assert "POST" in reply.headers["access-control-allow-methods"]
        assert "x-api-key" in reply.headers["access-control-allow-headers"]

    def test_the_answer_is_readable_by_the_page(self, stack, pki):
        with httpx.Client(verify=tls_context(pki)) as http:
            reply = http.get(
                stack.base_url + "/v1/models",
                headers={"origin": APP, "authorization": "Bearer sk-edge"},
            )
            refused = http.get(stack.base_url + "/v1/models", headers={"origin": "https://evil"})
        assert reply.status_code == 200
        assert reply.headers["access-control-allow-origin"] == APP
        assert "access-control-allow-origin" not in refused.headers


class TestRenewal:
    def test_a_new_certificate_without_a_restart(self, stack, pki):
        """Last in the module: it replaces the served certificate."""
        f = pki["files"]
        before = peer_cert(stack, pki)
        renewed = pki["ca"].issue_cert("127.0.0.1")
        time.sleep(0.01)  # a new mtime even on coarse clocks
        renewed.private_key_and_cert_chain_pem.write_to_path(str(f["cert"]))
        renewed.private_key_pem.write_to_path(str(f["key"]))
        wait_until(lambda: peer_cert(stack, pki) != before, timeout=15, what="the renewed cert")
        with httpx.Client(verify=tls_context(pki)) as http:  # still serving
            assert http.get(stack.base_url + "/health").status_code == 200
