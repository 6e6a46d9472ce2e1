"""Request ids: the client's `X-Request-Id` when it is a sane one, else a minted id.

The id is echoed in the response's `X-Request-Id` header and is the response body's `id`;
it is logged on the access line and sent to the engines as `x-request-id` gRPC metadata. The
engine request ids start with it: a minted id is unique as it is, a client's id gets a short
random suffix (two clients may send the same one, and an engine refuses a request id that is
already running). Accepted: 1 to 128 characters of letters, digits and `-_.:@/+=~`, starting
with a letter or digit (what fits a log field, a JSON string and gRPC metadata unescaped);
anything else is a 400 naming the header.
"""

from __future__ import annotations

import os
import re
import uuid

from switchyard.preprocessor.errors import InvalidRequestError

HEADER = b"x-request-id"
MAX_LENGTH = 128
_VALID = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._:@/+=~-]{{0,{MAX_LENGTH - 1}}}")


def mint(prefix: str) -> str:
    return f"{prefix}{uuid4_hex()}"  # the prefix ends in its separator


def uuid4_hex() -> str:
    """`uuid.uuid4().hex` in one call (uuid4 builds a UUID object, checks it, then formats
    it: three Python calls per request): the same random bits, version and variant."""
    n = int.from_bytes(os.urandom(16), "big")
    n = n & _UUID4_CLEAR | _UUID4_SET
    return f"{n:032x}"


# What UUID(version=4) clears and sets: the variant's two bits (RFC 4122), the version nibble.
_UUID4_CLEAR = ~((0xC000 << 48) | (0xF000 << 64))
_UUID4_SET = (0x8000 << 48) | (4 << 76)


def from_header(value: bytes) -> tuple[str, str]:
    """(request id, engine id prefix) for a client's header; InvalidRequestError if unfit."""
    text = value.decode("latin-1")
    if _VALID.fullmatch(text) is None:
        raise InvalidRequestError(
            f"X-Request-Id must be 1 to {MAX_LENGTH} characters of letters, digits and "
            "'-_.:@/+=~', starting with a letter or digit.",
            param="X-Request-Id",
        )
    return text, f"{text}-{uuid.uuid4().hex[:12]}"
