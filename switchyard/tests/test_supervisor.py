import sys
import time

from switchyard.supervisor import ChildSpec, Supervisor

CRASH = ChildSpec("crash", [sys.executable, "-c", "import sys; sys.exit(3)"])
SLEEP = ChildSpec("sleep", [sys.executable, "-c", "import time; time.sleep(60)"])


def poll_until(sup: Supervisor, predicate, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        failed = sup.poll()
        if failed:
            return failed
        time.sleep(0.02)
    return None


class TestSupervisor:
    def test_crashed_child_is_restarted(self):
        sup = Supervisor(backoff=0.01, max_restarts=10)
        try:
            sup.start(CRASH)
            poll_until(sup, lambda: sup.restarts >= 2)
        finally:
            sup.stop_all()

    def test_gives_up_on_a_child_that_keeps_crashing(self):
        sup = Supervisor(backoff=0.01, max_restarts=2, window=60)
        try:
            sup.start(CRASH)
            deadline = time.monotonic() + 20
            failed = None
            while failed is None and time.monotonic() < deadline:
                failed = sup.poll()
                time.sleep(0.02)
            assert failed == "crash"
            assert sup.restarts == 2
        finally:
            sup.stop_all()

    def test_without_restarts_an_exit_is_reported(self):
        sup = Supervisor(restart=False)
        try:
            sup.start(CRASH)
            sup.start(SLEEP)
            deadline = time.monotonic() + 20
            failed = None
            while failed is None and time.monotonic() < deadline:
                failed = sup.poll()
                time.sleep(0.02)
            assert failed == "crash"
        finally:
            sup.stop_all()
        assert sup.children["sleep"].proc.poll() is not None  # stopped too

    def test_stop_all_stops_everything(self):
        sup = Supervisor()
        procs = [sup.start(ChildSpec(f"s{i}", SLEEP.argv)) for i in range(3)]
        sup.stop_all()
        assert all(p.poll() is not None for p in procs)


class TestRespec:
    def test_a_restart_runs_the_new_command_line(self, tmp_path):
        """`up` re-specs each child with the ports it bound, so a restart binds them again."""
        marker = tmp_path / "restarted"
        sup = Supervisor(backoff=0.01, max_restarts=10)
        try:
            sup.start(CRASH)
            sup.respec("crash", [sys.executable, "-c", f"open({str(marker)!r}, 'w')"])
            poll_until(sup, marker.exists)
        finally:
            sup.stop_all()
