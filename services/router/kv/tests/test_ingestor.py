import grpc
import msgspec
import pytest

from switchyard.common.block_hash import block_hashes
from switchyard.common.engines.sglang import SglangClient
from switchyard.protos.messages import Instance, InstanceAdded, InstanceRemoved, InstanceUpdated
from switchyard.router.kv.grpc_source import GrpcKvSource
from switchyard.router.kv.index import KvIndex
from switchyard.router.kv.ingestor import KvIngestor, ListenerSpec, SourceSpec, source_spec
from switchyard.router.kv.stream import KvStream
from switchyard.router.kv.tests.wire import chain_events, free_port, until
from switchyard.router.kv.types import Stored

BS = 4
PROMPT = list(range(1, 17))
OWN = block_hashes(PROMPT, BS)
W1 = (1, 0)


def instance(iid: int, publisher=None, *, wildcard: bool = True, **kw) -> Instance:
    events = replay = None
    if publisher is not None:
        events = f"tcp://*:{publisher.pub_port}" if wildcard else publisher.endpoint
        replay = f"tcp://0.0.0.0:{publisher.replay_port}"
    return Instance(
        instance_id=iid,
        url="grpc://127.0.0.1:50051",
        protocol="sglang",
        model="m",
        context_length=1024,
        block_size=BS,
        kv_events_endpoint=events,
        kv_replay_endpoint=replay,
        **kw,
    )


@pytest.fixture
async def ingestor():
    made = []

    def make(**kwargs) -> KvIngestor:
        kwargs.setdefault("open_client", None)
        made.append(KvIngestor(KvIndex(), **kwargs))
        return made[-1]

    yield make
    for ing in made:
        await ing.close()


class TestSourceSpec:
    def test_wildcards_resolved_with_the_engine_host(self):
        inst = msgspec.structs.replace(instance(1), kv_events_endpoint="tcp://*:5557")
        assert source_spec(inst) == SourceSpec(
            "zmq", 1, ("tcp://127.0.0.1:5557",), (None,), None, "127.0.0.1"
        )

    def test_one_endpoint_per_rank(self):
        inst = msgspec.structs.replace(
            instance(1),
            kv_events_endpoint="tcp://*:5557",
            kv_replay_endpoint="tcp://*:6000",
            dp_size=3,
        )
        spec = source_spec(inst)
        assert spec.endpoints == tuple(f"tcp://127.0.0.1:{5557 + r}" for r in range(3))
        assert spec.replay_endpoints == tuple(f"tcp://127.0.0.1:{6000 + r}" for r in range(3))

    def test_grpc_fallback_without_endpoint(self):
        expected = SourceSpec("grpc", 1, url="grpc://127.0.0.1:50051", protocol="sglang")
        assert source_spec(instance(1)) == expected
        assert source_spec(instance(1), grpc_fallback=False) is None

    def test_listener_instead_of_grpc(self):
        spec = source_spec(instance(1), ListenerSpec("bind", "tcp://*:5557", "kv@{host}:{port}"))
        assert (spec.kind, spec.endpoints, spec.topic) == ("zmq", (), "kv@127.0.0.1:50051")

    def test_bad_topic_pattern(self):
        with pytest.raises(ValueError, match="pod"):
            ListenerSpec("bind", "tcp://*:5557", "kv@{pod}")


