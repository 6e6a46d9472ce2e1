"""HTTPS at the edge: the API listener's TLS, off unless `--tls-cert` and `--tls-key` are given.

`--tls-client-ca` makes it mutual TLS: a client must present a certificate that CA signed,
or the handshake fails. The files are re-read when they change (checked every second, like
the keys file): a renewed certificate (cert-manager, an ACME client) or CA bundle takes
effect for the next connection, without a restart and without dropping open connections. A
file that cannot be read, or a key that does not match its certificate, keeps the last
good context (logged once). Whether a client certificate is required is fixed at start.

The listener's own SSLContext never changes: its SNI callback (OpenSSL calls it for every
ClientHello, with or without a server name) hands each new connection the latest context.
TLS wraps whatever socket the server listens on (a bound one, an inherited one): uvicorn
takes the context with the sockets. TLS 1.2 at least; ALPN http/1.1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import ssl
from pathlib import Path

log = logging.getLogger(__name__)

RELOAD_INTERVAL_S = 1.0


class ServerTls:
    def __init__(self, cert: str | Path, key: str | Path, client_ca: str | Path | None = None):
        self.cert, self.key = Path(cert), Path(key)
        self.client_ca = Path(client_ca) if client_ca is not None else None
        self._seen = self._stamp()
        self._current = self._build()  # a bad file at start is a start-up error (ValueError)
        self.context = self._current  # the listener's; hands connections `_current`
        self.context.sni_callback = self._select
        self._problem = ""
        self.reloads = 0

    @property
    def mutual(self) -> bool:
        return self.client_ca is not None

    def _files(self) -> list[Path]:
        return [self.cert, self.key] + ([self.client_ca] if self.client_ca is not None else [])

    def _stamp(self) -> tuple[tuple[float, int], ...]:
        stamps = []
        for path in self._files():
            try:
                stat = path.stat()
            except OSError:
                stamps.append((-1.0, -1))
            else:
                stamps.append((stat.st_mtime, stat.st_size))
        return tuple(stamps)

    def _build(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"--tls-cert {self.cert} / --tls-key {self.key}: {exc}") from None
        if self.client_ca is not None:
            try:
                context.load_verify_locations(cafile=self.client_ca)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"--tls-client-ca {self.client_ca}: {exc}") from None
            context.verify_mode = ssl.CERT_REQUIRED
        context.set_alpn_protocols(["http/1.1"])
        return context

    def _select(self, conn: ssl.SSLObject, server_name: str | None, _: ssl.SSLContext) -> None:
        current = self._current
        if current is not self.context:
            conn.context = current

    def reload(self) -> bool:
        """Re-read the files if any changed (blocking: run in a thread). True if the
        context was replaced."""
        stamp = self._stamp()
        if stamp == self._seen:
            return False
        try:
            context = self._build()
        except ValueError as exc:
            problem = f"TLS files not reloaded, keeping the last good ones: {exc}"
            if problem != self._problem:
                log.error("%s", problem)
                self._problem = problem
            return False  # tried again at the next change (a half-written renewal)
        finally:
            self._seen = stamp
        self._current = context
        self._problem = ""
        self.reloads += 1
        log.info("TLS certificate files reloaded (%s)", ", ".join(map(str, self._files())))
        return True

    async def watch(self, interval: float = RELOAD_INTERVAL_S) -> None:
        while True:
            await asyncio.sleep(interval)
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.reload)


def add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--tls-cert",
        metavar="PEM",
        default=None,
        help="serve the API over HTTPS with this certificate chain (with --tls-key); "
        "re-read when it changes; default: plain HTTP",
    )
    group.add_argument(
        "--tls-key", metavar="PEM", default=None, help="the certificate's private key"
    )
    group.add_argument(
        "--tls-client-ca",
        metavar="PEM",
        default=None,
        help="mutual TLS: clients must present a certificate this CA bundle signed "
        "(re-read when it changes); default: no client certificate asked",
    )


def from_args(args: argparse.Namespace) -> ServerTls | None:
    """The flags' TLS, or None for plain HTTP; ValueError naming the flag."""
    if args.tls_cert is None and args.tls_key is None:
        if args.tls_client_ca is not None:
            raise ValueError("--tls-client-ca needs --tls-cert and --tls-key (HTTPS)")
        return None
    if args.tls_cert is None or args.tls_key is None:
        raise ValueError("--tls-cert and --tls-key go together")
    return ServerTls(args.tls_cert, args.tls_key, args.tls_client_ca)


def argv(args: argparse.Namespace) -> list[str]:
    """The same flags for a child process (`switchyard up`)."""
    out: list[str] = []
    for flag, value in (
        ("--tls-cert", args.tls_cert),
        ("--tls-key", args.tls_key),
        ("--tls-client-ca", args.tls_client_ca),
    ):
        if value is not None:
            out += [flag, str(value)]
    return out
