"""How much of a request's prompt a worker can serve from its cache: the one reading of the
KV view (device blocks, offloaded blocks, pending bookings) that every plugin shares."""

from __future__ import annotations

from collections.abc import Sequence

from switchyard.router.types import RouteContext, Worker


def cached_tokens(ctx: RouteContext, w: Worker, offload_weight: float) -> tuple[float, int]:
    """(prompt tokens expected from the worker's cache, of which pending bookings).

    `ctx.pending_blocks` are the leading blocks held or booked there (see bookings).

    A booked block counts as held (its prefill is under way there); an offloaded-tier block
    beyond the device prefix counts `offload_weight` of one (loading it costs something).
    At most prompt - 1 tokens: an engine computes at least the last prompt token."""
    key = w.key
    device = ctx.device_blocks.get(key, 0)
    pending = ctx.pending_blocks.get(key, 0) if ctx.pending_blocks else 0
    held = device if device >= pending else pending
    size = w.instance.block_size
    tokens = float(held * size)
    if ctx.any_tier_blocks:
        extra = ctx.any_tier_blocks.get(key, 0) - held
        if extra > 0:
            tokens += offload_weight * extra * size
    limit = ctx.prompt_tokens - 1
    if tokens > limit:
        tokens = float(max(limit, 0))
    return tokens, (pending - device) * size if pending > device else 0


def cached_tokens_all(
    ctx: RouteContext, workers: Sequence[Worker], offload_weight: float
) -> list[tuple[float, int]]:
    """`cached_tokens` of every worker, in one pass (the scorers' hot loop)."""
    device_of = ctx.device_blocks.get
    pending_of = ctx.pending_blocks.get
    any_of = ctx.any_tier_blocks.get if ctx.any_tier_blocks else None
    limit = float(max(ctx.prompt_tokens - 1, 0))
    out = []
    for w in workers:
        key = w.key
        device = device_of(key, 0)
        pending = pending_of(key, 0)
        held = device if device >= pending else pending
        if not held and any_of is None:
            out.append((0.0, 0))
            continue
        size = w.instance.block_size
        tokens = float(held * size)
        if any_of is not None:
            extra = any_of(key, 0) - held
            if extra > 0:
                tokens += offload_weight * extra * size
        out.append(
            (
                tokens if tokens < limit else limit,
                (pending - device) * size if pending > device else 0,
            )
        )
    return out
