"""Errors of KV ingestion.

ValueError
 └── KvDecodeError        a ZMQ message or msgpack payload that is not a KV-event batch
"""

from __future__ import annotations


class KvDecodeError(ValueError):
    def __init__(self, message: str, instance_id: int | None = None) -> None:
        super().__init__(message)
        self.instance_id = instance_id