class TestLifecycle:
    async def test_added_instance_is_followed(self, ingestor, make_publisher):
        pub = make_publisher()
        ing = ingestor()
        ing.apply_events([InstanceAdded(instance(1, pub))])
        stream = ing.source(1)
        assert isinstance(stream, KvStream)
        assert stream.replay_endpoint == pub.replay_endpoint
        await pub.wait_subscribed()
        await pub.publish(chain_events(PROMPT, BS, 10))
        await until(lambda: ing.index.overlaps(OWN) == {W1: 4}, "blocks indexed")
        assert ing.counters.events_applied == 2

    async def test_source_starts_from_an_empty_view(self, ingestor, make_publisher):
        pub = make_publisher()
        ing = ingestor()
        ing.index.apply_batch(W1, [Stored([1], None, PROMPT[:4], BS)])
        ing.apply_events([InstanceAdded(instance(1, pub))])
        assert ing.index.size(W1) == 0

    async def test_update_without_endpoint_change_keeps_the_source(self, ingestor, make_publisher):
        pub = make_publisher()
        ing = ingestor()
        ing.apply_events([InstanceAdded(instance(1, pub))])
        source = ing.source(1)
        ing.apply_events([InstanceUpdated(instance(1, pub, max_running_requests=8))])
        assert ing.source(1) is source

    async def test_endpoint_change_restarts_from_empty(self, ingestor, make_publisher):
        old, new = make_publisher(), make_publisher()
        ing = ingestor()
        ing.apply_events([InstanceAdded(instance(1, old))])
        await old.wait_subscribed()
        await old.publish(chain_events(PROMPT, BS, 10))
        await until(lambda: ing.index.size(W1) == 4, "old blocks indexed")
        ing.apply_events([InstanceUpdated(instance(1, new))])
        assert ing.source(1).replay_endpoint == new.replay_endpoint
        await new.wait_subscribed()
        await until(lambda: ing.index.size(W1) == 0, "old view dropped")
        await new.publish(chain_events(PROMPT[:8], BS, 50))
        await until(lambda: ing.index.overlaps(OWN) == {W1: 2}, "new blocks indexed")

    async def test_removed_stops_the_source_and_drops_the_worker(self, ingestor, make_publisher):
        pub = make_publisher()
        ing = ingestor()
        ing.apply_events([InstanceAdded(instance(1, pub)), InstanceAdded(instance(2))])
        await pub.wait_subscribed()
        await pub.publish(chain_events(PROMPT, BS, 10))
        await until(lambda: ing.index.size(W1) == 4, "blocks indexed")
        ing.apply_events([InstanceRemoved(1, "grpc://127.0.0.1:50051")])
        assert ing.source(1) is None
        assert ing.index.workers() == []
        assert ing.index.overlaps(OWN) == {}
        await pub.publish(chain_events(PROMPT, BS, 10))  # nobody applies it any more
        ing.apply_events([InstanceRemoved(3, "grpc://127.0.0.1:1")])  # unknown: nothing

    async def test_no_source_without_endpoint_or_fallback(self, ingestor):
        ing = ingestor()
        ing.apply_events([InstanceAdded(instance(1))])
        assert ing.source(1) is None

    async def test_grpc_fallback(self, ingestor):
        url = f"grpc://127.0.0.1:{free_port()}"  # nothing listens: the source retries

        def open_client(inst: Instance) -> SglangClient:
            assert inst.instance_id == 1
            return SglangClient(grpc.aio.insecure_channel(url.split("://")[1]), 1)

        ing = ingestor(open_client=open_client)
        ing.apply_events([InstanceAdded(instance(1))])
        assert isinstance(ing.source(1), GrpcKvSource)

    async def test_shared_context_left_open(self, zctx, make_publisher):
        pub = make_publisher()
        ing = KvIngestor(KvIndex(), context=zctx, open_client=None)
        ing.apply_events([InstanceAdded(instance(1, pub, wildcard=False))])
        await pub.wait_subscribed()
        await ing.close()
        ing.apply_events([InstanceAdded(instance(2, pub))])  # after close: ignored
        assert ing.source(2) is None
        assert not zctx.closed


class TestSilence:
    async def test_routed_but_never_heard_is_reported_once(self, ingestor, make_publisher):
        pub = make_publisher()
        ing = ingestor(silence_after=5.0)
        ing.apply_events([InstanceAdded(instance(1, pub))])
        await pub.wait_subscribed()
        assert ing.check_silence(now=100.0) == []  # never routed to: an idle engine is fine
        ing.note_routed(1, now=100.0)
        assert ing.check_silence(now=104.0) == []
        assert ing.check_silence(now=105.0) == [1]
        assert "nothing on its PUB socket" in ing.silent[1]
        assert ing.check_silence(now=200.0) == []  # once
        await pub.publish(chain_events(PROMPT, BS, 10))
        await until(lambda: not ing.silent, "heard from")

    async def test_heard_instance_is_never_reported(self, ingestor, make_publisher):
        pub = make_publisher()
        ing = ingestor(silence_after=1.0)
        ing.apply_events([InstanceAdded(instance(1, pub))])
        await pub.wait_subscribed()
        await pub.publish(chain_events(PROMPT, BS, 10))
        await until(lambda: ing.index.size(W1) == 4, "indexed")
        ing.note_routed(1, now=0.0)
        assert ing.check_silence(now=10.0) == []
