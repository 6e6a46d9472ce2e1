import logging

import pytest

from switchyard.common.workers import WorkerSpec
from switchyard.fleet.source import WorkerSource


class TestWorkerSource:
    def test_flags_only(self):
        source = WorkerSource([WorkerSpec("grpc://b:1"), WorkerSpec("grpc://a:1")], None, ["a:1"])
        assert source.load() == [WorkerSpec("grpc://a:1", prefill=True), WorkerSpec("grpc://b:1")]
        assert source.poll() is None

    def test_file_changes(self, tmp_path):
        path = tmp_path / "w.yaml"
        path.write_text("- grpc://a:1\n")
        source = WorkerSource([WorkerSpec("grpc://z:1")], path)
        assert source.load() == [WorkerSpec("grpc://a:1"), WorkerSpec("grpc://z:1")]
        assert source.poll() is None  # unchanged
        path.write_text("- grpc://b:1\n")
        assert source.poll() == [WorkerSpec("grpc://b:1"), WorkerSpec("grpc://z:1")]

    def test_bad_file_keeps_last_good_and_logs_once(self, tmp_path, caplog):
        path = tmp_path / "w.json"
        path.write_text('["grpc://a:1"]')
        source = WorkerSource([], path)
        source.load()
        path.write_text('["grpc://a:1", {"url": 5}]')
        with caplog.at_level(logging.ERROR):
            assert source.poll() is None
            assert source.poll() is None
        assert len([r for r in caplog.records if "entry 2" in r.getMessage()]) == 1
        path.write_text('["grpc://c:1"]')
        assert source.poll() == [WorkerSpec("grpc://c:1")]

    def test_missing_file(self, tmp_path, caplog):
        path = tmp_path / "w.yaml"
        with pytest.raises(OSError):
            WorkerSource([], path).load()
        path.write_text("[]")
        source = WorkerSource([], path)
        assert source.load() == []
        path.unlink()
        with caplog.at_level(logging.ERROR):
            assert source.poll() is None
        assert "cannot read workers file" in caplog.text

    def test_bad_file_at_startup_fails_loudly(self, tmp_path):
        path = tmp_path / "w.yaml"
        path.write_text("- ftp://a:1\n")
        with pytest.raises(ValueError, match="entry 1"):
            WorkerSource([], path).load()
