"""Models served, derived from fleet's instance set (swapped whole on every change)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from switchyard.common import capabilities
from switchyard.protos.messages import ROLE_PREFILL, Instance


@dataclass(frozen=True, slots=True)
class ModelEntry:
    name: str
    context_length: int  # the smallest of its instances: a request must fit on any of them
    instances: int
    is_generation: bool = True  # False: an embedding model (serves /v1/embeddings only)
    # Request fields some of its engines can honour (switchyard.common.capabilities): a
    # request needing one goes to those engines only, and is refused only if none can.
    capabilities: frozenset[str] = frozenset()


def build_catalog(instances: Mapping[int, Instance]) -> dict[str, ModelEntry]:
    grouped: dict[str, list[Instance]] = {}
    for inst in instances.values():
        if inst.role != ROLE_PREFILL:
            grouped.setdefault(inst.model, []).append(inst)
    return {
        name: ModelEntry(
            name,
            min(i.context_length for i in group),
            len(group),
            all(i.is_generation for i in group),
            frozenset().union(*(capabilities.of(i.protocol) for i in group)),
        )
        for name, group in grouped.items()
    }
