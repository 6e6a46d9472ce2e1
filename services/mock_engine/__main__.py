"""`python -m switchyard.mock_engine --protocol sglang --port N`."""

from __future__ import annotations

import argparse
import sys

from switchyard.mock_engine.cli import add_arguments, run


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m switchyard.mock_engine",
        description="CPU stand-in for an SGLang or vLLM engine, serving their real gRPC APIs.",
    )
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
