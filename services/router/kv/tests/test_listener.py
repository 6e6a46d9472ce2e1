"""Publishers that connect: several engines publishing into the router's bound SUB (told
apart by topic), replay in that mode, data-parallel rank ports, and router replicas behind a
kv-proxy whose indexes converge."""

import asyncio
import logging

import pytest
import zmq

from switchyard.common.block_hash import block_hashes
from switchyard.common.ports import free_port
from switchyard.protos.messages import Instance, InstanceAdded, InstanceRemoved
from switchyard.router.kv.index import KvIndex
from switchyard.router.kv.ingestor import KvIngestor, ListenerSpec
from switchyard.router.kv.proxy import KvEventProxy
from switchyard.router.kv.tests.wire import chain_events, until

BS = 4
PROMPT = list(range(1, 33))  # 8 blocks
OWN = block_hashes(PROMPT, BS)
PATTERN = "kv@{host}:{port}@{model}"


def instance(iid: int, publisher, dp_size: int = 1, replay_port: int | None = None) -> Instance:
    """An engine whose publisher connects (it advertises no endpoint to connect to)."""
    replay = f"tcp://127.0.0.1:{replay_port}" if replay_port else None
    return Instance(
        instance_id=iid,
        url=f"grpc://127.0.0.1:{40000 + iid}",
        protocol="vllm",
        model="m",
        context_length=1024,
        block_size=BS,
        kv_replay_endpoint=publisher.replay_endpoint if publisher is not None else replay,
        dp_size=dp_size,
    )


def topic(iid: int) -> bytes:
    return f"kv@127.0.0.1:{40000 + iid}@m".encode()


@pytest.fixture
async def bound(zctx):
    """An ingestor whose listener binds a free port; closed at teardown."""
    made = []

    async def make(mode="bind", endpoint=None, pattern=PATTERN) -> KvIngestor:
        endpoint = endpoint or f"tcp://127.0.0.1:{free_port()}"
        ing = KvIngestor(
            KvIndex(),
            context=zctx,
            open_client=None,
            listener=ListenerSpec(mode, endpoint, pattern),
        )
        await ing.start()
        ing.listener.unknown_grace = 0.0  # report unknown topics at once
        made.append(ing)
        return ing

    yield make
    for ing in made:
        await ing.close()


