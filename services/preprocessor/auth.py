"""Who may use the HTTP API: client keys for /v1, an admin token for the operator's routes.

Client keys come from `--api-key` (repeatable), the environment (`SWITCHYARD_API_KEYS`, keys
separated by commas or whitespace) and a keys file (`--api-keys-file`: one key per line, `#`
comments), which is re-read when it changes (checked every second; a file that cannot be read
keeps the last good keys). Any of them configured turns authentication on, a keys file even
while it is empty. Every /v1 route (and vLLM's /tokenize, /detokenize) then needs
`Authorization: Bearer <key>` or `x-api-key: <key>` (the Anthropic SDK's header), checked
before the body is read; anything else is a 401. Keys are held as SHA-256 digests and never
logged.

The operator's routes (/ready, /metrics, /debug/*, /admin/*) need `--admin-token` on the API
port, or are served without it on the admin listener (`--admin-port`, bound to loopback by
default). With no client key, no admin token and no admin listener the server is open (and
says so loudly at start). /health is always open.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path

from switchyard.preprocessor.errors import AuthenticationError

log = logging.getLogger(__name__)

KEYS_ENV = "SWITCHYARD_API_KEYS"
ADMIN_TOKEN_ENV = "SWITCHYARD_ADMIN_TOKEN"
RELOAD_INTERVAL_S = 1.0
ADMIN_PREFIXES = ("/debug/", "/admin/")
OPEN_PATHS = ("/health",)
# Where the edge leaves the caller's tenant for the stored-object routes (ASGI scope key).
TENANT_SCOPE = "switchyard.tenant"


def tenant_of(key: bytes | None) -> str:
    """Whose stored objects a request may see: its key's digest (hex), "" with no keys."""
    return key.hex() if key is not None else ""
CLIENT_PATHS = ("/tokenize", "/detokenize")  # vLLM's, outside /v1: client keys as for /v1


def digest(key: str | bytes) -> bytes:
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).digest()


def split_keys(text: str) -> list[str]:
    return [k for k in re.split(r"[\s,]+", text) if k]


def parse_keys_file(text: str) -> list[str]:
    keys = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            if any(c.isspace() for c in line):
                raise ValueError("a line holds more than one key (one key per line)")
            keys.append(line)
    return keys


def bearer(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    """The token of an `Authorization: Bearer <token>` header (ASGI raw headers)."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return token.strip()
            return None
    return None


def client_key(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    """The client's key: `Authorization: Bearer <key>`, else `x-api-key: <key>` (the
    Anthropic SDK's header)."""
    token = None
    for name, value in headers:
        if name == b"authorization":
            scheme, _, rest = value.strip().partition(b" ")
            if scheme.lower() == b"bearer" and rest.strip():
                return rest.strip()
        elif name == b"x-api-key" and value.strip():
            token = value.strip()
    return token


def is_client_path(path: str) -> bool:
    return path.startswith("/v1/") or path in CLIENT_PATHS


def is_admin_path(path: str) -> bool:
    return path == "/ready" or path == "/metrics" or path.startswith(ADMIN_PREFIXES)


class KeyRing:
    """The client keys: static ones plus a watched file's. `check` is the per-request part
    (one hash, one set lookup)."""

    def __init__(self, keys: Iterable[str] = (), file: str | Path | None = None) -> None:
        self._static = {digest(k) for k in keys}
        self.file = Path(file) if file is not None else None
        self._from_file: frozenset[bytes] = frozenset()
        self._seen: tuple[float, int] | None = None  # (mtime, size) last read
        self._problem = ""
        self._keys = frozenset(self._static)
        if self.file is not None:
            self._load()  # at start a bad file is a startup error (OSError / ValueError)

    @property
    def enabled(self) -> bool:
        return bool(self._static) or self.file is not None

    def __len__(self) -> int:
        return len(self._keys)

    def check(self, token: bytes | None) -> bytes:
        """The key's digest (its identity for per-key limits); AuthenticationError else."""
        if token is None:
            raise AuthenticationError(
                "Missing API key: send it as `Authorization: Bearer <key>` (or `x-api-key`)."
            )
        key = digest(token)
        if key not in self._keys:
            raise AuthenticationError("Incorrect API key provided.")
        return key

    def _load(self) -> None:
        assert self.file is not None
        stat = self.file.stat()
        keys = parse_keys_file(self.file.read_text(encoding="utf-8"))
        self._from_file = frozenset(digest(k) for k in keys)
        self._keys = frozenset(self._static | self._from_file)  # swapped, never mutated
        self._seen = (stat.st_mtime, stat.st_size)

    def reload(self) -> bool:
        """Re-read the keys file if it changed (blocking: run in a thread). True if the
        keys were replaced."""
        if self.file is None:
            return False
        try:
            stat = self.file.stat()
            if (stat.st_mtime, stat.st_size) == self._seen:
                return False
            self._load()
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            problem = f"API keys file {self.file} not reloaded, keeping the last good keys: {exc}"
            if problem != self._problem:
                log.error("%s", problem)
                self._problem = problem
            return False
        self._problem = ""
        log.info("API keys file %s reloaded: %d key(s)", self.file, len(self._from_file))
        return True

    async def watch(self, interval: float = RELOAD_INTERVAL_S) -> None:
        while True:
            await asyncio.sleep(interval)
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.reload)


class Access:
    """The decision per request: which routes need what, on which listener."""

    def __init__(
        self, keys: KeyRing, admin_token: str | None = None, admin_port: int | None = None
    ) -> None:
        if admin_token is not None and not admin_token.strip():
            raise ValueError("the admin token must not be empty")
        self.keys = keys
        self._admin = digest(admin_token) if admin_token else None
        self.admin_port = admin_port  # the admin listener's port (set once bound)
        self.admin_listener = admin_port is not None

    @property
    def open(self) -> bool:
        """Nothing configured: every route is open on the API port."""
        return not self.keys.enabled and self._admin is None and not self.admin_listener

    def client(self, headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
        """A /v1 request: the key's digest (None when auth is off). AuthenticationError."""
        if not self.keys.enabled:
            return None
        return self.keys.check(client_key(headers))

    def admin(self, headers: Iterable[tuple[bytes, bytes]]) -> None:
        """An operator route on the API port. AuthenticationError."""
        if self.open:
            return
        if self._admin is None:
            raise AuthenticationError(
                "This route needs the admin token (--admin-token), or the admin listener "
                "(--admin-port)."
            )
        token = bearer(headers)
        if token is None or digest(token) != self._admin:
            raise AuthenticationError("Missing or incorrect admin token.")

    def warnings(self, api: str) -> list[str]:
        """What to say loudly at start about what is open."""
        out = []
        if not self.keys.enabled:
            out.append(
                f"NO API KEY IS CONFIGURED: anyone who reaches {api} is served "
                f"(give --api-key, --api-keys-file or {KEYS_ENV})"
            )
        if self.open:
            out.append(
                f"/metrics, /debug/route and /admin are open on {api} (give --admin-token "
                f"or --admin-port)"
            )
        elif self._admin is None and not self.admin_listener:
            out.append(
                "no --admin-token and no --admin-port: /ready, /metrics, /debug and "
                "/admin answer 401 on every listener"
            )
        return out


def keys_from_env(environ: dict[str, str] | None = None) -> list[str]:
    return split_keys((environ if environ is not None else os.environ).get(KEYS_ENV, ""))
