"""scratch: per-process temporary folders, removed at exit and swept after a crash."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from switchyard.common import scratch

CHILD = """
import os, signal, sys
from switchyard.common import scratch
print(scratch.mkdtemp("switchyard-tokenizer-"), flush=True)
if sys.argv[1] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
"""


def _child(root: Path, how: str) -> Path:
    env = {**os.environ, "TMPDIR": str(root)}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, how], env=env, capture_output=True, text=True
    ).stdout
    return Path(out.strip())


class TestProcessDir:
    def test_a_normal_exit_removes_the_folder(self, tmp_path):
        made = _child(tmp_path, "exit")
        assert made.parent.name.startswith(scratch.PREFIX)
        assert not made.parent.exists()

    def test_a_killed_process_leaves_it_and_the_next_one_sweeps_it(self, tmp_path):
        """Regression: the tokenizer folder fetched over GetTokenizer was never removed
        (6.4 MB per preprocessor start); a killed process cannot remove its own."""
        made = _child(tmp_path, "kill")
        assert made.is_dir()
        _child(tmp_path, "exit")
        assert list(tmp_path.iterdir()) == []

    def test_a_live_process_folder_is_kept(self, tmp_path):
        mine = scratch.process_dir(tmp_path)
        try:
            assert scratch.sweep(tmp_path) == []
            assert mine.is_dir()
        finally:
            scratch._remove()
            scratch._mine = None

    def test_a_reused_pid_does_not_keep_a_dead_process_folder(self, tmp_path):
        stale = tmp_path / f"{scratch.PREFIX}{os.getpid()}-1"  # our pid, another start time
        stale.mkdir()
        other = tmp_path / "someone-elses"
        other.mkdir()
        assert scratch.sweep(tmp_path) == [stale]
        assert other.is_dir()


class TestFolder:
    def test_removed_with_the_process_folder_when_the_block_ends(self, tmp_path):
        """Regression: uvicorn re-raises SIGTERM after its shutdown, so a preprocessor never
        ran its exit handlers and its tokenizer folder stayed."""
        scratch.process_dir(tmp_path)
        try:
            with scratch.folder("switchyard-tokenizer-") as made:
                (made / "tokenizer.json").write_text("{}")
                assert made.parent.parent == tmp_path
            assert list(tmp_path.iterdir()) == []
        finally:
            scratch._remove()
            scratch._mine = None

    def test_the_process_folder_stays_while_another_folder_is_in_it(self, tmp_path):
        scratch.process_dir(tmp_path)
        try:
            other = Path(scratch.mkdtemp("other-"))
            with scratch.folder("switchyard-tokenizer-"):
                pass
            assert other.is_dir()
        finally:
            scratch._remove()
            scratch._mine = None
