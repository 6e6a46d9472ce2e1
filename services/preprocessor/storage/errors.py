"""What the store raises.

    Exception
     +-- StoreError
          +-- StoreUnavailable(reason)   the database is down, refused, or did not answer
                                         within --store-timeout: the client gets a 503

A backend turns its driver's connection and timeout failures into StoreUnavailable; any
other exception is a bug and surfaces as one.
"""

from __future__ import annotations


class StoreError(Exception):
    pass


class StoreUnavailable(StoreError):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
