"""Which engines may take a request, by what they are: the rules the router's candidate
filters apply, shared with the preprocessor's fallback, which routes when no router answers.

- `serves_requests`: not a prefill-only engine (those take a prefill hop's leg only).
- `prefills_itself`: it computes its own prompts' KV (a decode-only engine needs a hop).
- `whole_request_engines`: the engines of a model that can take a request with no router
  and so no prefill hop: able to honour the fields it requires (capabilities), serving
  requests, prefilling themselves, not excluded.
- `RoundRobin`: engines in turn, ordered by instance id, so every replica agrees.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from switchyard.common.capabilities import can_honour
from switchyard.protos.messages import ROLE_PREFILL, Instance


def serves_requests(instance: Instance) -> bool:
    return instance.role != ROLE_PREFILL


def prefills_itself(instance: Instance) -> bool:
    return instance.local_prefill


def whole_request_engines(
    instances: Iterable[Instance],
    model: str,
    exclude: Sequence[int] = (),
    requires: Sequence[str] = (),
) -> list[Instance]:
    return [
        i
        for i in instances
        if i.model == model
        and (not requires or can_honour(i.protocol, requires))
        and i.instance_id not in exclude
        and serves_requests(i)
        and prefills_itself(i)
    ]


class RoundRobin:
    """The candidates in turn, ordered by instance id; a dry run looks without taking one."""

    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next = 0

    def pick(self, candidates: Sequence[Instance], dry_run: bool = False) -> Instance:
        ordered = sorted(candidates, key=lambda i: i.instance_id)
        chosen = ordered[self._next % len(ordered)]
        if not dry_run:
            self._next += 1
        return chosen
