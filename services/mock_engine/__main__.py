"""`python -m switchyard.mock_engine --protocol sglang --port N`: `switchyard mock-engine`."""

from __future__ import annotations

import sys

from switchyard.cli import main

if __name__ == "__main__":
    sys.exit(main(["mock-engine", *sys.argv[1:]]))
