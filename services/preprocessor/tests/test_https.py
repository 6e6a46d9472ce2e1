"""The API listener's TLS (https.ServerTls) with real handshakes on loopback: mutual TLS,
files re-read on change (new connections get the new certificate or CA), a bad renewal kept
out, and the flags."""

from __future__ import annotations

import argparse
import asyncio
import ssl

import pytest
import trustme

from switchyard.preprocessor import https

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def pki(tmp_path):
    """A server CA with a cert for 127.0.0.1, and two client CAs with a client cert each."""
    server_ca, client_ca, other_ca = trustme.CA(), trustme.CA(), trustme.CA()
    files = {}
    for name, ca in (("server_ca", server_ca), ("client_ca", client_ca), ("other_ca", other_ca)):
        files[name] = tmp_path / f"{name}.pem"
        ca.cert_pem.write_to_path(str(files[name]))
    cert = server_ca.issue_cert("127.0.0.1")
    files["cert"], files["key"] = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(files["cert"]))
    cert.private_key_pem.write_to_path(str(files["key"]))
    return {"files": files, "server_ca": server_ca, "client": client_ca.issue_cert("c1"),
            "other": other_ca.issue_cert("c2"), "renewer": server_ca}  # fmt: skip


async def serve(tls: https.ServerTls):
    async def answer(reader, writer):
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=tls.context)
    return server, server.sockets[0].getsockname()[1]


async def connect(port: int, pki, client_cert=None) -> tuple[bytes, bytes]:
    """(the answer, the server certificate's DER) or raises an SSL / connection error."""
    ctx = ssl.create_default_context()
    pki["server_ca"].configure_trust(ctx)
    if client_cert is not None:
        client_cert.configure_cert(ctx)
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return await reader.read(), der
    finally:
        writer.close()


async def refused(port: int, pki, client_cert=None) -> bool:
    """The server would not talk: the handshake failed, or (TLS 1.3, where the client's
    certificate is checked after the client's side of the handshake) the connection closed
    with nothing served."""
    try:
        answer, _ = await connect(port, pki, client_cert)
    except (ssl.SSLError, ConnectionError):
        return True
    return answer != b"ok"


class TestHandshakes:
    async def test_server_only(self, pki):
        f = pki["files"]
        server, port = await serve(https.ServerTls(f["cert"], f["key"]))
        async with server:
            assert (await connect(port, pki))[0] == b"ok"

    async def test_mutual_tls_needs_a_cert_the_ca_signed(self, pki):
        f = pki["files"]
        tls = https.ServerTls(f["cert"], f["key"], f["client_ca"])
        server, port = await serve(tls)
        async with server:
            assert (await connect(port, pki, pki["client"]))[0] == b"ok"
            assert await refused(port, pki)
            assert await refused(port, pki, pki["other"])


class TestReload:
    async def test_a_renewed_certificate_serves_the_next_connection(self, pki):
        f = pki["files"]
        tls = https.ServerTls(f["cert"], f["key"])
        server, port = await serve(tls)
        async with server:
            _, before = await connect(port, pki)
            assert not tls.reload()  # nothing changed
            renewed = pki["renewer"].issue_cert("127.0.0.1")
            renewed.private_key_and_cert_chain_pem.write_to_path(str(f["cert"]))
            renewed.private_key_pem.write_to_path(str(f["key"]))
            assert tls.reload() and tls.reloads == 1
            _, after = await connect(port, pki)
            assert after != before

    async def test_a_new_client_ca_takes_effect(self, pki):
        f = pki["files"]
        tls = https.ServerTls(f["cert"], f["key"], f["client_ca"])
        server, port = await serve(tls)
        async with server:
            f["client_ca"].write_bytes(f["other_ca"].read_bytes())
            assert tls.reload()
            assert (await connect(port, pki, pki["other"]))[0] == b"ok"
            assert await refused(port, pki, pki["client"])

    async def test_a_bad_renewal_keeps_the_last_good_files(self, pki, caplog):
        f = pki["files"]
        tls = https.ServerTls(f["cert"], f["key"])
        server, port = await serve(tls)
        async with server:
            _, before = await connect(port, pki)
            f["key"].write_text("not a key")
            assert not tls.reload()
            assert "keeping the last good ones" in caplog.text
            assert (await connect(port, pki))[1] == before


class TestFlags:
    def args(self, **kw) -> argparse.Namespace:
        base = {"tls_cert": None, "tls_key": None, "tls_client_ca": None}
        return argparse.Namespace(**{**base, **kw})

    def test_off_by_default(self):
        assert https.from_args(self.args()) is None and https.argv(self.args()) == []

    @pytest.mark.parametrize(
        "kw, words",
        [
            ({"tls_cert": "c.pem"}, "go together"),
            ({"tls_client_ca": "ca.pem"}, "needs --tls-cert"),
            ({"tls_cert": "/nope/c.pem", "tls_key": "/nope/k.pem"}, "--tls-cert /nope/c.pem"),
        ],
    )
    def test_refused_at_start(self, kw, words):
        with pytest.raises(ValueError, match=words):
            https.from_args(self.args(**kw))

    def test_passed_on_by_up(self, pki):
        f = pki["files"]
        args = self.args(tls_cert=str(f["cert"]), tls_key=str(f["key"]))
        assert https.argv(args) == ["--tls-cert", str(f["cert"]), "--tls-key", str(f["key"])]
        assert not https.from_args(args).mutual
