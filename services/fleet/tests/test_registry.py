import pytest

from switchyard.common.engines import EngineInfo
from switchyard.common.workers import WorkerSpec
from switchyard.fleet.registry import Registry, build_instance, connectable_endpoint, resolve_role

A = WorkerSpec("grpc://10.0.0.1:30000")
B = WorkerSpec("grpc://10.0.0.2:30000")
P = WorkerSpec("grpc://10.0.0.3:30000", prefill=True)


def info(role: str | None = None, **changes) -> EngineInfo:
    fields = dict(protocol="sglang", model="m", context_length=4096, block_size=16, role=role)
    fields.update(changes)
    return EngineInfo(**fields)


class TestResolveRole:
    def test_engine_role_wins(self):
        assert resolve_role("decode", True, True) == "decode"
        assert resolve_role("prefill", False, False) == "prefill"

    def test_listed_prefill(self):
        assert resolve_role(None, True, True) == "prefill"

    def test_others_decode_when_any_prefill_listed(self):
        assert resolve_role(None, False, True) == "decode"

    def test_aggregated_without_prefill_list(self):
        assert resolve_role(None, False, False) == "aggregated"


class TestBuildInstance:
    def test_spec_endpoints_override_engine(self):
        spec = WorkerSpec(A.url, kv_events="tcp://x:1", kv_replay="tcp://x:2")
        instance = build_instance(spec, info(kv_events_endpoint="tcp://*:5557"), False)
        assert (instance.kv_events_endpoint, instance.kv_replay_endpoint) == (
            "tcp://x:1",
            "tcp://x:2",
        )
        assert instance.instance_id == spec.instance_id and instance.url == spec.url

    def test_spec_model_overrides_the_served_name(self):
        assert build_instance(A, info(model="engine-name"), False).model == "engine-name"
        renamed = WorkerSpec(A.url, model="org/served")
        assert build_instance(renamed, info(model="engine-name"), False).model == "org/served"

    def test_engine_wildcard_endpoint_gets_engine_host(self):
        instance = build_instance(A, info(kv_events_endpoint="tcp://*:5557"), False)
        assert instance.kv_events_endpoint == "tcp://10.0.0.1:5557"

    def test_engine_advertised_replay_endpoint(self):
        engine = info(kv_events_endpoint="tcp://*:5557", kv_replay_endpoint="tcp://*:5558")
        instance = build_instance(A, engine, False)
        assert instance.kv_replay_endpoint == "tcp://10.0.0.1:5558"

    def test_embedding_model_is_marked(self):
        assert build_instance(A, info(), False).is_generation
        assert not build_instance(A, info(is_generation=False), False).is_generation

    def test_publisher_that_binds_is_connected_to(self):
        got = build_instance(A, info(kv_events_endpoint="tcp://*:5557"), False)
        assert (got.kv_events_endpoint, got.kv_events_bind) == ("tcp://10.0.0.1:5557", None)

    def test_publisher_that_connects_gets_a_router_endpoint(self):
        """Issue 32: an engine that reports a named host connects there (its own rule): the
        router binds that port for it, with the engine's topic, without extra flags."""
        reported = info(
            kv_events_endpoint="tcp://router:5557", kv_events_binds=False, kv_topic="engine-a"
        )
        got = build_instance(A, reported, False)
        assert got.kv_events_endpoint is None and got.kv_events_bind == "tcp://*:5557"
        assert got.kv_topic == "engine-a"

    def test_worker_options_override_the_report(self):
        spec = WorkerSpec("grpc://10.0.0.1:30000", kv_bind="tcp://*:6000", kv_topic="t")
        got = build_instance(spec, info(kv_events_endpoint="tcp://*:5557"), False)
        assert (got.kv_events_endpoint, got.kv_events_bind, got.kv_topic) == (
            None,
            "tcp://*:6000",
            "t",
        )

    def test_admission_stamped_once_per_admission(self):
        registry = Registry([A], readmit_after=1)
        registry.record(A.instance_id, registry.start_round(), info(), now=100.0)
        registry.record(A.instance_id, registry.start_round(), info(), now=110.0)
        assert registry.routable()[0].admitted_at == 100.0
        registry.mark_down(A.instance_id)
        assert registry.routable() == []
        registry.record(A.instance_id, registry.start_round(), info(), now=200.0)
        assert registry.routable()[0].admitted_at == 200.0

    def test_connectable_endpoint(self):
        assert connectable_endpoint("tcp://0.0.0.0:7", "grpc://h:1") == "tcp://h:7"
        assert connectable_endpoint("tcp://[::]:7", "grpc://[::1]:1") == "tcp://[::1]:7"
        assert connectable_endpoint("tcp://e:7", "grpc://h:1") == "tcp://e:7"
        assert connectable_endpoint("ipc:///tmp/x", "grpc://h:1") == "ipc:///tmp/x"
        assert connectable_endpoint(None, "grpc://h:1") is None


