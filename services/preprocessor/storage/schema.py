"""Each backend's migrations: version n is the list of statements that take the schema from
n-1 to n. A database records its version (SQLite: `PRAGMA user_version`; PostgreSQL: the
`switchyard_schema` table) and gets the versions above it at start, each in one
transaction. Append a version, never edit one that shipped.

JSON is kept as bytes (BLOB / BYTEA), as the preprocessor encoded it: no re-serialization
on the way in or out. Items of a conversation are ordered by `seq`, which only grows.
"""

from __future__ import annotations

SQLITE: list[list[str]] = [
    [
        """CREATE TABLE responses (
            id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            expires_at REAL,
            status TEXT NOT NULL,
            model TEXT NOT NULL,
            previous_response_id TEXT,
            conversation_id TEXT,
            body BLOB NOT NULL,
            input_items BLOB NOT NULL
        )""",
        "CREATE INDEX responses_expiry ON responses (expires_at) WHERE expires_at IS NOT NULL",
        """CREATE TABLE conversations (
            id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            expires_at REAL,
            metadata BLOB NOT NULL
        )""",
        "CREATE INDEX conversations_expiry ON conversations (expires_at) "
        "WHERE expires_at IS NOT NULL",
        """CREATE TABLE conversation_items (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation_id TEXT NOT NULL,
            id TEXT NOT NULL,
            body BLOB NOT NULL,
            UNIQUE (conversation_id, id)
        )""",
        "CREATE INDEX conversation_items_order ON conversation_items (conversation_id, seq)",
    ],
]

POSTGRES: list[list[str]] = [
    [
        """CREATE TABLE responses (
            id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            created_at BIGINT NOT NULL,
            expires_at DOUBLE PRECISION,
            status TEXT NOT NULL,
            model TEXT NOT NULL,
            previous_response_id TEXT,
            conversation_id TEXT,
            body BYTEA NOT NULL,
            input_items BYTEA NOT NULL
        )""",
        "CREATE INDEX responses_expiry ON responses (expires_at) WHERE expires_at IS NOT NULL",
        """CREATE TABLE conversations (
            id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            created_at BIGINT NOT NULL,
            expires_at DOUBLE PRECISION,
            metadata BYTEA NOT NULL
        )""",
        "CREATE INDEX conversations_expiry ON conversations (expires_at) "
        "WHERE expires_at IS NOT NULL",
        """CREATE TABLE conversation_items (
            seq BIGSERIAL PRIMARY KEY,
            conversation_id TEXT NOT NULL,
            id TEXT NOT NULL,
            body BYTEA NOT NULL,
            UNIQUE (conversation_id, id)
        )""",
        "CREATE INDEX conversation_items_order ON conversation_items (conversation_id, seq)",
    ],
]
