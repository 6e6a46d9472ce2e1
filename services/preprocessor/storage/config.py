"""The store's settings and flags (the preprocessor's and `switchyard up`'s).

--store auto|sqlite|postgres|none    auto: PostgreSQL when a DSN is given, else SQLite
--data-dir DIR                       SQLite's folder (the file: DIR/switchyard.db)
--postgres-dsn DSN                   postgresql://user:pass@host:port/db (a secret: prefer
                                     SWITCHYARD_POSTGRES_DSN or the config file)
--responses-ttl, --conversations-ttl how long objects are kept (0: until deleted)
--responses-max-bytes                the largest response record kept
--store-timeout                      every database call's bound
--store-pool-size                    PostgreSQL connections per preprocessor
--store-unavailable fail|serve       what a request to store gets while the database is
                                     down: a 503, or an answer not kept (with a warning)
"""

from __future__ import annotations

import argparse
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from switchyard.common.argtypes import positive_seconds, whole_number
from switchyard.preprocessor.storage.sqlite import FILE_NAME

BACKENDS = ("auto", "sqlite", "postgres", "none")
WHEN_UNAVAILABLE = ("fail", "serve")
DAY = 86400.0
DEFAULT_RESPONSES_TTL = 30 * DAY  # OpenAI keeps responses 30 days
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
DEFAULT_TIMEOUT = 2.0
DEFAULT_POOL_SIZE = 10
DSN_ENV = "SWITCHYARD_POSTGRES_DSN"
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": DAY}


def duration(text: str) -> float:
    """argparse type of a retention time: seconds, or a number with s, m, h or d (30d)."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([smhd]?)\s*", text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"not a duration: {text!r} (seconds, or a number with s, m, h or d: 30d)"
        )
    value = float(match.group(1)) * _UNITS[match.group(2)]
    if not value < math.inf:
        raise argparse.ArgumentTypeError(f"too long: {text!r}")
    return value


def default_data_dir() -> Path:
    """$XDG_DATA_HOME/switchyard, else ~/.local/share/switchyard."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "switchyard"


@dataclass(frozen=True)
class StoreConfig:
    backend: str = "sqlite"  # sqlite | postgres | none (auto resolved)
    data_dir: Path | None = None  # sqlite: the folder of its file
    dsn: str | None = None  # postgres
    responses_ttl: float = DEFAULT_RESPONSES_TTL  # seconds; 0: kept until deleted
    conversations_ttl: float = 0.0  # after the last turn; 0: kept until deleted (OpenAI's)
    max_bytes: int = DEFAULT_MAX_BYTES  # the largest response record kept
    timeout: float = DEFAULT_TIMEOUT  # every database call
    pool_size: int = DEFAULT_POOL_SIZE
    when_unavailable: str = "fail"  # fail: 503; serve: answer unstored, with a warning header
    purge_interval: float = 60.0  # how often expired records are deleted

    def __post_init__(self) -> None:
        if self.backend not in ("sqlite", "postgres", "none"):
            raise ValueError(f"unknown store backend {self.backend!r}")
        if self.backend == "postgres" and not self.dsn:
            raise ValueError(f"--store postgres needs --postgres-dsn (or {DSN_ENV})")
        if self.when_unavailable not in WHEN_UNAVAILABLE:
            raise ValueError(f"--store-unavailable must be one of {', '.join(WHEN_UNAVAILABLE)}")
        if not (self.timeout > 0 and self.purge_interval > 0 and self.pool_size >= 1):
            raise ValueError("store timeouts and the pool size must be positive")

    @property
    def enabled(self) -> bool:
        return self.backend != "none"

    @property
    def sqlite_path(self) -> Path:
        return (self.data_dir or default_data_dir()) / FILE_NAME


