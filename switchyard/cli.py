"""The `switchyard` command: `switchyard <service> [flags]` runs one service in this process;
`switchyard up` runs the whole local stack as child processes; `switchyard config print`
shows the effective configuration.

Only the module of the command being run is imported (a router does not load FastAPI, a
preprocessor does not load the mock engine): each service starts in the time its own
imports take. Every flag can also come from SWITCHYARD_<FLAG> or a --config YAML file
(see switchyard.common.settings).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from switchyard.common import settings
from switchyard.common.settings import ConfigError

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
CONFIG = "config"

# The gRPC core settings of the commands that dial engines, set before grpc is first imported
# (an operator's own value wins). `-event_engine_client` puts client channels on gRPC's
# iomgr poller, which reads in the thread that waits for the replies; the EventEngine client
# hands each message across three of its threads first (fewer wake-ups and less CPU per
# message: docs/benchmarks.md, "gRPC client settings"). The mock engine, a server, keeps the
# defaults.
GRPC_CLIENT_ENV = {"GRPC_EXPERIMENTS": "-event_engine_client"}
GRPC_CLIENTS = frozenset({"fleet", "router", "dispatcher", "preprocessor", "kv-proxy"})


def version() -> str:
    try:
        return metadata.version("switchyard")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "unknown"


class HelpFormatter(argparse.HelpFormatter):
    """Every flag's help ends with its default and, where a metavar hides them, its choices."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if not action.option_strings or isinstance(
            action, argparse._HelpAction | argparse._VersionAction
        ):
            return text
        extras = []
        if action.choices is not None and action.metavar is not None:
            extras.append("choices: " + ", ".join(str(c) for c in action.choices))
        default = action.default
        unset = default is None or default is False or default is argparse.SUPPRESS
        shown = not unset and default != [] and action.nargs != 0
        if shown and "default" not in text.lower():
            extras.append("default: %(default)s")
        return f"{text} ({'; '.join(extras)})" if extras else text


def _epilog(command: str) -> str:
    return (
        f"Every flag can also be set as SWITCHYARD_<FLAG> (e.g. SWITCHYARD_LOG_LEVEL) or in "
        f"the '{command}:' section of a --config YAML file; precedence: flag > environment > "
        "file > default. `switchyard config print` shows the result."
    )


def add_common(parser: argparse.ArgumentParser) -> None:
    """What every command has besides its own flags."""
    parser.add_argument(
        "--config",
        metavar="PATH",
        default=None,
        help=f"YAML config file with a section per command (env {settings.CONFIG_ENV})",
    )
    parser.add_argument(
        "--version", action="version", version=f"switchyard {version()}", help="print the version"
    )


def command_parser(name: str, prog: str = "switchyard") -> argparse.ArgumentParser:
    """The full parser of one command (its module imported)."""
    module, help_text = SUBCOMMANDS[name]
    parser = argparse.ArgumentParser(
        prog=f"{prog} {name}",
        description=help_text,
        epilog=_epilog(name),
        formatter_class=HelpFormatter,
        allow_abbrev=False,  # a flag is its whole name, on the command line as in a file
    )
    importlib.import_module(module).add_arguments(parser)
    add_common(parser)
    return parser


def build_parser(full: bool = True) -> argparse.ArgumentParser:
    """The top-level parser; its subcommands' flags only with `full` (it imports them all:
    tests and tools; `main` imports only the command it runs)."""
    parser = argparse.ArgumentParser(
        prog="switchyard", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--version", action="version", version=f"switchyard {version()}", help="print the version"
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        sub = subparsers.add_parser(
            name,
            help=help_text,
            description=help_text,
            epilog=_epilog(name),
            formatter_class=HelpFormatter,
            allow_abbrev=False,
        )
        if full:
            importlib.import_module(module).add_arguments(sub)
            add_common(sub)
    subparsers.add_parser(
        CONFIG,
        help="config print [--config F] [COMMAND [FLAGS]]: the effective configuration",
        add_help=False,
    )
    return parser


def _config_path(argv: Sequence[str], environ: Any) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return environ.get(settings.CONFIG_ENV) or None


def resolve(
    name: str, argv: Sequence[str], environ: Any = None, require: bool = True
) -> tuple[argparse.Namespace, settings.Settings]:
    """Parse one command's flags over its environment and config file."""
    environ = os.environ if environ is None else environ
    parser = command_parser(name)
    path = _config_path(argv, environ)
    data = settings.load_file(path) if path else {}
    settings.check_sections(data, list(SUBCOMMANDS), path or "")
    args, resolved = settings.resolve(
        name,
        parser,
        argv,
        environ=environ,
        file_data=data,
        file_path=path or "",
        require=require,
    )
    if args.config is None and path:
        args.config = path  # from SWITCHYARD_CONFIG: `up` hands it to its children
    args._module = SUBCOMMANDS[name][0]
    args._settings = resolved
    return args, resolved


def _config_command(argv: list[str]) -> int:
    usage = "usage: switchyard config print [--config PATH] [COMMAND [FLAG ...]]"
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        print("\nThe effective value of every flag and where it came from (flag, env, file,")
        print("default), as YAML that --config reads back.")
        return 0 if argv else 2
    if argv[0] != "print":
        print(usage, file=sys.stderr)
        return 2
    rest = argv[1:]
    config: list[str] = []
    for i, arg in enumerate(rest):
        if arg == "--config" and i + 1 < len(rest):
            config, rest = rest[i : i + 2], rest[:i] + rest[i + 2 :]
            break
        if arg.startswith("--config="):
            config, rest = [arg], rest[:i] + rest[i + 1 :]
            break
    if rest and rest[0] in SUBCOMMANDS:
        chosen = [(rest[0], [*rest[1:], *config])]
    elif not rest:
        chosen = [(name, config) for name in SUBCOMMANDS]
    else:
        print(usage, file=sys.stderr)
        return 2
    out = [resolve(name, flags, require=False)[1] for name, flags in chosen]
    sys.stdout.write(
        f"# switchyard {version()}: effective configuration "
        "(flag > SWITCHYARD_<FLAG> > --config file > default)\n" + settings.render(out)
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    name = next((a for a in argv if not a.startswith("-")), None)
    try:
        if name == CONFIG and argv[0] == CONFIG:
            return _config_command(argv[1:])
        if name in SUBCOMMANDS and argv[0] == name:
            if name in GRPC_CLIENTS:
                for key, value in GRPC_CLIENT_ENV.items():
                    os.environ.setdefault(key, value)
            args, _ = resolve(name, argv[1:])
            return int(importlib.import_module(args._module).run(args) or 0)
    except ConfigError as exc:
        print(f"switchyard: {exc}", file=sys.stderr)
        return 2
    build_parser(full=False).parse_args(argv)  # --help, --version, or a usage error (exits)
    return 2


if __name__ == "__main__":
    sys.exit(main())
