"""Fixtures for the KV ingestion tests: a ZMQ context that must end with no open socket, and
fake engine publishers on free loopback ports."""

from __future__ import annotations

import pytest
import zmq.asyncio

from switchyard.router.kv.tests.wire import FakePublisher


@pytest.fixture
async def zctx():
    ctx = zmq.asyncio.Context()
    yield ctx
    # term() blocks while any socket is open: a leak hangs here instead of passing.
    ctx.term()


@pytest.fixture
async def make_publisher(zctx):
    made: list[FakePublisher] = []

    def make(
        topic: bytes = b"", connect_to: str | None = None, ports: tuple[int, int] | None = None
    ) -> FakePublisher:
        publisher = FakePublisher(zctx, topic, connect_to, ports)
        made.append(publisher)
        return publisher

    yield make
    for publisher in made:
        await publisher.close()
