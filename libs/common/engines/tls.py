"""TLS to engines: `grpcs://` URLs are dialled over TLS, never in plaintext.

The roots are the system's CA bundle (or gRPC's own when the system has none), or
`--engine-ca`; `--engine-cert` / `--engine-key` add a client certificate (mutual TLS);
`--engine-server-name` checks the engine's certificate for that name instead of the URL's
host (engines dialled by IP). `grpc://` URLs stay plaintext whatever the flags say: the URL
is the operator's choice, one engine at a time. Every service that dials engines (fleet,
router, dispatcher, preprocessor) takes the same flags; `switchyard up` passes them on.
"""

from __future__ import annotations

import argparse
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

import grpc

TLS_SCHEME = "grpcs"


@dataclass(frozen=True)
class EngineTls:
    """What a TLS channel to an engine trusts and presents. Files are read once, at start."""

    ca: bytes | None = None  # PEM roots; None: the system's
    cert: bytes | None = None  # PEM client certificate chain (mutual TLS)
    key: bytes | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("--engine-cert and --engine-key go together (mutual TLS)")
        if self.server_name is not None and not self.server_name.strip():
            raise ValueError("--engine-server-name must not be empty")

    @classmethod
    def from_files(
        cls,
        ca: str | Path | None = None,
        cert: str | Path | None = None,
        key: str | Path | None = None,
        server_name: str | None = None,
    ) -> EngineTls:
        """Read the PEM files (ValueError naming the flag when one cannot be read)."""
        return cls(
            _read("--engine-ca", ca),
            _read("--engine-cert", cert),
            _read("--engine-key", key),
            server_name,
        )

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca if self.ca is not None else system_roots(),
            private_key=self.key,
            certificate_chain=self.cert,
        )

    def ssl_context(self) -> ssl.SSLContext:
        """The same trust and client certificate for an asyncio TLS connection (ALPN h2,
        as gRPC requires)."""
        # No CA given: the system's, which the default context loads.
        context = ssl.create_default_context(cadata=self.ca.decode() if self.ca else None)
        if self.cert is not None and self.key is not None:
            # ssl loads a certificate chain from files only: a private folder, gone at once.
            with tempfile.TemporaryDirectory(prefix="switchyard-tls-") as folder:
                cert, key = Path(folder) / "cert.pem", Path(folder) / "key.pem"
                cert.write_bytes(self.cert)
                key.touch(mode=0o600)
                key.write_bytes(self.key)
                context.load_cert_chain(cert, key)
        context.set_alpn_protocols(["h2"])
        return context

    def options(self) -> list[tuple[str, str]]:
        if self.server_name is None:
            return []
        return [("grpc.ssl_target_name_override", self.server_name)]


def _read(flag: str, path: str | Path | None) -> bytes | None:
    if path is None:
        return None
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{flag} {path}: {exc.strerror or exc}") from None
    if b"-----BEGIN" not in data:
        raise ValueError(f"{flag} {path}: not a PEM file")
    return data


_system_roots: bytes | None = None


def system_roots() -> bytes | None:
    """The system CA bundle (read once); None lets gRPC use its own bundled roots."""
    global _system_roots
    if _system_roots is None:
        paths = ssl.get_default_verify_paths()
        for candidate in (paths.cafile, paths.openssl_cafile):
            if candidate and Path(candidate).is_file():
                _system_roots = Path(candidate).read_bytes()
                break
    return _system_roots


def add_engine_tls_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("TLS to engines (grpcs:// URLs; grpc:// stays plaintext)")
    group.add_argument(
        "--engine-ca",
        metavar="PEM",
        default=None,
        help="CA certificates that sign the engines' certificates (default: the system's)",
    )
    group.add_argument(
        "--engine-cert",
        metavar="PEM",
        default=None,
        help="client certificate chain for mutual TLS (with --engine-key; default: none)",
    )
    group.add_argument(
        "--engine-key", metavar="PEM", default=None, help="the client certificate's key"
    )
    group.add_argument(
        "--engine-server-name",
        metavar="NAME",
        default=None,
        help="the name engine certificates are checked for (default: the URL's host)",
    )


def engine_tls_from_args(args: argparse.Namespace) -> EngineTls:
    """The flags' EngineTls; ValueError (naming the flag) for an unreadable or bad file."""
    return EngineTls.from_files(
        args.engine_ca, args.engine_cert, args.engine_key, args.engine_server_name
    )


def engine_tls_argv(args: argparse.Namespace) -> list[str]:
    """The same flags for a child process (`switchyard up`)."""
    out: list[str] = []
    for flag, value in (
        ("--engine-ca", args.engine_ca),
        ("--engine-cert", args.engine_cert),
        ("--engine-key", args.engine_key),
        ("--engine-server-name", args.engine_server_name),
    ):
        if value is not None:
            out += [flag, str(value)]
    return out
