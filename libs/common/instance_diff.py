"""The static-instance diff: two instance lists in, Added/Removed/Updated events out.

Fleet computes every change as a diff between the routable set it last published and the
one it has now, whatever made it change (a flag, the workers file, a probe, a down report),
so consumers see one event stream. Consumers use the same diff after a resync to learn what a
fresh snapshot changed. Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from switchyard.protos.messages import (
    Instance,
    InstanceAdded,
    InstanceEvent,
    InstanceRemoved,
    InstanceUpdated,
)


def index_instances(instances: Iterable[Instance]) -> dict[int, Instance]:
    """Instances by id. Records with the same id (the same normalized URL) collapse to one:
    the last one wins, as in a dict literal."""
    return {instance.instance_id: instance for instance in instances}


def diff_instances(old: Mapping[int, Instance], new: Iterable[Instance]) -> list[InstanceEvent]:
    """Events that turn `old` into `new`: removed, then updated (same id, any field changed),
    then added, each group ordered by url (then id), so equal inputs give equal outputs.
    Order of `new` does not matter; duplicate ids in `new` collapse, the last one winning."""
    current = index_instances(new)

    def by_url(instance_id: int, table: Mapping[int, Instance]) -> tuple[str, int]:
        return table[instance_id].url, instance_id

    removed = sorted(old.keys() - current.keys(), key=lambda i: by_url(i, old))
    added = sorted(current.keys() - old.keys(), key=lambda i: by_url(i, current))
    updated = sorted(
        (i for i in current.keys() & old.keys() if current[i] != old[i]),
        key=lambda i: by_url(i, current),
    )
    events: list[InstanceEvent] = [InstanceRemoved(i, old[i].url) for i in removed]
    events.extend(InstanceUpdated(current[i]) for i in updated)
    events.extend(InstanceAdded(current[i]) for i in added)
    return events


def apply_events(
    old: Mapping[int, Instance], events: Iterable[InstanceEvent]
) -> dict[int, Instance]:
    """A new dict: `old` with `events` applied in order (`old` is left untouched). An Added
    for a known id replaces it; a Removed for an unknown id is a no-op."""
    result = dict(old)
    for event in events:
        if isinstance(event, InstanceRemoved):
            result.pop(event.instance_id, None)
        else:
            result[event.instance.instance_id] = event.instance
    return result
