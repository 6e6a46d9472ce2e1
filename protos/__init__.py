"""Switchyard's internal message schema: every message that crosses a process boundary.

Layout: `messages` defines the msgspec Structs (msgpack on the wire) exchanged between
fleet, router, dispatcher and preprocessor; `codec` holds the per-channel encoders/decoders.
"""
