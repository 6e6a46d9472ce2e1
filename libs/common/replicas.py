"""Every replica of a service behind one name: one client per address the name resolves to.

An orchestrator scales a service as one name with one address per replica: Docker's DNS
answers a compose service name with an A record per running container, a Kubernetes headless
Service with one per ready pod. ZMQ resolves a name once, when it connects, and holds one TCP
connection: to one replica, however many run. So a client of a scalable service resolves the
name itself and keeps a client of its own per address (a DEALER each, which also keeps a
generation and its cancel on one replica), as it does for endpoints given one by one.

The names are resolved again every `interval`, and soon after a connection drops (a replica
restarted at another address, or gone): an address that appears gets a client; one that
disappears is retired: out of the rotation at once, closed once the work it carries is done
(`busy` says) or its connection drops (which fails that work over, as for any replica). A
lookup that fails or finds nothing keeps the addresses known: a DNS hiccup must not drop
healthy replicas, and a replica that is really gone drops its connection anyway.

Endpoints with an IP address, and ipc:// or inproc:// ones, are used as given (`switchyard
up`'s loopback endpoints): nothing is resolved and no task runs. Like ZMQ without its IPV6
option (which no Switchyard socket sets), only IPv4 addresses are used.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import threading
from collections.abc import Awaitable, Callable, Iterable
from typing import Generic, Protocol, TypeVar

log = logging.getLogger(__name__)

RESOLVE_INTERVAL_S = 5.0
MIN_GAP_S = 1.0  # between two lookups, however often connections drop
LOOKUP_TIMEOUT_S = 10.0  # a resolver that does not answer counts as a failed lookup

Resolve = Callable[[str], Awaitable[list[str]]]  # a host name -> its IPv4 addresses


# One lookup at a time per process (a few names every few seconds): not every NSS module is
# safe to call from several threads while it reloads its file (nss_wrapper crashed in
# uvloop's thread pool with two lookups racing a hosts-file change).
_one_lookup = threading.Lock()


def _getaddrinfo_ipv4(host: str) -> list[str]:
    with _one_lookup:
        infos = socket.getaddrinfo(host, None, family=socket.AF_INET, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


async def resolve_ipv4(host: str) -> list[str]:
    """The system resolver (getaddrinfo: /etc/hosts, then DNS), in the loop's executor."""
    return await asyncio.get_running_loop().run_in_executor(None, _getaddrinfo_ipv4, host)


def named(endpoint: str) -> tuple[str, str] | None:
    """(host, port) of a tcp:// endpoint whose host is a name to resolve; None for one to use
    as given (an IP address, a wildcard, a source address `tcp://src;host:port`, ipc://,
    inproc://)."""
    transport, _, address = endpoint.partition("://")
    if transport != "tcp" or ";" in address:
        return None
    host, _, port = address.rpartition(":")
    if not host or host == "*" or host.startswith("["):
        return None
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return host, port
    return None


class Replica(Protocol):
    """What the set needs of a client (messaging.DealerClient has it all)."""

    endpoint: str
    connected: bool
    on_state: Callable[[], None] | None  # set by the set: called when `connected` changes

    def start(self) -> None: ...

    async def close(self) -> None: ...


R = TypeVar("R", bound=Replica)


