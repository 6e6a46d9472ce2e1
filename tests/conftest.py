import sys
from pathlib import Path

# The e2e helpers live beside the tests (tests/stack.py).
sys.path.insert(0, str(Path(__file__).parent))

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
