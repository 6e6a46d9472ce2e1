import json

import pytest

from switchyard.common.instance_id import instance_id
from switchyard.common.workers import (
    WorkerSpec,
    combine_workers,
    parse_worker,
    parse_worker_entry,
    parse_workers_text,
    worker_flag,
)


class TestWorkerSpec:
    def test_normalizes_and_derives_id(self):
        spec = WorkerSpec("grpc://Host:30000/")
        assert spec.url == "grpc://host:30000"
        assert spec.instance_id == instance_id("grpc://host:30000")
        assert spec == WorkerSpec("host:30000")

    def test_bad_url(self):
        with pytest.raises(ValueError, match="missing port"):
            WorkerSpec("grpc://host")


class TestParseWorker:
    def test_plain(self):
        assert parse_worker("grpc://h:1") == WorkerSpec("grpc://h:1")

    def test_options(self):
        spec = parse_worker("grpc://h:1?kv_events=tcp://h:5557&kv_replay=tcp://h:5558&role=prefill")
        assert spec == WorkerSpec("grpc://h:1", "tcp://h:5557", "tcp://h:5558", prefill=True)

    def test_worker_flag_is_what_it_reads(self):
        flag = worker_flag("grpc://h:1", kv_events="tcp://h:5557", kv_replay=None, role="prefill")
        assert flag == "grpc://h:1?kv_events=tcp://h:5557&role=prefill"
        assert parse_worker(flag) == WorkerSpec("grpc://h:1", "tcp://h:5557", prefill=True)
        assert worker_flag("grpc://h:1") == "grpc://h:1"
        with pytest.raises(ValueError, match="colour"):
            worker_flag("grpc://h:1", colour="red")

    def test_decode_role_is_not_prefill(self):
        assert not parse_worker("grpc://h:1?role=decode").prefill

    def test_model_option(self):
        assert parse_worker("grpc://h:1?model=org/llama-3").model == "org/llama-3"
        assert parse_worker_entry({"url": "grpc://h:1", "model": "m"}).model == "m"

    @pytest.mark.parametrize(
        ("text", "match"),
        [
            ("http://h:1", "scheme"),
            ("grpc://h:1?color=red", "unknown option color"),
            ("grpc://h:1?role=leader", "role must be"),
            ("grpc://h:1?kv_events=h:5557", "kv_events must be a ZMQ endpoint"),
            ("grpc://h:1?kv_events=udp://h:5557", "scheme must be one of"),
            ("grpc://h:1?role=prefill&role=decode", "given twice"),
            ("grpc://h:1?kv_events=", "kv_events"),
            ("grpc://h:1?model=", "model must be a non-empty string"),
        ],
    )
    def test_bad(self, text, match):
        with pytest.raises(ValueError, match=match) as info:
            parse_worker(text)
        assert text in str(info.value)  # the error names the entry


class TestWorkersFile:
    YAML = """
- grpc://a:1
- grpc://b:2?role=prefill
- url: grpc://c:3
  kv_events: tcp://c:5557
  kv_replay: tcp://c:5558
  role: decode
"""

    def test_yaml(self, tmp_path):
        path = tmp_path / "workers.yaml"
        path.write_text(self.YAML)
        assert parse_workers_text(path.read_text(), path) == [
            WorkerSpec("grpc://a:1"),
            WorkerSpec("grpc://b:2", prefill=True),
            WorkerSpec("grpc://c:3", "tcp://c:5557", "tcp://c:5558"),
        ]

    def test_json(self, tmp_path):
        path = tmp_path / "workers.json"
        path.write_text(json.dumps(["grpc://a:1", {"url": "grpc://b:2", "role": "prefill"}]))
        assert parse_workers_text(path.read_text(), path) == [
            WorkerSpec("grpc://a:1"),
            WorkerSpec("grpc://b:2", prefill=True),
        ]

    def test_empty_list_is_no_workers(self):
        assert parse_workers_text("[]", "w.yml") == []

    @pytest.mark.parametrize(
        ("text", "name", "match"),
        [
            ("", "w.yaml", "empty file is rejected"),
            ("", "w.json", "empty file is rejected"),
            ("url: grpc://a:1", "w.yaml", "expected a list"),
            ("[grpc://a:1", "w.yaml", "not valid YAML"),
            ("[1,", "w.json", "not valid JSON"),
            ("- grpc://a:1", "w.txt", "must end in"),
            ("- 42", "w.yaml", "entry 1 42"),
            ("- grpc://a:1\n- {kv_events: tcp://a:5}", "w.yaml", "entry 2 .*missing url"),
            ("- {url: grpc://a:1, colour: red}", "w.yaml", "entry 1 .*unknown option colour"),
            ("- {url: 'grpc://a:1?role=prefill', role: decode}", "w.yaml", "both as a key"),
        ],
    )
    def test_bad(self, text, name, match):
        with pytest.raises(ValueError, match=match):
            parse_workers_text(text, name)


class TestCombine:
    def test_prefill_flag_and_dedupe(self):
        flags = [WorkerSpec("grpc://b:2"), WorkerSpec("grpc://a:1")]
        file = [WorkerSpec("grpc://a:1"), WorkerSpec("grpc://c:3")]
        combined = combine_workers([flags, file], prefill=["grpc://B:2", "grpc://z:9"])
        assert combined == [
            WorkerSpec("grpc://a:1"),
            WorkerSpec("grpc://b:2", prefill=True),
            WorkerSpec("grpc://c:3"),
        ]

    def test_prefill_flag_keeps_the_other_options(self):
        spec = WorkerSpec("grpc://a:1", "tcp://a:5", model="m")
        (combined,) = combine_workers([[spec]], prefill=["grpc://a:1"])
        assert combined == WorkerSpec("grpc://a:1", "tcp://a:5", prefill=True, model="m")

    def test_conflicting_duplicate_fails(self):
        with pytest.raises(ValueError, match="grpc://a:1 listed twice"):
            combine_workers([[WorkerSpec("grpc://a:1")], [WorkerSpec("a:1", "tcp://a:5")]])

    def test_bad_prefill_url(self):
        with pytest.raises(ValueError, match="prefill 'http://x:1'"):
            combine_workers([], prefill=["http://x:1"])


class TestKvBindOptions:
    def test_kv_bind_and_topic(self):
        spec = parse_worker("grpc://h:1?kv_bind=tcp://*:5557&kv_topic=engine-a")
        assert (spec.kv_bind, spec.kv_topic, spec.kv_events) == ("tcp://*:5557", "engine-a", None)

    def test_kv_bind_with_kv_events_refused(self):
        with pytest.raises(ValueError, match="not both"):
            parse_worker("grpc://h:1?kv_bind=tcp://*:5557&kv_events=tcp://h:5557")

    def test_kv_bind_must_be_an_endpoint(self):
        with pytest.raises(ValueError, match="kv_bind"):
            parse_worker("grpc://h:1?kv_bind=5557")
