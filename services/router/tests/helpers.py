"""Builders shared by the router's unit tests: instances, requests, a core over them, and
KV blocks stored on a worker through the real index."""

from __future__ import annotations

import random

from switchyard.protos.messages import Instance, RouteRequest
from switchyard.router.config import RoutingConfig, preset
from switchyard.router.core import RouterCore
from switchyard.router.kv.types import Stored
from switchyard.router.timing import TimeParams

BLOCK = 16


def inst(
    iid: int,
    *,
    model: str = "m",
    role: str = "aggregated",
    protocol: str = "sglang",
    dp_size: int = 1,
    max_running: int = 0,
    block_size: int = BLOCK,
) -> Instance:
    return Instance(
        instance_id=iid,
        url=f"grpc://h{iid}:{1000 + iid}",
        protocol=protocol,
        model=model,
        context_length=65536,
        block_size=block_size,
        role=role,
        dp_size=dp_size,
        max_running_requests=max_running,
    )


def req(
    rid: str,
    tokens: list[int],
    *,
    dry_run: bool = False,
    session: str | None = None,
    exclude: list[int] | None = None,
    model: str = "m",
    requires: list[str] | None = None,
) -> RouteRequest:
    return RouteRequest(
        request_id=rid,
        model=model,
        token_ids=tokens,
        dry_run=dry_run,
        session_id=session,
        exclude=exclude or [],
        requires=requires or [],
    )


def core(
    *instances: Instance,
    mode: str = "kv",
    config: RoutingConfig | None = None,
    time: TimeParams | None = None,
    booking_ttl: float = 10.0,
) -> RouterCore:
    c = RouterCore(config or preset(mode, time, booking_ttl), rng=random.Random(0))
    c.set_instances({i.instance_id: i for i in instances})
    return c


def hold(c: RouterCore, worker: tuple[int, int], tokens: list[int], size: int = BLOCK) -> None:
    """The engine reported storing every full block of `tokens` on `worker`."""
    n = len(tokens) // size
    base = (worker[0] << 32) + (worker[1] << 24)
    c.index.apply_batch(
        worker, [Stored(list(range(base, base + n)), None, tokens[: n * size], size)]
    )


def prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 100_000) for _ in range(length)]