class TestRegistry:
    def probed(self, *specs, role=None) -> Registry:
        registry = Registry(specs)
        round_ = registry.start_round()
        for spec in specs:
            registry.record(spec.instance_id, round_, info(role))
        return registry

    def test_only_probed_workers_are_routable(self):
        registry = Registry([A, B])
        registry.record(A.instance_id, registry.start_round(), info())
        assert [i.url for i in registry.routable()] == [A.url]

    def test_failed_probe_removes_and_consecutive_successes_restore(self):
        registry = self.probed(A)
        registry.record(A.instance_id, registry.start_round(), None)
        assert registry.routable() == []
        assert registry.recovering()
        registry.record(A.instance_id, registry.start_round(), info())
        assert registry.routable() == []  # one good probe is not enough
        registry.record(A.instance_id, registry.start_round(), None)  # it flaps
        registry.record(A.instance_id, registry.start_round(), info())
        assert registry.routable() == []  # the streak started over
        registry.record(A.instance_id, registry.start_round(), info())
        assert [i.instance_id for i in registry.routable()] == [A.instance_id]
        assert not registry.recovering()

    def test_first_answer_admits_at_once(self):
        """An engine seen for the first time is not held back (startup stays fast)."""
        registry = Registry([A])
        registry.record(A.instance_id, registry.start_round(), None)
        registry.record(A.instance_id, registry.start_round(), info())
        assert [i.instance_id for i in registry.routable()] == [A.instance_id]

    def test_readmit_after_must_be_positive(self):
        with pytest.raises(ValueError):
            Registry([A], readmit_after=0)

    def test_roles_follow_the_prefill_list(self):
        registry = self.probed(A, P)
        assert {i.url: i.role for i in registry.routable()} == {A.url: "decode", P.url: "prefill"}
        registry.configure([A])
        assert {i.url: i.role for i in registry.routable()} == {A.url: "aggregated"}

    def test_engine_role_beats_prefill_list(self):
        registry = self.probed(A, P, role="decode")
        assert {i.role for i in registry.routable()} == {"decode"}

    def test_configure_reports_added_removed_and_forgets_removed(self):
        registry = self.probed(A)
        assert registry.configure([B]) == ([B], [A])
        assert registry.configure([A, B]) == ([A], [])
        assert registry.routable() == []  # A must be probed again

    def test_result_for_a_removed_worker_is_ignored(self):
        registry = Registry([A])
        round_ = registry.start_round()
        registry.configure([])
        registry.record(A.instance_id, round_, info())
        assert registry.routable() == []
        assert registry.specs == []

    def test_down_mark_cleared_only_by_a_later_round(self):
        registry = Registry([A])
        in_flight = registry.start_round()
        assert registry.mark_down(A.instance_id)
        registry.record(A.instance_id, in_flight, info())
        assert registry.routable() == []  # a probe started before the report cannot undo it
        registry.record(A.instance_id, registry.start_round(), info())
        registry.record(A.instance_id, registry.start_round(), info())
        assert [i.instance_id for i in registry.routable()] == [A.instance_id]
        assert not registry.is_down(A.instance_id)

    def test_down_mark_of_unknown_instance(self):
        assert not Registry([A]).mark_down(B.instance_id)

    def test_option_change_keeps_probe_result(self):
        registry = self.probed(A)
        changed = WorkerSpec(A.url, kv_events="tcp://e:1")
        assert registry.configure([changed]) == ([], [])
        assert registry.routable()[0].kv_events_endpoint == "tcp://e:1"


class TestStates:
    def test_states_for_metrics(self):
        registry = Registry([A, B, P])
        round_ = registry.start_round()
        registry.record(A.instance_id, round_, info())
        registry.record(P.instance_id, round_, info())
        registry.record(P.instance_id, registry.start_round(), None)  # P went down
        assert sorted(registry.states()) == sorted(
            [("decode", "routable"), ("unknown", "unprobed"), ("unknown", "down")]
        )
        registry.record(P.instance_id, registry.start_round(), info())
        assert ("unknown", "recovering") in registry.states()