class TestBoundSub:
    async def test_several_engines_told_apart_by_topic(self, bound, make_publisher):
        ing = await bound()
        where = ing.listener.endpoints[0]
        pubs = {iid: make_publisher(topic=topic(iid), connect_to=where) for iid in (1, 2, 3)}
        ing.apply_events([InstanceAdded(instance(iid, pub)) for iid, pub in pubs.items()])
        for pub in pubs.values():
            await pub.wait_subscribed()
        await pubs[1].publish(chain_events(PROMPT, BS, 100))
        await pubs[2].publish(chain_events(PROMPT[:8], BS, 200))
        await pubs[3].publish(chain_events(list(range(900, 916)), BS, 300))
        await until(
            lambda: ing.index.overlaps(OWN) == {(1, 0): 8, (2, 0): 2}, "two engines indexed"
        )
        await until(lambda: ing.index.size((3, 0)) == 4, "the third indexed apart")
        assert ing.counters.unknown_topic == 0

    async def test_gap_replayed_from_the_engine(self, bound, make_publisher):
        ing = await bound()
        pub = make_publisher(topic=topic(1), connect_to=ing.listener.endpoints[0])
        ing.apply_events([InstanceAdded(instance(1, pub))])
        await pub.wait_subscribed()
        await ing.streams(1)[0].caught_up.wait()
        events = chain_events(PROMPT, BS, 100)
        await pub.publish([events[0]])
        await pub.publish([events[1]], send=False)
        await pub.publish([events[2]], send=False)
        await pub.publish([events[3]])
        await until(lambda: ing.index.overlaps(OWN) == {(1, 0): 8}, "gap filled by replay")
        assert ing.counters.gaps == 1
        # catch-ups (at registration, at the connection and after it), and the gap's [1, 3)
        assert 1 in pub.replay_requests

    async def test_late_join_caught_up_through_replay(self, bound, make_publisher):
        """A worker added after its engine published: replay gives the history, and the
        stream keeps following afterwards (not one snapshot and then nothing)."""
        ing = await bound()
        pub = make_publisher(topic=topic(1), connect_to=ing.listener.endpoints[0])
        await pub.wait_subscribed()
        events = chain_events(PROMPT, BS, 100)
        await pub.publish([events[0]])  # nobody knows topic 1 yet: dropped and counted
        await pub.publish([events[1]])
        await until(lambda: ing.counters.unknown_topic == 2, "unknown topic counted")
        ing.apply_events([InstanceAdded(instance(1, pub))])
        await until(lambda: ing.index.overlaps(OWN) == {(1, 0): 4}, "caught up")
        await pub.publish([events[2]])
        await pub.publish([events[3]])
        await until(lambda: ing.index.overlaps(OWN) == {(1, 0): 8}, "and following")

    async def test_publisher_connecting_late_is_caught_up(self, bound, make_publisher):
        """Issue 32: an engine registered before its publisher connects, whose one burst
        went out before the connection was made, is caught up when it connects."""
        ing = await bound()
        replay_port = free_port()
        ing.apply_events([InstanceAdded(instance(1, None, replay_port=replay_port))])
        await ing.streams(1)[0].caught_up.wait()  # nothing there yet: the replay failed
        pub = make_publisher(
            topic=topic(1), connect_to=ing.listener.endpoints[0], ports=(free_port(), replay_port)
        )
        await pub.publish(chain_events(PROMPT, BS, 100), send=False)  # before the connection
        await until(lambda: ing.index.overlaps(OWN) == {(1, 0): 8}, "caught up on connect")
        assert ing.counters.reconnects >= 1

    async def test_peer_address_when_the_topic_names_nobody(self, bound, make_publisher):
        ing = await bound()
        pub = make_publisher(topic=b"", connect_to=ing.listener.endpoints[0])
        ing.apply_events([InstanceAdded(instance(1, pub))])  # the only instance on 127.0.0.1
        await pub.wait_subscribed()
        await pub.publish(chain_events(PROMPT, BS, 100))
        await until(lambda: ing.index.overlaps(OWN) == {(1, 0): 8}, "matched by peer address")

    async def test_unknown_and_ambiguous_topics_reported(self, bound, make_publisher, caplog):
        ing = await bound(pattern="kv@{host}@{model}")  # two engines on one host: one topic
        where = ing.listener.endpoints[0]
        a = make_publisher(topic=b"kv@127.0.0.1@m", connect_to=where)
        b = make_publisher(topic=b"nobody", connect_to=where)
        with caplog.at_level(logging.WARNING):
            ing.apply_events([InstanceAdded(instance(1, None)), InstanceAdded(instance(2, None))])
            await a.wait_subscribed()
            await b.wait_subscribed()
            await a.publish(chain_events(PROMPT, BS, 100))
            await b.publish(chain_events(PROMPT, BS, 100))
            await b.publish(chain_events(PROMPT, BS, 100))
            await until(lambda: ing.counters.unknown_topic == 3, "dropped and counted")
        assert len(ing.index) == 0
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("names instances" in w for w in warnings)
        assert sum("'nobody'" in w for w in warnings) == 1  # once per topic

    async def test_data_parallel_ranks_connect_to_base_plus_rank(self, bound, make_publisher):
        ing = await bound()
        ing.apply_events([InstanceAdded(instance(1, None, dp_size=2))])
        assert len(ing.listener.endpoints) == 2
        rank1 = make_publisher(topic=topic(1), connect_to=ing.listener.endpoints[1])
        await rank1.wait_subscribed()
        await rank1.publish(chain_events(PROMPT, BS, 100))
        await until(lambda: ing.index.overlaps(OWN) == {(1, 1): 8}, "rank 1 indexed")

    async def test_port_0_binds_a_free_port_and_ranks_follow_it(self, bound, make_publisher):
        ing = await bound(endpoint="tcp://127.0.0.1:0")
        ing.apply_events([InstanceAdded(instance(1, None, dp_size=2))])
        base, rank1 = (int(e.rsplit(":", 1)[1]) for e in ing.listener.endpoints)
        assert base != 0 and rank1 == base + 1
        pub = make_publisher(topic=topic(1), connect_to=ing.listener.endpoints[0])
        await pub.wait_subscribed()
        await pub.publish(chain_events(PROMPT, BS, 100))
        await until(lambda: ing.index.overlaps(OWN) == {(1, 0): 8}, "rank 0 indexed")

    async def test_removed_instance_unregistered(self, bound, make_publisher):
        ing = await bound()
        pub = make_publisher(topic=topic(1), connect_to=ing.listener.endpoints[0])
        ing.apply_events([InstanceAdded(instance(1, pub))])
        ing.apply_events([InstanceRemoved(1, "grpc://127.0.0.1:40001")])
        await pub.wait_subscribed()
        await pub.publish(chain_events(PROMPT, BS, 100))
        await until(lambda: ing.counters.unknown_topic == 1, "no longer routed")


class TestProxy:
    async def test_every_router_replica_converges(self, bound, make_publisher):
        """Engines connect to the proxy's frontend; each router replica connects to its
        backend and builds the same index, a replica started late included."""
        proxy = KvEventProxy("tcp://127.0.0.1:0", "tcp://127.0.0.1:0")  # free ports
        proxy.start()
        front, back = proxy.frontends[0], proxy.backends[0]
        try:
            first = await bound(mode="connect", endpoint=back)
            pubs = {iid: make_publisher(topic=topic(iid), connect_to=front) for iid in (1, 2)}
            instances = [InstanceAdded(instance(iid, pub)) for iid, pub in pubs.items()]
            first.apply_events(instances)
            for pub in pubs.values():
                await pub.wait_subscribed()
            events = chain_events(PROMPT, BS, 100)
            await pubs[1].publish(events[:2])
            await pubs[2].publish(chain_events(PROMPT[:8], BS, 500))
            await until(
                lambda: first.index.overlaps(OWN) == {(1, 0): 4, (2, 0): 2}, "first replica"
            )
            # An engine that connects to the proxy after publishing: the proxy's notice
            # makes every replica catch it up.
            late = make_publisher(topic=topic(3), connect_to=None)
            first.apply_events([InstanceAdded(instance(3, late))])
            late.pub.close(linger=0)
            late.pub = late.pub.context.socket(zmq.XPUB)
            late.pub.setsockopt(zmq.LINGER, 0)
            await late.publish(chain_events(list(range(800, 816)), BS, 700), send=False)
            late.pub.connect(front)
            await until(lambda: first.index.size((3, 0)) == 4, "caught up on the proxy's notice")
            second = await bound(mode="connect", endpoint=back)  # joins late
            second.apply_events(instances)
            await asyncio.sleep(0.2)  # let its SUB's subscription reach the engines
            await pubs[1].publish(events[2:])
            expected = {(1, 0): 8, (2, 0): 2}
            for replica in (first, second):
                await until(lambda r=replica: r.index.overlaps(OWN) == expected, "converged")
            assert first.index.size((1, 0)) == second.index.size((1, 0)) == 8
        finally:
            proxy.stop()