class ReplicaSet(Generic[R]):
    """The clients of one service's replicas: `live` (the rotation, a tuple swapped on every
    change, so a pick reads it without a lock) and the retired ones still finishing work.

    `make(address)` builds a client, `busy(client)` says it still carries work (a retired
    one is closed once it does not). `what` names the service in logs."""

    def __init__(
        self,
        endpoints: Iterable[str],
        make: Callable[[str], R],
        busy: Callable[[R], bool],
        *,
        what: str,
        resolve: Resolve = resolve_ipv4,
        interval: float = RESOLVE_INTERVAL_S,
    ) -> None:
        self.endpoints = list(dict.fromkeys(endpoints))
        if not self.endpoints:
            raise ValueError(f"at least one {what} endpoint is needed")
        if not 0 < interval < float("inf"):
            raise ValueError(f"the {what} resolve interval must be positive, got {interval}")
        self.what = what
        self.interval = interval
        self._make = make
        self._busy = busy
        self._resolve = resolve
        self._names = {e: n for e in self.endpoints if (n := named(e)) is not None}
        self._found: dict[str, list[str]] = {}  # endpoint with a name -> its addresses
        self._failing: set[str] = set()  # names whose last lookup failed (warned once)
        self._clients: dict[str, R] = {}  # address -> client, live and retired
        self._retired: set[str] = set()
        self.live: tuple[R, ...] = ()
        self._changed = asyncio.Event()  # set (and replaced) on any change; see wait_connected
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._started = False
        self._closed = False
        self._apply()  # the endpoints given as addresses

    @property
    def retired(self) -> tuple[R, ...]:
        return tuple(self._clients[a] for a in self._retired)

    def start(self) -> None:
        """Start every client; with names, resolve them now and every `interval`."""
        if self._started or self._closed:
            return
        self._started = True
        for client in self._clients.values():
            client.start()
        if self._names:
            self._task = asyncio.create_task(self._run(), name=f"resolve:{self.what}")

    def connected(self) -> bool:
        return any(c.connected for c in self.live)

    async def wait_connected(self, timeout: float) -> bool:
        """True once a live client is connected (one that joins meanwhile counts); False
        after `timeout`."""
        try:
            async with asyncio.timeout(timeout):
                while not self.connected():
                    await self._changed.wait()
        except TimeoutError:
            return False
        return True

    def resolve_soon(self) -> None:
        """Look the names up again now (at most every MIN_GAP_S): a connection failed."""
        if self._names:
            self._wake.set()

    async def refresh(self) -> None:
        """One round: resolve every name, then add, retire and close clients to match."""
        names = list(self._names.items())
        found = await asyncio.gather(*(self._lookup(host) for _, (host, _) in names))
        for (endpoint, (_, port)), addresses in zip(names, found, strict=True):
            if addresses:
                self._found[endpoint] = [f"tcp://{a}:{port}" for a in sorted(set(addresses))]
        self._apply()

    async def _lookup(self, host: str) -> list[str]:
        try:
            async with asyncio.timeout(LOOKUP_TIMEOUT_S):
                addresses = await self._resolve(host)
        except (OSError, TimeoutError) as exc:
            problem = str(exc) or type(exc).__name__
        else:
            if addresses:
                if host in self._failing:
                    self._failing.discard(host)
                    log.info("%s name %s resolves again", self.what, host)
                return addresses
            problem = "no address"
        if host not in self._failing:
            self._failing.add(host)
            log.warning(
                "cannot resolve %s name %s (%s): keeping its %d known address(es)",
                self.what,
                host,
                problem,
                sum(len(v) for e, v in self._found.items() if self._names[e][0] == host),
            )
        return []

    def _apply(self) -> None:
        wanted: dict[str, str] = {}  # address -> the name it is an address of ("": none)
        for endpoint in self.endpoints:
            name = self._names.get(endpoint)
            for address in self._found.get(endpoint, ()) if name else [endpoint]:
                wanted.setdefault(address, name[0] if name else "")
        for address, host in wanted.items():
            if address not in self._clients:
                client = self._make(address)
                client.on_state = lambda c=client: self._on_state(c)  # type: ignore[misc]
                self._clients[address] = client
                if self._started:
                    client.start()
                if host:
                    log.info("%s %s added (an address of %s)", self.what, address, host)
            elif address in self._retired:
                self._retired.discard(address)
                log.info("%s %s is back in the rotation", self.what, address)
        for address in self._clients.keys() - wanted.keys() - self._retired:
            self._retired.add(address)
            log.info(
                "%s %s retired (gone from its name): no new work, closed once its work is done",
                self.what,
                address,
            )
        self.live = tuple(self._clients[a] for a in wanted)
        self._close_idle()
        self._notify()

    def _close_idle(self) -> None:
        for address in list(self._retired):
            client = self._clients[address]
            if client.connected and self._busy(client):
                continue
            self._retired.discard(address)
            del self._clients[address]
            log.info("%s %s closed", self.what, address)
            task = asyncio.get_running_loop().create_task(client.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def _on_state(self, client: R) -> None:
        if not client.connected:
            self.resolve_soon()
            if client.endpoint in self._retired:
                self._close_idle()
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            last = loop.time()
            try:
                await self.refresh()
            except Exception:  # never let one bad round end the resolving
                log.exception("resolving the %s names failed", self.what)
            # A name with no address yet (the service is starting) is retried sooner.
            wait = MIN_GAP_S if len(self._found) < len(self._names) else self.interval
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()
            self._wake.clear()
            gap = MIN_GAP_S - (loop.time() - last)
            if gap > 0:
                await asyncio.sleep(gap)

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        clients, self._clients = list(self._clients.values()), {}
        self._retired.clear()
        self.live = ()
        for client in clients:
            await client.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
