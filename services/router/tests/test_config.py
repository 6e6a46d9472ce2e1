import json

import pytest

from switchyard.router import config
from switchyard.router.core import RouterCore


class TestPresets:
    @pytest.mark.parametrize("mode", config.MODES)
    def test_every_preset_builds(self, mode):
        core = RouterCore(config.preset(mode))
        assert core.decode.name == "decode" and core.prefill.name == "prefill"

    def test_unknown_mode(self):
        with pytest.raises(ValueError, match="unknown router mode"):
            config.preset("fastest")


class TestFile:
    def test_yaml_overrides_parts_of_the_preset(self, tmp_path):
        path = tmp_path / "routing.yaml"
        path.write_text(
            "decode:\n"
            "  scorers:\n"
            "    - {name: kv_overlap, weight: 3, offload_weight: 0.5}\n"
            "    - inflight_load\n"
            "  picker: {name: weighted_random, temperature: 0.05}\n"
            "time: {prefill_ms_per_1k_tokens: 80, learn: false}\n"
            "bookings: {ttl_s: 0}\n"
        )
        loaded = config.load(path)
        assert [(s.name, s.weight) for s in loaded.decode.scorers] == [
            ("kv_overlap", 3.0),
            ("inflight_load", 1.0),
        ]
        assert loaded.decode.filters == config.preset("kv").decode.filters
        assert loaded.time.prefill_ms_per_1k_tokens == 80 and not loaded.time.learn
        assert loaded.booking_ttl_s == 0
        core = RouterCore(loaded)
        assert core.decode.picker.params.temperature == 0.05

    def test_json(self, tmp_path):
        path = tmp_path / "routing.json"
        path.write_text(json.dumps({"decode": {"scorers": ["engine_load"]}}))
        assert [s.name for s in config.load(path).decode.scorers] == ["engine_load"]

    @pytest.mark.parametrize(
        ("raw", "message"),
        [
            ({"decoder": {}}, "unknown key decoder"),
            ({"decode": {"scorers": [{"name": "kv_overlap", "weight": -1}]}}, "weight"),
            ({"decode": {"scorers": [{"name": "kv_overlap", "weight": "big"}]}}, "weight"),
            ({"decode": {"scorers": "kv_overlap"}}, "expected a list"),
            ({"decode": {"filters": ["not_busy"]}}, "must keep the filters"),
            ({"time": {"work_weight": -2}}, "work_weight"),
            ({"time": {"speed": 1}}, "unknown parameter speed"),
            ({"time": {"learn": "yes"}}, "true or false"),
            ({"bookings": {"ttl_s": -1}}, "ttl_s"),
        ],
    )
    def test_bad_config_fails_loudly(self, raw, message):
        with pytest.raises(ValueError, match=message):
            config.from_mapping(raw)

    @pytest.mark.parametrize(
        ("scorer", "message"),
        [
            ({"name": "nope"}, "unknown scorer 'nope'"),
            ({"name": "kv_overlap", "offload_weight": 3}, "offload_weight"),
            ({"name": "kv_overlap", "colour": "red"}, "unknown parameter colour"),
            ({"name": "inflight_load", "x": 1}, "takes no parameters"),
            ({"name": "session_affinity", "ttl_s": 0}, "ttl_s"),
            ({"name": "session_affinity", "min_in_flight": 1.5}, "integer"),
        ],
    )
    def test_bad_plugin_parameters_fail_when_built(self, scorer, message):
        loaded = config.from_mapping({"decode": {"scorers": [scorer]}})
        with pytest.raises(ValueError, match=message):
            RouterCore(loaded)
