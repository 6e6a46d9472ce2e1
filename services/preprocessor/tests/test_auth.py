"""Client keys and the admin token: who may call which route (auth.py)."""

from __future__ import annotations

import os

import pytest

from switchyard.preprocessor.auth import (
    Access,
    KeyRing,
    bearer,
    is_admin_path,
    keys_from_env,
    parse_keys_file,
)
from switchyard.preprocessor.errors import AuthenticationError


def auth(token: str) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", f"Bearer {token}".encode())]


class TestBearer:
    def test_reads_the_token(self):
        assert bearer(auth("sk-1")) == b"sk-1"
        assert bearer([(b"authorization", b"bearer   sk-2 ")]) == b"sk-2"

    def test_other_schemes_and_missing_headers_are_none(self):
        assert bearer([(b"authorization", b"Basic dXNlcg==")]) is None
        assert bearer([(b"authorization", b"Bearer ")]) is None
        assert bearer([(b"x-api-key", b"sk-1")]) is None


class TestKeyRing:
    def test_static_keys(self):
        ring = KeyRing(["a", "b"])
        assert ring.enabled and len(ring) == 2
        assert ring.check(b"a") == ring.check(b"a")  # the digest: a stable identity
        with pytest.raises(AuthenticationError) as wrong:
            ring.check(b"c")
        assert wrong.value.status == 401 and wrong.value.code == "invalid_api_key"
        assert "c" not in wrong.value.message.replace("Incorrect", "")  # the key is not echoed
        with pytest.raises(AuthenticationError, match="Missing"):
            ring.check(None)

    def test_no_keys_is_off(self):
        assert not KeyRing().enabled

    def test_file_reloaded_on_change_and_bad_file_keeps_last_good(self, tmp_path):
        path = tmp_path / "keys"
        path.write_text("# the team's keys\nfirst\n\nsecond  # laptop\n")
        ring = KeyRing([], path)
        ring.check(b"first")
        ring.check(b"second")
        path.write_text("third\n")
        os.utime(path, (1, 1))  # a different mtime even within the clock's resolution
        assert ring.reload()
        ring.check(b"third")
        with pytest.raises(AuthenticationError):
            ring.check(b"first")
        path.write_text("two keys on one line\n")
        os.utime(path, (2, 2))
        assert not ring.reload()  # rejected: the last good keys stay
        ring.check(b"third")
        path.unlink()
        assert not ring.reload()
        ring.check(b"third")

    def test_an_empty_file_still_means_auth_on(self, tmp_path):
        path = tmp_path / "keys"
        path.write_text("")
        ring = KeyRing([], path)
        assert ring.enabled
        with pytest.raises(AuthenticationError):
            ring.check(b"anything")

    def test_unreadable_file_at_start_is_an_error(self, tmp_path):
        with pytest.raises(OSError):
            KeyRing([], tmp_path / "missing")

    def test_env_keys(self):
        assert keys_from_env({"SWITCHYARD_API_KEYS": " a, b\nc "}) == ["a", "b", "c"]
        assert keys_from_env({}) == []

    def test_keys_file_format(self):
        assert parse_keys_file("a\n# b\n c # d\n") == ["a", "c"]


class TestAccess:
    def test_open_when_nothing_is_configured(self):
        access = Access(KeyRing())
        assert access.open
        assert access.client([]) is None
        access.admin([])  # open too
        assert len(access.warnings("h:1")) == 2

    def test_keys_protect_v1_and_admin_routes_need_the_token(self):
        access = Access(KeyRing(["k"]), admin_token="adm")
        assert access.client(auth("k")) is not None
        with pytest.raises(AuthenticationError):
            access.client(auth("adm"))  # the admin token is no client key
        access.admin(auth("adm"))
        with pytest.raises(AuthenticationError):
            access.admin(auth("k"))  # nor is a client key an admin token
        assert access.warnings("h:1") == []

    def test_keys_without_admin_token_close_admin_routes_on_the_api_port(self):
        access = Access(KeyRing(["k"]))
        with pytest.raises(AuthenticationError, match="admin"):
            access.admin(auth("k"))
        assert any("401" in w for w in access.warnings("h:1"))

    def test_admin_listener_alone_closes_admin_routes_on_the_api_port(self):
        access = Access(KeyRing(), admin_port=0)
        assert not access.open
        with pytest.raises(AuthenticationError):
            access.admin([])
        assert access.client([]) is None  # /v1 stays open without keys (and says so)
        assert any("NO API KEY" in w for w in access.warnings("h:1"))

    def test_empty_admin_token_is_refused(self):
        with pytest.raises(ValueError):
            Access(KeyRing(), admin_token=" ")

    def test_admin_paths(self):
        for path in ("/ready", "/metrics", "/debug/route", "/admin/workers"):
            assert is_admin_path(path)
        for path in ("/health", "/v1/models", "/readyz", "/metricsx"):
            assert not is_admin_path(path)
