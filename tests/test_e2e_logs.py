"""The e2e stacks' log files (e2e_stack.LogFiles): removed once the tests that saw them
passed, kept (and named) when one failed. Files only: no stack is started."""

from pathlib import Path

from e2e_stack import LogFiles


def logs_in(folder: Path, *names: str) -> tuple[LogFiles, list[Path]]:
    files = LogFiles()
    paths = []
    for name in names:
        path = folder / f"switchyard-{name}.log"
        path.write_text("a line\n")
        files.started(path)
        paths.append(path)
    return files, paths


def test_removed_when_the_test_that_stopped_them_passed(tmp_path):
    files, (a, b) = logs_in(tmp_path, "a", "b")
    files.stop([a])
    files.test_ended()
    assert not a.exists() and b.exists()  # b's stack still runs (a module's fixture)
    files.test_ended()
    assert b.exists()
    files.stop([b])
    files.test_ended()
    assert not b.exists()


def test_a_failed_test_keeps_what_it_saw(tmp_path):
    files, (a, b, c) = logs_in(tmp_path, "a", "b", "c")
    files.stop([a])
    files.test_ended()
    assert files.failed() == [b, c]  # a was settled before the failing test
    files.stop([b])
    files.test_ended()
    assert b.exists()
    # c, still running when a test failed, stays when its stack stops after later tests.
    files.test_ended()
    files.stop([c])
    files.test_ended()
    assert c.exists() and not a.exists()


def test_stopping_twice_or_an_unknown_path_is_harmless(tmp_path):
    files, (a,) = logs_in(tmp_path, "a")
    files.stop([a, tmp_path / "never-started.log"])
    files.stop([a])
    files.test_ended()
    assert not a.exists()
