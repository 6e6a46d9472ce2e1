"""The statements both backends run, written once with `?` placeholders (SQLite's);
`numbered` turns them into PostgreSQL's `$1, $2, ...`. A record past its expiry is not
found (`LIVE`) even before the purge deletes it."""

from __future__ import annotations

import re

LIVE = "(expires_at IS NULL OR expires_at > ?)"

RESPONSE_COLUMNS = (
    "id, tenant, created_at, expires_at, status, model, body, input_items, "
    "previous_response_id, conversation_id"
)
INSERT_RESPONSE = (
    f"INSERT INTO responses ({RESPONSE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
SELECT_RESPONSE = f"SELECT {RESPONSE_COLUMNS} FROM responses WHERE id = ? AND tenant = ? AND {LIVE}"
DELETE_RESPONSE = "DELETE FROM responses WHERE id = ? AND tenant = ?"

CONVERSATION_COLUMNS = "id, tenant, created_at, expires_at, metadata"
INSERT_CONVERSATION = f"INSERT INTO conversations ({CONVERSATION_COLUMNS}) VALUES (?, ?, ?, ?, ?)"
SELECT_CONVERSATION = (
    f"SELECT {CONVERSATION_COLUMNS} FROM conversations WHERE id = ? AND tenant = ? AND {LIVE}"
)
UPDATE_METADATA = f"UPDATE conversations SET metadata = ? WHERE id = ? AND tenant = ? AND {LIVE}"
TOUCH_CONVERSATION = "UPDATE conversations SET expires_at = ? WHERE id = ?"
DELETE_CONVERSATION = "DELETE FROM conversations WHERE id = ? AND tenant = ?"
DELETE_CONVERSATION_ITEMS = "DELETE FROM conversation_items WHERE conversation_id = ?"

INSERT_ITEM = "INSERT INTO conversation_items (conversation_id, id, body) VALUES (?, ?, ?)"
SELECT_ITEM = "SELECT id, body FROM conversation_items WHERE conversation_id = ? AND id = ?"
ITEM_SEQ = "SELECT seq FROM conversation_items WHERE conversation_id = ? AND id = ?"
DELETE_ITEM = "DELETE FROM conversation_items WHERE conversation_id = ? AND id = ?"


def select_items(after: bool, descending: bool, limited: bool) -> str:
    """A page of a conversation's items: args (conversation_id[, after_seq][, limit])."""
    sql = "SELECT id, body FROM conversation_items WHERE conversation_id = ?"
    if after:
        sql += " AND seq < ?" if descending else " AND seq > ?"
    sql += " ORDER BY seq DESC" if descending else " ORDER BY seq"
    return sql + (" LIMIT ?" if limited else "")


# Retention: expired conversations lose their items first (the items have no expiry).
PURGE_RESPONSES = "DELETE FROM responses WHERE expires_at IS NOT NULL AND expires_at <= ?"
PURGE_CONVERSATION_ITEMS = (
    "DELETE FROM conversation_items WHERE conversation_id IN (SELECT id FROM conversations "
    "WHERE expires_at IS NOT NULL AND expires_at <= ?)"
)
PURGE_CONVERSATIONS = "DELETE FROM conversations WHERE expires_at IS NOT NULL AND expires_at <= ?"

_PLACEHOLDER = re.compile(r"\?")


def numbered(sql: str) -> str:
    """`?` placeholders -> `$1, $2, ...` (no statement here holds a literal `?`)."""
    count = 0

    def next_number(_: re.Match[str]) -> str:
        nonlocal count
        count += 1
        return f"${count}"

    return _PLACEHOLDER.sub(next_number, sql)
