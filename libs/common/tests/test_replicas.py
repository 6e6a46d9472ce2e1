"""ReplicaSet: a service's names expanded to every address, followed as they change (an
injected resolver; fake clients)."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

from switchyard.common import replicas
from switchyard.common.replicas import ReplicaSet, named


class FakeClient:
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.connected = False
        self.on_state = None
        self.started = False
        self.closed = False
        self.work = 0  # what `busy` reads

    def start(self) -> None:
        self.started = True

    async def close(self) -> None:
        self.closed = True
        self.connected = False

    def set_connected(self, up: bool) -> None:
        self.connected = up
        assert self.on_state is not None
        self.on_state()


class Dns:
    """Names to addresses, changed by the test; a missing name fails as getaddrinfo does."""

    def __init__(self, **names: list[str]) -> None:
        self.names = {k.replace("_", "."): v for k, v in names.items()}
        self.lookups = 0

    async def __call__(self, host: str) -> list[str]:
        self.lookups += 1
        if host not in self.names:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return list(self.names[host])


def replica_set(dns: Dns, *endpoints: str, interval: float = 3600.0) -> ReplicaSet[FakeClient]:
    return ReplicaSet(
        endpoints, FakeClient, lambda c: c.work > 0, what="dispatcher", resolve=dns,
        interval=interval,
    )  # fmt: skip


def addresses(clients) -> list[str]:
    return [c.endpoint for c in clients]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


class TestNamed:
    @pytest.mark.parametrize(
        "endpoint, expected",
        [
            ("tcp://dispatcher:7300", ("dispatcher", "7300")),
            ("tcp://router.ns.svc.cluster.local:7200", ("router.ns.svc.cluster.local", "7200")),
            ("tcp://localhost:7200", ("localhost", "7200")),
            ("tcp://127.0.0.1:7300", None),
            ("tcp://10.1.2.3:7300", None),
            ("tcp://[::1]:7300", None),
            ("tcp://*:7300", None),
            ("tcp://eth0;dispatcher:7300", None),  # a source address: left to ZMQ
            ("ipc:///tmp/dispatcher", None),
            ("inproc://dispatcher", None),
        ],
    )  # fmt: skip
    def test_which_endpoints_are_resolved(self, endpoint, expected):
        assert named(endpoint) == expected


class TestAddresses:
    async def test_addresses_are_used_as_given_without_any_lookup(self):
        dns = Dns()
        pool = replica_set(dns, "tcp://127.0.0.1:1", "ipc:///tmp/x", "tcp://127.0.0.1:1")
        pool.start()
        try:
            assert addresses(pool.live) == ["tcp://127.0.0.1:1", "ipc:///tmp/x"]
            assert all(c.started for c in pool.live)
            assert pool._task is None
            await settle()
            assert dns.lookups == 0
        finally:
            await pool.close()

    async def test_a_name_is_every_address_it_resolves_to(self):
        dns = Dns(dispatcher=["10.0.0.3", "10.0.0.2", "10.0.0.3"])
        pool = replica_set(dns, "tcp://127.0.0.1:1", "tcp://dispatcher:7300")
        await pool.refresh()
        assert addresses(pool.live) == [
            "tcp://127.0.0.1:1",
            "tcp://10.0.0.2:7300",
            "tcp://10.0.0.3:7300",
        ]

    async def test_an_address_reached_by_two_endpoints_is_one_replica(self):
        dns = Dns(a=["10.0.0.2"], b=["10.0.0.2", "10.0.0.4"])
        pool = replica_set(dns, "tcp://a:1", "tcp://b:1")
        await pool.refresh()
        assert addresses(pool.live) == ["tcp://10.0.0.2:1", "tcp://10.0.0.4:1"]

    def test_no_endpoint_and_a_bad_interval_are_refused(self):
        with pytest.raises(ValueError, match="at least one dispatcher endpoint"):
            replica_set(Dns())
        for bad in (0.0, -1.0, float("nan"), float("inf")):
            with pytest.raises(ValueError, match="resolve interval"):
                replica_set(Dns(), "tcp://a:1", interval=bad)


class TestChanges:
    async def test_a_new_address_joins_started(self):
        dns = Dns(dispatcher=["10.0.0.2"])
        pool = replica_set(dns, "tcp://dispatcher:7300")
        pool.start()
        try:
            await settle()
            first = pool.live[0]
            dns.names["dispatcher"].append("10.0.0.3")
            await pool.refresh()
            assert addresses(pool.live) == ["tcp://10.0.0.2:7300", "tcp://10.0.0.3:7300"]
            assert pool.live[0] is first and pool.live[1].started
        finally:
            await pool.close()

    async def test_a_gone_idle_address_is_closed_at_once(self):
        dns = Dns(dispatcher=["10.0.0.2", "10.0.0.3"])
        pool = replica_set(dns, "tcp://dispatcher:7300")
        await pool.refresh()
        gone = pool.live[0]
        gone.connected = True
        dns.names["dispatcher"] = ["10.0.0.3"]
        await pool.refresh()
        await settle()
        assert addresses(pool.live) == ["tcp://10.0.0.3:7300"]
        assert gone.closed and pool.retired == ()

    async def test_a_gone_address_with_work_finishes_it_first(self):
        """Retired: no new work (out of `live`), its running work goes on over its open
        connection, and it is closed at the first round that finds it idle."""
        dns = Dns(dispatcher=["10.0.0.2", "10.0.0.3"])
        pool = replica_set(dns, "tcp://dispatcher:7300")
        await pool.refresh()
        gone = pool.live[0]
        gone.connected, gone.work = True, 2
        dns.names["dispatcher"] = ["10.0.0.3"]
        await pool.refresh()
        assert addresses(pool.live) == ["tcp://10.0.0.3:7300"]
        assert pool.retired == (gone,) and not gone.closed
        gone.work = 0
        await pool.refresh()
        await settle()
        assert gone.closed and pool.retired == ()

    async def test_a_retired_address_whose_connection_drops_is_closed(self):
        dns = Dns(dispatcher=["10.0.0.2", "10.0.0.3"])
        pool = replica_set(dns, "tcp://dispatcher:7300")
        await pool.refresh()
        gone = pool.live[0]
        gone.connected, gone.work = True, 1
        dns.names["dispatcher"] = ["10.0.0.3"]
        await pool.refresh()
        gone.set_connected(False)  # its own on_disconnect has failed the work over
        await settle()
        assert gone.closed and pool.retired == ()

    async def test_an_address_back_before_it_closed_is_the_same_client(self):
        dns = Dns(dispatcher=["10.0.0.2", "10.0.0.3"])
        pool = replica_set(dns, "tcp://dispatcher:7300")
        await pool.refresh()
        client = pool.live[0]
        client.connected, client.work = True, 1
        dns.names["dispatcher"] = ["10.0.0.3"]
        await pool.refresh()
        dns.names["dispatcher"] = ["10.0.0.2", "10.0.0.3"]
        await pool.refresh()
        assert pool.live[0] is client and pool.retired == () and not client.closed


class TestFailures:
    async def test_a_failed_or_empty_lookup_keeps_the_known_addresses(self, caplog):
        dns = Dns(dispatcher=["10.0.0.2", "10.0.0.3"])
        pool = replica_set(dns, "tcp://dispatcher:7300")
        await pool.refresh()
        known = pool.live
        del dns.names["dispatcher"]
        caplog.clear()  # (the "added" lines above are logged when an earlier test set INFO)
        with caplog.at_level(logging.WARNING, logger="switchyard.common.replicas"):
            await pool.refresh()
            await pool.refresh()
        assert pool.live == known
        warnings = [r.getMessage() for r in caplog.records]
        assert warnings == [
            "cannot resolve dispatcher name dispatcher ([Errno -2] Name or service not known): "
            "keeping its 2 known address(es)"
        ]  # once per failing streak
        dns.names["dispatcher"] = []
        await pool.refresh()
        assert pool.live == known

    async def test_a_lookup_that_hangs_counts_as_failed(self, monkeypatch):
        monkeypatch.setattr(replicas, "LOOKUP_TIMEOUT_S", 0.05)
        hang = asyncio.Event()

        async def stuck(host: str) -> list[str]:
            await hang.wait()
            return ["10.0.0.9"]

        pool = ReplicaSet(["tcp://a:1"], FakeClient, lambda c: False, what="x", resolve=stuck)
        await pool.refresh()
        assert pool.live == ()

    async def test_a_name_unknown_at_start_is_retried_until_it_resolves(self, monkeypatch):
        monkeypatch.setattr(replicas, "MIN_GAP_S", 0.01)
        dns = Dns()
        pool = replica_set(dns, "tcp://dispatcher:7300")
        pool.start()
        try:
            async with asyncio.timeout(10):
                while dns.lookups < 3:
                    await asyncio.sleep(0.01)
            assert pool.live == ()
            dns.names["dispatcher"] = ["10.0.0.2"]
            async with asyncio.timeout(10):
                while not pool.live:
                    await asyncio.sleep(0.01)
            assert pool.live[0].started
        finally:
            await pool.close()

    async def test_a_dropped_connection_triggers_a_lookup(self, monkeypatch):
        """The name is looked up again at once (not after the interval, an hour here): the
        replica may have moved to another address."""
        monkeypatch.setattr(replicas, "MIN_GAP_S", 0.01)
        dns = Dns(dispatcher=["10.0.0.2"])
        pool = replica_set(dns, "tcp://dispatcher:7300")
        pool.start()
        try:
            async with asyncio.timeout(10):
                while not pool.live:
                    await asyncio.sleep(0.01)
            old = pool.live[0]
            old.set_connected(True)
            dns.names["dispatcher"] = ["10.0.0.7"]  # restarted elsewhere
            old.set_connected(False)
            async with asyncio.timeout(10):
                while addresses(pool.live) != ["tcp://10.0.0.7:7300"]:
                    await asyncio.sleep(0.01)
            await settle()
            assert old.closed
        finally:
            await pool.close()


class TestWaitConnected:
    async def test_a_replica_that_joins_later_counts(self):
        dns = Dns(dispatcher=["10.0.0.2"])
        pool = replica_set(dns, "tcp://dispatcher:7300")
        waiting = asyncio.ensure_future(pool.wait_connected(10))
        await settle()
        assert not waiting.done()
        await pool.refresh()
        pool.live[0].set_connected(True)
        assert await waiting

    async def test_it_gives_up_after_the_timeout(self):
        pool = replica_set(Dns(), "tcp://127.0.0.1:1")
        assert not await pool.wait_connected(0.05)


class TestClose:
    async def test_close_closes_every_client_and_stops_resolving(self):
        dns = Dns(dispatcher=["10.0.0.2", "10.0.0.3"])
        pool = replica_set(dns, "tcp://dispatcher:7300")
        pool.start()
        async with asyncio.timeout(10):
            while len(pool.live) < 2:
                await asyncio.sleep(0.01)
        clients = pool.live
        await pool.close()
        assert all(c.closed for c in clients) and pool.live == ()
        assert pool._task is None
