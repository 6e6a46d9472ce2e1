import argparse

import pytest

from switchyard.router import cli


def parse(*argv):
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(argv)


class TestFlags:
    def test_defaults_are_the_kv_preset(self):
        routing = cli.routing_from_args(parse())
        assert routing.mode == "kv"
        assert [s.name for s in routing.decode.scorers] == ["predicted_ttft", "session_affinity"]
        assert cli.listener_from_args(parse()) is None

    def test_time_model_and_bookings(self):
        routing = cli.routing_from_args(
            parse("--prefill-ms-per-1k-tokens", "400", "--booking-ttl", "0",
                  "--no-learn-prefill-speed")
        )  # fmt: skip
        assert routing.time.prefill_ms_per_1k_tokens == 400 and not routing.time.learn
        assert routing.booking_ttl_s == 0

    def test_listener_modes(self):
        bound = cli.listener_from_args(parse("--kv-events-bind", "tcp://*:5557"))
        assert (bound.mode, bound.endpoint) == ("bind", "tcp://*:5557")
        proxied = cli.listener_from_args(
            parse("--kv-events-proxy", "tcp://p:5567", "--kv-topic-pattern", "kv@{url}")
        )
        assert (proxied.mode, proxied.topic_pattern) == ("connect", "kv@{url}")
        with pytest.raises(ValueError, match="not both"):
            cli.listener_from_args(
                parse("--kv-events-bind", "tcp://*:1", "--kv-events-proxy", "tcp://p:2")
            )

    def test_bad_values_stop_the_router(self):
        args = parse("--work-weight", "-1")
        assert cli.run(args) == 2
