"""Prefill/decode orchestration as plugins (disagg.py): the decode_then_prefill profile
handler, its deciders, and their configuration."""

import random

import msgspec
import pytest

from switchyard.protos.messages import ROLE_DECODE, ROLE_PREFILL
from switchyard.router.config import DisaggConfig, PluginConfig, from_mapping, preset
from switchyard.router.core import RouterCore
from switchyard.router.disagg import Always, DecodeThenPrefill, UncachedTokens, build_handler
from switchyard.router.tests.test_disagg_routing import inst, req
from switchyard.router.timing import TimeModel
from switchyard.router.types import PluginDeps


def deps() -> PluginDeps:
    return PluginDeps(random.Random(0), TimeModel())


def core_with(disaggregation: dict, *instances, threshold: int = 256) -> RouterCore:
    config = from_mapping({"disaggregation": disaggregation})
    c = RouterCore(config, rng=random.Random(0), disagg_min_uncached_tokens=threshold)
    c.set_instances({i.instance_id: i for i in instances})
    return c


class TestDeciders:
    def test_always_hops_even_a_short_prompt(self):
        c = core_with({"decider": "always"}, inst(1, ROLE_PREFILL), inst(2, ROLE_DECODE))
        reply = c.route(req("short", tokens=20), now=0).response
        assert (reply.instance_id, reply.prefill_instance_id) == (2, 1)

    def test_the_default_decider_keeps_a_short_prompt_in_place(self):
        c = core_with({}, inst(1, ROLE_PREFILL), inst(2, ROLE_DECODE))
        assert c.route(req("short", tokens=20), now=0).response.prefill_instance_id is None

    def test_the_configured_threshold_wins_over_the_flag(self):
        decider = {"name": "uncached_tokens", "min_uncached_tokens": 10}
        c = core_with({"decider": decider}, inst(1, ROLE_PREFILL), inst(2, ROLE_DECODE))
        assert c.route(req("r", tokens=20), now=0).response.prefill_instance_id == 1

    def test_no_prefill_worker_of_the_protocol_no_hop(self):
        vllm_prefill = msgspec.structs.replace(inst(1, ROLE_PREFILL), protocol="vllm")
        c = core_with({"decider": "always"}, vllm_prefill, inst(2, ROLE_DECODE))
        assert c.route(req("r"), now=0).response.prefill_instance_id is None

    def test_a_dry_run_shows_the_prefill_profile_without_the_hop(self):
        c = core_with({}, inst(1, ROLE_PREFILL), inst(2, ROLE_DECODE))
        reply = c.route(req("r", tokens=20, dry_run=True), now=0).response
        assert reply.prefill_instance_id is None
        assert {w.profile for w in reply.workers} == {"decode", "prefill"}


class TestBuild:
    def test_the_flag_sets_the_default_deciders_threshold(self):
        handler = build_handler(DisaggConfig(), deps(), 77)
        assert isinstance(handler, DecodeThenPrefill)
        assert isinstance(handler.decider, UncachedTokens)
        assert handler.decider.min_uncached_tokens == 77

    def test_always_takes_no_parameters(self):
        assert isinstance(
            build_handler(DisaggConfig(decider=PluginConfig("always")), deps()).decider, Always
        )
        bad = DisaggConfig(decider=PluginConfig("always", params={"x": 1}))
        with pytest.raises(ValueError, match="takes no parameters"):
            build_handler(bad, deps())

    @pytest.mark.parametrize(
        ("raw", "message"),
        [
            ({"handler": "prefill_first"}, "unknown profile handler 'prefill_first'"),
            ({"decider": "coin_flip"}, "unknown decider 'coin_flip'"),
            ({"decider": {"name": "uncached_tokens", "min_uncached_tokens": -1}}, ">= 0"),
            ({"decider": {"name": "uncached_tokens", "threshold": 5}}, "unknown parameter"),
        ],
    )
    def test_bad_config_fails_loudly(self, raw, message):
        with pytest.raises(ValueError, match=message):
            RouterCore(from_mapping({"disaggregation": raw}))

    @pytest.mark.parametrize(
        ("raw", "message"),
        [
            ({"decider": {"name": "always", "weight": 2}}, "takes no weight"),
            ({"deciders": "always"}, "unknown key deciders"),
            ([], "expected a mapping"),
        ],
    )
    def test_bad_config_file_keys(self, raw, message):
        with pytest.raises(ValueError, match=message):
            from_mapping({"disaggregation": raw})

    def test_the_presets_use_the_default(self):
        assert preset("kv").disagg == DisaggConfig()
