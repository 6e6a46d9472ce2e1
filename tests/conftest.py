import sys
from pathlib import Path

import pytest

# The e2e helpers live beside the tests (tests/stack.py).
sys.path.insert(0, str(Path(__file__).parent))

import e2e_stack  # noqa: E402

REAL_ENGINES = Path(__file__).parent / "real_engines"


def pytest_addoption(parser):
    parser.addoption(
        "--real-engines",
        action="store_true",
        help="run tests/real_engines: real vLLM engines (`make test-engines` installs them)",
    )


def pytest_ignore_collect(collection_path, config):
    # The real-engine suite needs the 3.5 GB vLLM venv: only `make test-engines` runs it.
    if not config.getoption("--real-engines") and collection_path.is_relative_to(REAL_ENGINES):
        return True
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """The e2e stacks' logs: a failed test's report lists those it saw (they stay); the
    logs of stacks stopped during a test that passed are removed when it ends."""
    report = yield
    if report.failed:
        seen = e2e_stack.LOGS.failed()
        if seen:
            report.sections.append(("switchyard logs (kept)", "\n".join(map(str, seen))))
    if report.when == "teardown":
        e2e_stack.LOGS.test_ended()
    return report
