"""The `switchyard` command: `switchyard <service> [flags]` runs one service in this process;
`switchyard up` runs the whole local stack as child processes."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module with add_arguments(parser) and run(args) -> int
SUBCOMMANDS = {
    "fleet": ("switchyard.fleet.cli", "probe engine URLs and publish the instance set"),
    "router": ("switchyard.router.cli", "answer routing decisions over ZMQ"),
    "dispatcher": ("switchyard.dispatcher.cli", "hold the engine gRPC channels, run generations"),
    "preprocessor": ("switchyard.preprocessor.cli", "serve the OpenAI HTTP API"),
    "mock-engine": ("switchyard.mock_engine.cli", "a CPU engine speaking SGLang or vLLM gRPC"),
    "kv-proxy": ("switchyard.router.kv.proxy", "fan engines' KV events out to router replicas"),
    "up": ("switchyard.stack", "start the whole local stack (optionally with mock engines)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="switchyard", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).add_arguments(sub)
        sub.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return importlib.import_module(args._module).run(args)


if __name__ == "__main__":
    sys.exit(main())
