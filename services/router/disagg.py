"""Prefill/decode orchestration as plugins: the profile handler and its decider.

A **profile handler** decides which profiles a decision runs over which workers and what
comes of them (llm-d's profile handler). `decode_then_prefill`, the only one so far and the
default: run the decode profile over the model's workers; when prefill workers of the chosen
decode worker's protocol exist and the decider says the request should prefill elsewhere,
run the prefill profile over the prefill workers: its pick prefills the prompt and hands the
KV to the decode worker (the prefill hop). A dry run (`/debug/route`) runs the prefill
profile whenever it could, to show its scores, without taking the hop.

A **decider** says whether a request takes the hop:

- `uncached_tokens` (default): always when the decode worker cannot prefill itself (a
  decode-only engine); else when the prompt's part not cached there is at least
  `min_uncached_tokens` (default `--disagg-min-uncached-tokens`, 256): a short uncached
  suffix costs less to prefill in place than a second engine call and a KV transfer (llm-d's
  prefix-based decider). It reads the cached prefix when the profiles' plugins had the core
  compute it (Needs.BLOCKS), and counts none otherwise.
- `always`: whenever a prefill worker can take the request.

Configured in a routing config file (`config.py`): `disaggregation: {handler:
decode_then_prefill, decider: {name: uncached_tokens, min_uncached_tokens: 512}}`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from switchyard.router.config import DisaggConfig, parse_params
from switchyard.router.framework import Profile
from switchyard.router.prefix import cached_tokens
from switchyard.router.types import (
    Decider,
    Decision,
    Needs,
    PluginDeps,
    ProfileHandler,
    RouteContext,
    Worker,
)

DEFAULT_MIN_UNCACHED_TOKENS = 256


class UncachedTokens:
    name = "uncached_tokens"
    needs = Needs.NONE  # uses the cached prefix when computed, never asks for it

    @dataclass(frozen=True, slots=True)
    class Params:
        min_uncached_tokens: int = DEFAULT_MIN_UNCACHED_TOKENS

        def __post_init__(self) -> None:
            if self.min_uncached_tokens < 0:
                raise ValueError(
                    f"min_uncached_tokens must be >= 0, got {self.min_uncached_tokens}"
                )

    def __init__(self, params: Params, deps: PluginDeps) -> None:
        self.min_uncached_tokens = params.min_uncached_tokens
        self._offload_weight = deps.time.params.offload_weight

    def disaggregate(self, ctx: RouteContext, decode: Worker) -> bool:
        if not decode.instance.local_prefill:
            return True
        held = cached_tokens(ctx, decode, self._offload_weight)[0] if ctx.hashes else 0
        return ctx.prompt_tokens - held >= self.min_uncached_tokens


class Always:
    name = "always"
    needs = Needs.NONE

    def disaggregate(self, ctx: RouteContext, decode: Worker) -> bool:
        return True


class DecodeThenPrefill:
    name = "decode_then_prefill"

    def __init__(self, decider: Decider) -> None:
        self.decider = decider
        self.needs = decider.needs

    def run(
        self,
        ctx: RouteContext,
        decode: Profile,
        prefill: Profile,
        workers: list[Worker],
        prefill_workers: list[Worker],
    ) -> Decision:
        outcome = decode.run(ctx, workers)
        chosen = outcome.chosen
        if chosen is None:
            return Decision(outcome)
        protocol = chosen.instance.protocol
        reachable = any(w.instance.protocol == protocol for w in prefill_workers)
        hop = reachable and self.decider.disaggregate(ctx, chosen)
        if not hop and not (reachable and ctx.request.dry_run):
            return Decision(outcome)
        ctx.decode_protocol = protocol
        prefill_outcome = prefill.run(ctx, prefill_workers)
        return Decision(outcome, prefill_outcome, prefill_outcome.chosen if hop else None)


DECIDERS: dict[str, type] = {"uncached_tokens": UncachedTokens, "always": Always}
HANDLERS: dict[str, type] = {"decode_then_prefill": DecodeThenPrefill}


def build_handler(
    config: DisaggConfig, deps: PluginDeps, min_uncached_tokens: int | None = None
) -> ProfileHandler:
    """The configured profile handler and its decider. `min_uncached_tokens` (the router's
    --disagg-min-uncached-tokens) is the `uncached_tokens` decider's threshold unless the
    config gives one."""
    handler = HANDLERS.get(config.handler)
    if handler is None:
        raise ValueError(
            f"unknown profile handler {config.handler!r}; choose from {', '.join(HANDLERS)}"
        )
    decider = config.decider
    cls = DECIDERS.get(decider.name)
    if cls is None:
        raise ValueError(f"unknown decider {decider.name!r}; choose from {', '.join(DECIDERS)}")
    params_type: Any = getattr(cls, "Params", None)
    if params_type is None:
        if decider.params:
            raise ValueError(f"decider {decider.name!r} takes no parameters")
        built: Decider = cls()
    else:
        raw = dict(decider.params)
        if min_uncached_tokens is not None and cls is UncachedTokens:
            raw.setdefault("min_uncached_tokens", min_uncached_tokens)
        built = cls(parse_params(params_type, raw, f"decider {decider.name!r}"), deps)
    result: ProfileHandler = handler(built)
    return result
