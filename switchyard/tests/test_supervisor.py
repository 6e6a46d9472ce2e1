import os
import signal
import sys
import time

from switchyard.supervisor import ChildSpec, Supervisor, signal_wait

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


class TestSignalWait:
    def test_a_child_exit_wakes_it(self):
        sup = Supervisor(restart=False)
        with signal_wait() as wake:
            try:
                proc = sup.start(ChildSpec("brief", [sys.executable, "-c", "pass"]))
                assert wake.wait(60) is True  # SIGCHLD, long before the timeout
                assert proc.wait(timeout=10) == 0
            finally:
                sup.stop_all()

    def test_a_stop_signal_wakes_it_and_its_handler_still_runs(self):
        got = []
        previous = signal.signal(signal.SIGUSR1, lambda signum, _frame: got.append(signum))
        try:
            with signal_wait() as wake:
                os.kill(os.getpid(), signal.SIGUSR1)
                assert wake.wait(60) is True
            assert got == [signal.SIGUSR1]
        finally:
            signal.signal(signal.SIGUSR1, previous)

    def test_nothing_happening_is_a_timeout(self):
        with signal_wait() as wake:
            assert wake.wait(0.05) is False

    def test_the_next_restart_is_due_after_the_backoff(self):
        sup = Supervisor(backoff=30, max_backoff=30)
        try:
            assert sup.next_restart_at() is None
            sup.start(CRASH)
            poll_until(sup, lambda: sup.next_restart_at() is not None)
            assert sup.next_restart_at() > time.monotonic() + 20  # ~30 s away, not polled for
        finally:
            sup.stop_all()
