"""Stored responses and conversations: one narrow interface, two real databases.

Layout: interface (the Store protocol and the records it keeps), errors, schema (each
backend's migrations), sqlite (the default: one file, WAL, a thread of its own) and postgres
(asyncpg and a connection pool, for replicas sharing one database); config (the flags'
values) and service (timeouts, health, retention around a backend: what the request path
calls).
"""
