"""KV event batches as the engines' ZMQ publishers encode them (msgpack via msgspec).

Payload: `[ts, [event, ...], dp_rank]` (a float wall-clock timestamp, dp_rank 0), as vLLM's
array-like KVEventBatch. Events, by `EventFormat`:

    map:   {"type": "BlockStored", "block_hashes": [...], "parent_block_hash": h | None,
            "token_ids": [...], "block_size": n, "lora_id": None, "medium": "GPU"}
           {"type": "BlockRemoved", "block_hashes": [...], "medium": "GPU"}
           {"type": "AllBlocksCleared"}
    array: ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id,
            medium], ["BlockRemoved", block_hashes, medium], ["AllBlocksCleared"]

Hashes by `HashForm`: unsigned 64-bit ints, the same bits as signed ints, or 8 big-endian bytes.

vLLM's maps (0.32, recorded in tests/fixtures/vllm_real.json) carry more keys, read by none of
the consumers we know but there on the wire: BlockStored `lora_name` (None), `extra_keys` (one
None per block), `group_idx` (0), `kv_cache_spec_kind` ("full_attention"); BlockRemoved
`group_idx`. `vllm_keys=True` adds them.
"""

from __future__ import annotations

from typing import Any

import msgspec

from switchyard.mock_engine.config import EventFormat, HashForm
from switchyard.mock_engine.types import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEvent,
)

MEDIUM = "GPU"
_SIGN = 1 << 63
_WRAP = 1 << 64


def wire_hash(block_hash: int, form: HashForm) -> int | bytes:
    if form is HashForm.BYTES:
        return block_hash.to_bytes(8, "big")
    if form is HashForm.INT and block_hash >= _SIGN:
        return block_hash - _WRAP
    return block_hash


class WireEncoder:
    """Encodes an `EventBatch` into the PUB payload; one per publisher."""

    def __init__(
        self,
        form: EventFormat = EventFormat.MAP,
        hash_form: HashForm = HashForm.UINT,
        dp_rank: int = 0,
        vllm_keys: bool = False,
    ) -> None:
        self.form = form
        self.vllm_keys = vllm_keys and form is EventFormat.MAP
        self.hash_form = hash_form
        self.dp_rank = dp_rank
        self._encoder = msgspec.msgpack.Encoder()

    def __call__(self, batch: EventBatch) -> bytes:
        events = [self.event(event) for event in batch.events]
        return self._encoder.encode([batch.ts, events, self.dp_rank])

    def _hashes(self, hashes: tuple[int, ...]) -> list[int | bytes]:
        return [wire_hash(h, self.hash_form) for h in hashes]

    def event(self, event: KvEvent) -> Any:
        as_map = self.form is EventFormat.MAP
        if isinstance(event, BlockStored):
            parent = event.parent_block_hash
            fields: list[tuple[str, Any]] = [
                ("block_hashes", self._hashes(event.block_hashes)),
                (
                    "parent_block_hash",
                    None if parent is None else wire_hash(parent, self.hash_form),
                ),
                ("token_ids", list(event.token_ids)),
                ("block_size", event.block_size),
                ("lora_id", None),
                ("medium", MEDIUM),
            ]
            if self.vllm_keys:
                fields += [
                    ("lora_name", None),
                    ("extra_keys", [None] * len(event.block_hashes)),
                    ("group_idx", 0),
                    ("kv_cache_spec_kind", "full_attention"),
                ]
            tag = "BlockStored"
        elif isinstance(event, BlockRemoved):
            fields = [("block_hashes", self._hashes(event.block_hashes)), ("medium", MEDIUM)]
            if self.vllm_keys:
                fields.append(("group_idx", 0))
            tag = "BlockRemoved"
        elif isinstance(event, AllBlocksCleared):
            fields, tag = [], "AllBlocksCleared"
        else:  # pragma: no cover - KvEvent is closed
            raise TypeError(f"not a KV event: {event!r}")
        if as_map:
            return {"type": tag, **dict(fields)}
        return [tag, *(value for _, value in fields)]
