from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import sglang_scheduler_pb2 as sgl
from smg_grpc_proto.generated import vllm_engine_pb2 as vll

from switchyard.router.load import EngineLoads, InFlightTracker

A, B = (1, 0), (2, 0)


def counts(t, key):
    load = t.load(key)
    return load.in_flight, load.in_prefill


class TestInFlightTracker:
    def test_route_first_token_finish(self):
        t = InFlightTracker()
        t.add("a", A, now=0, prefill_tokens=100, tokens=120)
        assert counts(t, A) == (1, 1)
        assert (t.load(A).prefill_tokens, t.load(A).active_tokens) == (100, 120)
        t.first_token("a")
        assert counts(t, A) == (1, 0) and t.load(A).prefill_tokens == 0
        t.finish("a")
        assert counts(t, A) == (0, 0) and len(t) == 0 and t.load(A).active_tokens == 0

    def test_first_token_times_the_prefill(self):
        t = InFlightTracker()
        t.add("a", A, now=0, prefill_tokens=100, learn=True)
        t.add("b", A, now=1, prefill_tokens=50, learn=True)  # 100 tokens were ahead of it
        seen = t.first_token("b", now=3)
        assert (seen.key, seen.tokens, seen.seconds) == (A, 150, 2)
        t.add("c", A, now=1, prefill_tokens=50)  # learn=False: a decode leg
        assert t.first_token("c", now=2) is None

    def test_an_untimed_prefill_ends_at_its_predicted_time(self):
        """A whole request: its prefill counts until the predicted time, then not; its end
        (the first notice that comes) times nothing."""
        t = InFlightTracker()
        t.add("a", A, now=0, prefill_tokens=100, learn=False, prefilled_at=2.0)
        t.prefilled(1.9)
        assert counts(t, A) == (1, 1) and t.load(A).prefill_tokens == 100
        t.prefilled(2.0)
        assert counts(t, A) == (1, 0) and t.load(A).prefill_tokens == 0
        assert t.first_token("a", now=5) is None
        t.finish("a")
        assert counts(t, A) == (0, 0)

    def test_notices_are_idempotent(self):
        t = InFlightTracker()
        t.add("a", A, now=0)
        t.first_token("a")
        t.first_token("a")
        t.finish("a")
        t.finish("a")
        t.finish("never-routed")
        assert counts(t, A) == (0, 0)

    def test_finish_before_first_token_frees_prefill(self):
        t = InFlightTracker()
        t.add("a", A, now=0, prefill_tokens=10)
        t.finish("a")
        assert t.load(A).in_prefill == 0 and t.load(A).prefill_tokens == 0

    def test_reroute_moves_the_request(self):
        t = InFlightTracker()
        t.add("a", A, now=0)
        t.add("a", B, now=1)
        assert (t.load(A).in_flight, t.load(B).in_flight) == (0, 1)

    def test_lost_notice_expires(self):
        t = InFlightTracker(ttl=10)
        t.add("a", A, now=0)
        t.add("b", A, now=5)
        assert t.expire(now=10) == 1
        assert t.load(A).in_flight == 1
        assert t.expire(now=15) == 1
        assert t.load(A).in_flight == 0

    def test_drop_instance(self):
        t = InFlightTracker()
        t.add("a", A, now=0)
        t.add("b", B, now=0)
        t.drop_instance(1)
        assert (t.load(A).in_flight, t.load(B).in_flight, len(t)) == (0, 1, 1)


class TestEngineLoads:
    def test_record_from_the_event_stream(self):
        loads = EngineLoads()
        record = common_pb2.EngineLoad(
            running_requests=3,
            waiting_requests=2,
            waiting_uncached_tokens=900,
            token_usage=0.5,
            max_running_requests=8,
        )
        loads.update(A, record, now=5)
        load = loads.load(A)
        assert (load.running, load.waiting, load.waiting_uncached_tokens) == (3, 2, 900)
        assert (load.kv_usage, load.max_running, load.at) == (0.5, 8, 5)

    def test_sglang_and_vllm_get_loads(self):
        loads = EngineLoads()
        loads.update(
            A,
            sgl.SchedulerLoad(
                num_running_reqs=4,
                num_waiting_reqs=1,
                num_waiting_uncached_tokens=64,
                token_usage=0.25,
                max_running_requests=16,
            ),
            now=1,
        )
        loads.update(B, vll.SchedulerLoad(num_running_reqs=2, num_waiting_reqs=3), now=1)
        assert loads.load(A).waiting_uncached_tokens == 64
        # vLLM leaves what it cannot read at 0: a queue with 0 tokens is "not said".
        assert loads.load(B).waiting_uncached_tokens is None
        assert loads.load(B).waiting == 3
