"""How much of a request's prompt a worker can serve from its cache: the one reading of the
KV view (device blocks, offloaded blocks, pending bookings) that every plugin shares."""

from __future__ import annotations

from switchyard.router.types import RouteContext, Worker


def cached_tokens(ctx: RouteContext, w: Worker, offload_weight: float) -> tuple[float, int]:
    """(prompt tokens expected from the worker's cache, of which pending bookings).

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
