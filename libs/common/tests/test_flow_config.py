"""The --flow-config file: defaults, every refusal names what is wrong, bounded labels."""

from __future__ import annotations

import hashlib

import pytest

from switchyard.common.flow.config import DEFAULT_FLOW, OTHER, FlowSpec, from_mapping, load

KEY_DIGEST = hashlib.sha256(b"sk-acme").hexdigest()


class TestDefaults:
    def test_only_max_running_is_needed(self):
        c = from_mapping({"max_running": 10})
        assert (c.max_running, c.burst, c.max_queued) == (10, 5, 80)
        assert c.queue_timeout_s == 30.0 and c.tenant_header is None
        assert c.spec("anyone") == FlowSpec()

    def test_max_running_is_required(self):
        with pytest.raises(ValueError, match="max_running is required"):
            from_mapping({})


class TestFile:
    def test_full_example(self, tmp_path):
        path = tmp_path / "flow.yaml"
        path.write_text(
            f"""
max_running: 16
burst: 4
tenant_header: X-Tenant-Id
default_priority: standard
classes: {{interactive: -10, standard: 0, batch: 10}}
flows:
  default: {{weight: 1, max_requests: 8}}
  acme: {{weight: 2, priority: interactive, min_priority: interactive,
          ttft_objective_ms: 800}}
keys:
  {KEY_DIGEST.upper()}: acme
"""
        )
        c = load(path)
        assert c.tenant_header == b"x-tenant-id"
        assert c.keys == {KEY_DIGEST: "acme"}
        acme = c.spec("acme")
        assert (acme.weight, acme.priority, acme.min_priority) == (2.0, -10, -10)
        assert acme.ttft_objective_ms == 800.0
        assert c.spec("tenant-x").max_requests == 8  # the default entry
        assert c.priority_value("batch", "x-priority") == 10
        assert c.priority_value("-3", "x-priority") == -3
        assert len(c.digest) == 12

    @pytest.mark.parametrize(
        ("raw", "message"),
        [
            ({"max_running": 0}, "max_running must be at least 1"),
            ({"max_running": 1.5}, "max_running must be a whole number"),
            ({"max_running": 2, "queue_timeout_s": 0}, "queue_timeout_s must be > 0"),
            ({"max_running": 2, "surge": 1}, "unknown key surge"),
            ({"max_running": 2, "flows": {"a": {"wieght": 2}}}, "flows.a: unknown key wieght"),
            ({"max_running": 2, "flows": {"a": {"weight": 0}}}, "flows.a.weight must be > 0"),
            ({"max_running": 2, "flows": {"a": {"priority": "vip"}}}, "unknown class 'vip'"),
            ({"max_running": 2, "flows": {"other": {}}}, "is not a flow name"),
            ({"max_running": 2, "flows": {"key:x": {}}}, "is reserved"),
            ({"max_running": 2, "keys": {"sk-secret": "a"}}, "never the key"),
            ({"max_running": 2, "keys": {KEY_DIGEST: "nobody"}}, "not a flow of `flows`"),
            ({"max_running": 2, "classes": {"default": 1}}, "reserved"),
            ({"max_running": 2, "tenant_header": "x tenant"}, "not an HTTP header name"),
            (
                {"max_running": 2, "flows": {"a": {"priority": -5, "min_priority": 0}}},
                "more urgent than its min_priority",
            ),
        ],
    )
    def test_refusals_name_the_key(self, raw, message):
        with pytest.raises(ValueError, match=message):
            from_mapping(raw)

    def test_the_key_itself_is_never_echoed(self):
        with pytest.raises(ValueError) as err:
            from_mapping({"max_running": 2, "keys": {"sk-very-secret-key-value": "a"}})
        assert "sk-very-secret-key-value" not in str(err.value)

    def test_unreadable_and_bad_yaml(self, tmp_path):
        with pytest.raises(ValueError, match="flow config"):
            load(tmp_path / "missing.yaml")
        bad = tmp_path / "bad.yaml"
        bad.write_text("max_running: [1,\n")
        with pytest.raises(ValueError, match="not valid YAML"):
            load(bad)
        listed = tmp_path / "list.yaml"
        listed.write_text("- 1\n")
        with pytest.raises(ValueError, match="expected a mapping"):
            load(listed)


class TestLabels:
    def test_bounded(self):
        c = from_mapping({"max_running": 2, "classes": {"batch": 10}, "flows": {"acme": {}}})
        assert c.flow_label("acme") == "acme"
        assert c.flow_label(DEFAULT_FLOW) == DEFAULT_FLOW
        assert c.flow_label("tenant-from-a-header") == OTHER
        assert c.flow_label("key:0123456789ab") == OTHER
        assert c.priority_label(10) == "batch"
        assert c.priority_label(0) == DEFAULT_FLOW
        assert c.priority_label(7) == OTHER
        assert c.labels() == (["acme", "default", "other"], ["batch", "default", "other"])