def add_store_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "stored responses and conversations",
        "what /v1/responses keeps (store, previous_response_id, GET/DELETE) and "
        "/v1/conversations; each object belongs to the API key that made it",
    )
    group.add_argument(
        "--store",
        choices=BACKENDS,
        default="auto",
        help="where responses and conversations are kept: sqlite (a file under --data-dir), "
        "postgres (--postgres-dsn: for replicas that share them), none (store: true is "
        "refused); auto (default): postgres when a DSN is given, else sqlite",
    )
    group.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help=f"the SQLite store's folder, created on first start (the file: DIR/{FILE_NAME}); "
        "default: $XDG_DATA_HOME/switchyard, else ~/.local/share/switchyard",
    )
    group.add_argument(
        "--postgres-dsn",
        default=None,
        metavar="DSN",
        help="the PostgreSQL store, e.g. postgresql://user:password@db:5432/switchyard "
        f"(it holds a password: prefer {DSN_ENV} or the config file to this flag, which ps "
        "shows); migrations run at start",
    )
    group.add_argument(
        "--responses-ttl",
        type=duration,
        default=DEFAULT_RESPONSES_TTL,
        metavar="DURATION",
        help="how long a stored response is kept: seconds, or with s, m, h, d (default 30d; "
        "0: until deleted); expired ones are never served and are deleted within a minute",
    )
    group.add_argument(
        "--conversations-ttl",
        type=duration,
        default=0.0,
        metavar="DURATION",
        help="how long a conversation is kept after its last change (default 0: until "
        "deleted, as OpenAI keeps them)",
    )
    group.add_argument(
        "--responses-max-bytes",
        type=whole_number(1024),
        default=DEFAULT_MAX_BYTES,
        metavar="N",
        help="the largest response kept (its input items and output, as JSON): a request "
        "whose input items alone are larger gets 400 unless it sets store: false, one whose "
        "output takes it past is answered unstored; also the largest Conversations API body "
        "(default 16 MiB)",
    )
    group.add_argument(
        "--store-timeout",
        type=positive_seconds,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="the longest any database call may take; past it the store counts as "
        "unavailable until a probe (every second) gets an answer (default 2)",
    )
    group.add_argument(
        "--store-pool-size",
        type=whole_number(1),
        default=DEFAULT_POOL_SIZE,
        metavar="N",
        help=f"PostgreSQL connections per preprocessor (default {DEFAULT_POOL_SIZE})",
    )
    group.add_argument(
        "--store-unavailable",
        choices=WHEN_UNAVAILABLE,
        default="fail",
        help="while the database is down or slow: fail (default) answers requests that would "
        "be stored with 503; serve answers them unstored ('store': false in the response "
        "and an x-switchyard-warning header). Reads (previous_response_id, conversation, "
        "GET) are 503 either way",
    )


def store_config_from_args(args: argparse.Namespace) -> StoreConfig:
    backend = args.store
    if backend == "auto":
        backend = "postgres" if args.postgres_dsn else "sqlite"
    return StoreConfig(
        backend=backend,
        data_dir=args.data_dir,
        dsn=args.postgres_dsn,
        responses_ttl=args.responses_ttl,
        conversations_ttl=args.conversations_ttl,
        max_bytes=args.responses_max_bytes,
        timeout=args.store_timeout,
        pool_size=args.store_pool_size,
        when_unavailable=args.store_unavailable,
    )


def store_argv(args: argparse.Namespace) -> list[str]:
    """The store flags `switchyard up` hands its preprocessors (the DSN goes in their
    environment, never on a command line)."""
    out = [
        "--store", args.store,
        "--responses-ttl", repr(args.responses_ttl),
        "--conversations-ttl", repr(args.conversations_ttl),
        "--responses-max-bytes", str(args.responses_max_bytes),
        "--store-timeout", repr(args.store_timeout),
        "--store-pool-size", str(args.store_pool_size),
        "--store-unavailable", args.store_unavailable,
    ]  # fmt: skip
    if args.data_dir is not None:
        out += ["--data-dir", str(args.data_dir)]
    return out
