"""DispatcherClient over a dispatcher name that resolves to several addresses (an injected
resolver; real ZMQ servers on 127.0.0.2-4, one port): every replica takes generations, a
replica that joins later too, and one whose address goes away takes no new generation while
the ones it runs finish there (replies and cancels), then is closed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import msgspec
import zmq
import zmq.asyncio
from support.loopback import REPLICA_HOSTS, common_free_port

from switchyard.preprocessor.dispatcher_client import DispatcherClient
from switchyard.protos import codec
from switchyard.protos.messages import (
    CancelRequest,
    GenerateFinished,
    GenerateRequest,
    SamplingParams,
    TokenDelta,
)


def request(rid: str) -> GenerateRequest:
    return GenerateRequest(
        request_id=rid, instance_id=1, token_ids=[1], sampling=SamplingParams(max_tokens=2)
    )


class Server:
    """A dispatcher's ROUTER socket: what it received, and replies to a peer."""

    def __init__(self, sock: zmq.asyncio.Socket) -> None:
        self.sock = sock
        self.peer = b""
        self.got: list[object] = []

    async def receive(self, count: int) -> list[object]:
        async with asyncio.timeout(10):
            while len(self.got) < count:
                self.peer, payload = await self.sock.recv_multipart()
                message = codec.dispatcher_request.decode(payload)
                self.got += message if isinstance(message, list) else [message]
        return self.got

    async def reply(self, *replies: object) -> None:
        await self.sock.send_multipart([self.peer, msgspec.msgpack.encode(list(replies))])


@contextlib.asynccontextmanager
async def servers() -> AsyncIterator[tuple[int, dict[str, Server]]]:
    """A ROUTER on each of REPLICA_HOSTS, all on one port (as a name's replicas are)."""
    ctx = zmq.asyncio.Context()
    port = common_free_port()
    socks = [ctx.socket(zmq.ROUTER) for _ in REPLICA_HOSTS]
    try:
        for host, sock in zip(REPLICA_HOSTS, socks, strict=True):
            sock.bind(f"tcp://{host}:{port}")
        yield port, {h: Server(sock) for h, sock in zip(REPLICA_HOSTS, socks, strict=True)}
    finally:
        for sock in socks:
            sock.close(linger=0)
        ctx.term()


async def until(predicate, what: str) -> None:
    async with asyncio.timeout(10):
        while not predicate():
            await asyncio.sleep(0.01)


class TestNameWithReplicas:
    async def test_replicas_join_and_leave_without_disturbing_running_generations(self):
        names = {"dispatchers.test": ["127.0.0.2", "127.0.0.3"]}

        async def resolve(host: str) -> list[str]:
            return list(names[host])

        async with servers() as (port, srv):
            client = DispatcherClient(
                [f"tcp://dispatchers.test:{port}"], resolve=resolve, resolve_interval=3600
            )
            try:
                client.start()
                await until(
                    lambda: len(client.replicas.live) == 2 and all(
                        r.connected for r in client.replicas.live
                    ),
                    "both replicas connected",
                )  # fmt: skip
                streams = [await client.open(request(f"r{n}")) for n in range(4)]
                for host in REPLICA_HOSTS[:2]:  # in turn: two each
                    assert len(await srv[host].receive(2)) == 2
                on_2_ids = {m.request_id for m in srv["127.0.0.2"].got}
                on_2 = [s for s in streams if s.request_id in on_2_ids]

                names["dispatchers.test"] = ["127.0.0.3"]  # .2 leaves the name
                await client.replicas.refresh()
                [retired] = client.replicas.retired
                assert retired.endpoint == f"tcp://127.0.0.2:{port}" and retired.connected

                # New generations go to .3 only.
                later = [await client.open(request(f"s{n}")) for n in range(2)]
                assert len(await srv["127.0.0.3"].receive(4)) == 4
                # .2's generations go on: replies arrive, a cancel reaches it.
                first, second = on_2
                await srv["127.0.0.2"].reply(
                    TokenDelta(first.request_id, [7]),
                    GenerateFinished(
                        request_id=first.request_id, finish_reason="length",
                        prompt_tokens=1, completion_tokens=1,
                    ),
                )  # fmt: skip
                async with asyncio.timeout(10):
                    assert (await first.queue.get()).token_ids == [7]
                    assert isinstance(await first.queue.get(), GenerateFinished)
                first.close()
                await second.cancel()
                got = await srv["127.0.0.2"].receive(3)
                assert got[2] == CancelRequest(second.request_id)
                await client.replicas.refresh()  # idle now: closed
                assert client.replicas.retired == ()
                await until(lambda: not retired.connected, "the retired replica closed")

                names["dispatchers.test"] = ["127.0.0.3", "127.0.0.4"]  # .4 joins
                await client.replicas.refresh()
                await until(lambda: all(r.connected for r in client.replicas.live), ".4 connected")
                more = [await client.open(request(f"t{n}")) for n in range(2)]
                assert [m.request_id for m in await srv["127.0.0.4"].receive(1)] in (
                    ["t0"],
                    ["t1"],
                )
                for stream in streams + later + more:
                    stream.close()
            finally:
                await client.close()
