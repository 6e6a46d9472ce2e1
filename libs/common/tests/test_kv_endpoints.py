"""The engines' own bind-or-connect rule for their KV-event publisher (issue 32)."""

import pytest

from switchyard.common.engines.sglang import _kv_events_facts
from switchyard.common.kv_endpoints import listen_endpoint, publisher_binds


class TestPublisherBinds:
    @pytest.mark.parametrize(
        ("endpoint", "sglang", "vllm"),
        [
            ("tcp://*:5557", True, True),
            ("tcp://[::]:5557", True, True),
            ("tcp://0.0.0.0:5557", True, False),  # vLLM 0.33 connects for 0.0.0.0
            ("tcp://router:5557", False, False),
            ("tcp://10.0.0.9:5557", False, False),
            ("ipc:///tmp/kv", True, True),
            ("inproc://kv", True, True),
        ],
    )
    def test_by_endpoint(self, endpoint, sglang, vllm):
        assert publisher_binds(endpoint, "sglang") is sglang
        assert publisher_binds(endpoint, "vllm") is vllm

    def test_sglang_bind_flag_wins(self):
        assert publisher_binds("tcp://127.0.0.1:5557", "sglang", True)
        assert not publisher_binds("tcp://*:5557", "sglang", False)


class TestListenEndpoint:
    def test_named_host_binds_every_interface(self):
        assert listen_endpoint("tcp://router.ns.svc:5557") == "tcp://*:5557"
        assert listen_endpoint("tcp://10.0.0.5:5557") == "tcp://*:5557"

    def test_loopback_kept(self):
        assert listen_endpoint("tcp://127.0.0.1:5557") == "tcp://127.0.0.1:5557"
        assert listen_endpoint("tcp://[::1]:5557") == "tcp://[::1]:5557"


class TestSglangReport:
    def test_binding_publisher(self):
        facts = _kv_events_facts('{"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}')
        assert facts["kv_events_endpoint"] == "tcp://*:5557" and facts["kv_events_binds"]
        assert facts["kv_replay_endpoint"] == "tcp://*:5558" and facts["kv_topic"] is None

    def test_connecting_publisher_with_topic(self):
        facts = _kv_events_facts({"endpoint": "tcp://router:5557", "topic": "engine-a"})
        assert not facts["kv_events_binds"] and facts["kv_topic"] == "engine-a"

    def test_bind_true_on_a_named_host(self):
        facts = _kv_events_facts('{"endpoint": "tcp://127.0.0.1:5557", "bind": true}')
        assert facts["kv_events_binds"]

    def test_absent_or_garbage(self):
        for config in (None, "", "{not json", 7):
            facts = _kv_events_facts(config)
            assert facts["kv_events_endpoint"] is None and facts["kv_events_binds"]
