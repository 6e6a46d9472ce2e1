"""grpcs:// engines through `switchyard up`: a mock engine serving TLS with a certificate from a
CA made here (trustme), asking for client certificates (mutual TLS), is probed, routed to,
streamed from and its tokenizer fetched, by every service over TLS. A plaintext engine behind
a grpcs:// URL is never dialled in plaintext: it stays down, with a probe error that says TLS.
"""

from __future__ import annotations

import httpx
import openai
import pytest
import trustme
from e2e_stack import Processes, running_stack, wait_until

MODEL = "deepseek-mock"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    files = {name: folder / f"{name}.pem" for name in ("ca", "cert", "key", "ccert", "ckey")}
    ca.cert_pem.write_to_path(files["ca"])
    server = ca.issue_cert("127.0.0.1")
    server.cert_chain_pems[0].write_to_path(files["cert"])
    server.private_key_pem.write_to_path(files["key"])
    client = ca.issue_cert("switchyard")
    client.cert_chain_pems[0].write_to_path(files["ccert"])
    client.private_key_pem.write_to_path(files["ckey"])
    return files


def test_grpcs_engines_end_to_end(pki):
    with Processes() as procs:
        tls = procs.start_ready(
            "engine-tls", "mock-engine", "--protocol", "vllm", "--port", "0",
            "--tls-cert", str(pki["cert"]), "--tls-key", str(pki["key"]),
            "--tls-client-ca", str(pki["ca"]),
        )  # fmt: skip
        plain = procs.start_ready(
            "engine-plain", "mock-engine", "--protocol", "sglang", "--port", "0"
        )
        tls_url = f"grpcs://127.0.0.1:{tls.result()['port']}"
        plain_url = f"grpcs://127.0.0.1:{plain.result()['port']}"  # but it speaks plaintext
        with running_stack(
            "--worker", tls_url, "--worker", plain_url,
            "--engine-ca", str(pki["ca"]),
            "--engine-cert", str(pki["ccert"]), "--engine-key", str(pki["ckey"]),
        ) as stack:  # fmt: skip
            with openai.OpenAI(base_url=stack.base_url + "/v1", api_key="x", max_retries=0) as c:
                stream = c.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "over TLS"}],
                    max_tokens=12,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_body={"ignore_eos": True},
                )
                usage = [chunk.usage for chunk in stream if chunk.usage]
                assert usage[-1].completion_tokens == 12

            def states() -> dict[str, dict]:
                reply = httpx.get(stack.base_url + "/admin/workers", timeout=10)
                return {w["url"]: w for w in reply.json()["data"]}

            wait_until(
                lambda: states()[plain_url]["error"], timeout=60, what="the plaintext probe error"
            )
            listed = states()
            assert listed[tls_url]["state"] == "ready"
            # Never ready (down once the start-up grace is over: this probe error is shown
            # from the first failed probe on).
            assert listed[plain_url]["state"] in ("probing", "down")
            assert "TLS to grpcs://" in listed[plain_url]["error"]
            assert "TLS to grpcs://" in stack.log()


def test_a_tls_engine_without_the_client_certificate_is_refused(pki):
    with Processes() as procs:
        tls = procs.serve(
            "engine-tls", "mock-engine", "--protocol", "vllm", "--port", "0",
            "--tls-cert", str(pki["cert"]), "--tls-key", str(pki["key"]),
            "--tls-client-ca", str(pki["ca"]),
        )  # fmt: skip
        url = f"grpcs://127.0.0.1:{tls['port']}"
        with running_stack("--worker", url, "--engine-ca", str(pki["ca"]), ready=False) as stack:

            def error() -> str:
                try:
                    reply = httpx.get(stack.base_url + "/admin/workers", timeout=10)
                except httpx.HTTPError:
                    return ""
                data = reply.json()["data"] if reply.status_code == 200 else []
                return data[0]["error"] if data else ""

            assert "TLS to grpcs://" in wait_until(error, timeout=60, what="the probe error")
