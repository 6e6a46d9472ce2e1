"""The store's contract: the records it keeps, and the one interface both backends serve.

Every record belongs to a tenant (the digest of the API key that made it, "" on an open
server) and every read, change and delete names the tenant: another key's object is not
found, exactly as one that never existed. JSON travels as bytes, encoded once by the
caller and stored as it came, never re-serialized by the database. `now` is passed in (unix
seconds): a record whose `expires_at` has passed is not found even before the purge
removes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class StoredResponse:
    id: str
    tenant: str
    created_at: int
    expires_at: float | None  # unix seconds; None: kept until deleted
    status: str  # completed | incomplete | failed
    model: str
    body: bytes  # the response object (JSON) as the client got it
    # The items it was generated from (a JSON array, ids included): an earlier response's
    # context, its output, and this request's input; not its instructions.
    input_items: bytes
    previous_response_id: str | None = None
    conversation_id: str | None = None

    @property
    def size(self) -> int:
        return len(self.body) + len(self.input_items)

    def row(self) -> tuple[Any, ...]:
        """The values of sql.RESPONSE_COLUMNS, in order."""
        return (
            self.id,
            self.tenant,
            self.created_at,
            self.expires_at,
            self.status,
            self.model,
            self.body,
            self.input_items,
            self.previous_response_id,
            self.conversation_id,
        )


def response_from_row(row: Sequence[Any]) -> StoredResponse:
    """A row of sql.RESPONSE_COLUMNS (either driver's: bytes, memoryview) -> the record."""
    return StoredResponse(
        row[0], row[1], row[2], row[3], row[4], row[5], bytes(row[6]), bytes(row[7]), row[8], row[9]
    )


def conversation_from_row(row: Sequence[Any]) -> Conversation:
    return Conversation(row[0], row[1], row[2], row[3], bytes(row[4]))


@dataclass(frozen=True, slots=True)
class Conversation:
    id: str
    tenant: str
    created_at: int
    expires_at: float | None
    metadata: bytes  # a JSON object

    def row(self) -> tuple[Any, ...]:
        """The values of sql.CONVERSATION_COLUMNS, in order."""
        return (self.id, self.tenant, self.created_at, self.expires_at, self.metadata)


@dataclass(frozen=True, slots=True)
class StoredItem:
    id: str
    body: bytes  # the item (a JSON object with this id)


@dataclass(frozen=True, slots=True)
class ItemPage:
    items: list[StoredItem]
    has_more: bool


class Store(Protocol):
    """A database that keeps responses and conversations. Methods raise StoreUnavailable
    when the database cannot be reached; the caller bounds each call's time."""

    name: str  # "sqlite" | "postgres"

    async def open(self) -> None:
        """Connect and bring the schema up to date (migrations)."""

    async def close(self) -> None: ...

    async def ping(self) -> None:
        """A round trip to the database (health probe)."""

    # --- responses ---------------------------------------------------------------------------

    async def put_response(
        self,
        response: StoredResponse,
        appended: Sequence[StoredItem] = (),
        touch: float | None = None,
    ) -> bool:
        """Keep a response; in the same transaction append `appended` to its conversation
        (and set the conversation's expiry to `touch` if given). False when the
        conversation is gone (the response is kept all the same)."""

    async def get_response(
        self, tenant: str, response_id: str, now: float
    ) -> StoredResponse | None: ...

    async def delete_response(self, tenant: str, response_id: str) -> bool: ...

    # --- conversations -----------------------------------------------------------------------

    async def create_conversation(
        self, conversation: Conversation, items: Sequence[StoredItem]
    ) -> None: ...

    async def get_conversation(
        self, tenant: str, conversation_id: str, now: float
    ) -> Conversation | None: ...

    async def update_conversation(
        self, tenant: str, conversation_id: str, metadata: bytes, now: float
    ) -> Conversation | None: ...

    async def delete_conversation(self, tenant: str, conversation_id: str) -> bool:
        """The conversation and every item of it."""

    async def add_items(
        self,
        tenant: str,
        conversation_id: str,
        items: Sequence[StoredItem],
        now: float,
        touch: float | None = None,
    ) -> bool:
        """Append items in order; False when there is no such conversation."""

    async def list_items(
        self,
        tenant: str,
        conversation_id: str,
        now: float,
        after: str | None = None,
        limit: int | None = None,
        descending: bool = False,
    ) -> ItemPage | None:
        """Items in the order they were added (or the reverse), those after the item
        `after` in that order, at most `limit` (None: all); None when there is no such
        conversation."""

    async def get_item(
        self, tenant: str, conversation_id: str, item_id: str, now: float
    ) -> StoredItem | None: ...

    async def delete_item(
        self, tenant: str, conversation_id: str, item_id: str, now: float
    ) -> bool: ...

    # --- retention ---------------------------------------------------------------------------

    async def purge(self, now: float) -> int:
        """Delete every record whose expiry has passed; how many were deleted."""