class TestDownAfter:
    """A probe that timed out counts toward `down_after`; any other failed probe, and a down
    report, take a routable instance out at once."""

    def routable(self, registry: Registry) -> list[int]:
        return [i.instance_id for i in registry.routable()]

    def timeout(self, registry: Registry, spec: WorkerSpec = A) -> None:
        registry.record(spec.instance_id, registry.start_round(), None, timed_out=True)

    def probed(self, down_after: int = 3) -> Registry:
        registry = Registry([A, B], down_after=down_after)
        round_ = registry.start_round()
        registry.record(A.instance_id, round_, info())
        registry.record(B.instance_id, round_, info())
        return registry

    def test_routable_until_that_many_timeouts_in_a_row(self):
        registry = self.probed()
        self.timeout(registry)
        self.timeout(registry)
        assert registry.timeouts(A.instance_id) == 2
        assert self.routable(registry) == [A.instance_id, B.instance_id]
        assert registry.state(A.instance_id) == "ready"
        self.timeout(registry)
        assert self.routable(registry) == [B.instance_id]
        assert registry.state(A.instance_id) == "down"
        assert registry.timeouts(A.instance_id) == 0

    def test_an_answer_starts_the_count_over(self):
        registry = self.probed()
        self.timeout(registry)
        self.timeout(registry)
        registry.record(A.instance_id, registry.start_round(), info(model="new"))
        assert registry.timeouts(A.instance_id) == 0
        self.timeout(registry)
        self.timeout(registry)
        assert A.instance_id in self.routable(registry)
        assert registry.routable()[0].model == "new"  # the last answer's info

    def test_a_refused_probe_takes_it_out_at_once(self):
        registry = self.probed()
        self.timeout(registry)
        registry.record(A.instance_id, registry.start_round(), None)  # refused, reset, ...
        assert self.routable(registry) == [B.instance_id]
        assert registry.timeouts(A.instance_id) == 0

    def test_a_down_report_takes_it_out_at_once(self):
        registry = self.probed()
        self.timeout(registry)
        registry.mark_down(A.instance_id)
        assert self.routable(registry) == [B.instance_id]
        self.timeout(registry)  # while down, a timeout is a plain failure
        assert registry.info(A.instance_id) is None

    def test_readmitted_afresh(self):
        registry = self.probed()
        for _ in range(3):
            self.timeout(registry)
        for _ in range(registry.readmit_after):
            registry.record(A.instance_id, registry.start_round(), info())
        assert A.instance_id in self.routable(registry)
        self.timeout(registry)
        assert A.instance_id in self.routable(registry)  # a new count, not the old one

    def test_timeouts_of_an_engine_not_routable_count_at_once(self):
        """Unprobed or being re-admitted: nothing to keep routable, the streak starts over."""
        registry = Registry([A], down_after=3)
        self.timeout(registry)
        assert registry.state(A.instance_id) == "probing"
        registry.record(A.instance_id, registry.start_round(), info())
        registry.mark_down(A.instance_id)
        registry.record(A.instance_id, registry.start_round(), info())
        assert registry.state(A.instance_id) == "probing"  # recovering: 1 of 2
        self.timeout(registry)
        registry.record(A.instance_id, registry.start_round(), info())
        assert self.routable(registry) == []  # the streak started over
        registry.record(A.instance_id, registry.start_round(), info())
        assert self.routable(registry) == [A.instance_id]

    def test_a_drained_instance_keeps_its_count(self):
        registry = self.probed()
        registry.drain(A.instance_id)
        self.timeout(registry)
        registry.drain(A.instance_id, False)
        assert A.instance_id in self.routable(registry)
        assert registry.timeouts(A.instance_id) == 1

    def test_one_is_the_old_behaviour(self):
        registry = self.probed(down_after=1)
        self.timeout(registry)
        assert self.routable(registry) == [B.instance_id]

    def test_removed_worker_forgets_its_count(self):
        registry = self.probed()
        self.timeout(registry)
        registry.configure([B])
        registry.configure([A, B])
        assert registry.timeouts(A.instance_id) == 0

    def test_down_after_must_be_positive(self):
        with pytest.raises(ValueError):
            Registry([A], down_after=0)
