"""grpcs:// engines: TLS with a CA made here (trustme), mutual TLS, a server-name override; a
TLS URL never falls back to plaintext, and a TLS failure says so."""

from __future__ import annotations

import pytest
import trustme

from switchyard.common import errors
from switchyard.common.engines.connect import client_for, connect
from switchyard.common.engines.tls import EngineTls
from switchyard.common.errors import EngineError
from switchyard.mock_engine.config import MockEngineConfig
from switchyard.mock_engine.server import start_mock_engine
from switchyard.protos.messages import GenerateFinished, GenerateRequest, SamplingParams

# Every Generate stream here runs over both transports (conftest.both_transports).
pytestmark = pytest.mark.usefixtures("both_transports")


@pytest.fixture(scope="module")
def ca():
    return trustme.CA()


@pytest.fixture
def pki(ca, tmp_path):
    """PEM files: the CA, a server certificate (127.0.0.1 and engine.test), a client one."""
    files = {}
    ca.cert_pem.write_to_path(files.setdefault("ca", tmp_path / "ca.pem"))
    server = ca.issue_cert("127.0.0.1", "engine.test")
    server.private_key_pem.write_to_path(files.setdefault("key", tmp_path / "server.key"))
    server.cert_chain_pems[0].write_to_path(files.setdefault("cert", tmp_path / "server.pem"))
    named = ca.issue_cert("engine.test")  # not valid for 127.0.0.1
    named.private_key_pem.write_to_path(files.setdefault("named_key", tmp_path / "named.key"))
    named.cert_chain_pems[0].write_to_path(files.setdefault("named", tmp_path / "named.pem"))
    client = ca.issue_cert("switchyard-client")
    client.private_key_pem.write_to_path(files.setdefault("client_key", tmp_path / "client.key"))
    client.cert_chain_pems[0].write_to_path(files.setdefault("client", tmp_path / "client.pem"))
    return files


def tls_engine(pki, **extra) -> MockEngineConfig:
    return MockEngineConfig(
        protocol="vllm", port=0, tls_cert=pki["cert"], tls_key=pki["key"], **extra
    )


async def one_generation(url: str, tls: EngineTls | None) -> GenerateFinished:
    client = client_for("vllm", url, 1, tls)
    # ignore_eos: a sampled EOS would end it before 3 tokens (it did once in CI)
    request = GenerateRequest(
        request_id="r",
        instance_id=1,
        token_ids=[1, 2, 3],
        sampling=SamplingParams(max_tokens=3, ignore_eos=True),
    )
    try:
        events = [event async for event in client.generate(request)]
    finally:
        await client.close()
    assert isinstance(events[-1], GenerateFinished)
    return events[-1]


class TestTls:
    async def test_grpcs_with_the_engine_ca(self, pki):
        tls = EngineTls.from_files(pki["ca"])
        async with start_mock_engine(tls_engine(pki)) as engine:
            url = f"grpcs://127.0.0.1:{engine.port}"
            client = await connect(url, timeout=5, tls=tls)
            assert client.protocol == "vllm"
            assert (await client.info(5)).model
            await client.close()
            assert (await one_generation(url, tls)).completion_tokens == 3

    async def test_untrusted_certificate_is_a_clear_tls_error(self, pki):
        async with start_mock_engine(tls_engine(pki)) as engine:
            with pytest.raises(EngineError) as failed:
                await connect(f"grpcs://127.0.0.1:{engine.port}", timeout=3)  # system roots
        assert failed.value.kind == errors.CANNOT_CONNECT
        assert "TLS to grpcs://127.0.0.1" in failed.value.message

    async def test_grpcs_against_a_plaintext_engine_fails_clearly(self, pki):
        tls = EngineTls.from_files(pki["ca"])
        async with start_mock_engine(MockEngineConfig(protocol="vllm", port=0)) as engine:
            with pytest.raises(EngineError) as failed:
                await connect(f"grpcs://127.0.0.1:{engine.port}", timeout=3, tls=tls)
            assert failed.value.kind == errors.CANNOT_CONNECT
            assert "TLS to grpcs://" in failed.value.message
            # ... and plaintext still works on grpc:// (the URL decides, one engine at a time)
            client = await connect(f"grpc://127.0.0.1:{engine.port}", timeout=3, tls=tls)
            await client.close()

    async def test_plaintext_against_a_tls_engine_fails(self, pki):
        async with start_mock_engine(tls_engine(pki)) as engine:
            with pytest.raises(EngineError) as failed:
                await connect(f"grpc://127.0.0.1:{engine.port}", timeout=3)
        assert failed.value.kind in (errors.CANNOT_CONNECT, errors.TIMEOUT)

    async def test_mutual_tls(self, pki):
        config = tls_engine(pki, tls_client_ca=pki["ca"])
        async with start_mock_engine(config) as engine:
            url = f"grpcs://127.0.0.1:{engine.port}"
            with pytest.raises(EngineError):
                await connect(url, timeout=3, tls=EngineTls.from_files(pki["ca"]))
            mutual = EngineTls.from_files(pki["ca"], pki["client"], pki["client_key"])
            client = await connect(url, timeout=5, tls=mutual)
            await client.close()
            assert (await one_generation(url, mutual)).completion_tokens == 3

    async def test_server_name_override(self, pki):
        config = MockEngineConfig(
            protocol="vllm", port=0, tls_cert=pki["named"], tls_key=pki["named_key"]
        )
        async with start_mock_engine(config) as engine:
            url = f"grpcs://127.0.0.1:{engine.port}"
            with pytest.raises(EngineError):
                await connect(url, timeout=3, tls=EngineTls.from_files(pki["ca"]))
            named = EngineTls.from_files(pki["ca"], server_name="engine.test")
            client = await connect(url, timeout=5, tls=named)
            await client.close()


class TestEngineTlsFlags:
    def test_cert_needs_its_key(self, pki):
        with pytest.raises(ValueError, match="together"):
            EngineTls.from_files(pki["ca"], cert=pki["client"])

    def test_unreadable_or_not_pem(self, tmp_path):
        with pytest.raises(ValueError, match="--engine-ca"):
            EngineTls.from_files(tmp_path / "missing.pem")
        junk = tmp_path / "junk.pem"
        junk.write_text("hello")
        with pytest.raises(ValueError, match="not a PEM"):
            EngineTls.from_files(junk)

    def test_empty_server_name(self):
        with pytest.raises(ValueError):
            EngineTls(server_name=" ")

    @pytest.mark.parametrize("http2_streams", [False, True])
    async def test_unary_calls_with_mutual_tls(self, pki, http2_streams):
        """The router's load polls (a unary call on the client's HTTP/2 streams) over TLS."""
        async with start_mock_engine(tls_engine(pki, tls_client_ca=pki["ca"])) as engine:
            url = f"grpcs://127.0.0.1:{engine.port}"
            mutual = EngineTls.from_files(pki["ca"], pki["client"], pki["client_key"])
            client = client_for("vllm", url, 1, mutual, http2_streams=http2_streams)
            try:
                assert len((await client.get_loads(5)).loads) >= 1
            finally:
                await client.close()
            plain_ca = client_for(
                "vllm", url, 1, EngineTls.from_files(pki["ca"]), http2_streams=http2_streams
            )
            try:
                with pytest.raises(EngineError):  # no client certificate: refused
                    await plain_ca.get_loads(5)
            finally:
                await plain_ca.close()
