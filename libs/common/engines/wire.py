"""What both engine families share on the wire: integer bounds of proto fields, and the logprob
messages (OutputLogProbs / InputLogProbs have the same shape in both protos).

A value a proto field cannot hold raises EngineError kind bad_request naming the field, before
anything is sent: proto would otherwise refuse it with a bare ValueError, or wrap it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from switchyard.common import errors
from switchyard.common.errors import EngineError
from switchyard.protos.messages import PromptLogprobs, TokenLogprobs

INT32_MAX = (1 << 31) - 1
UINT32_MAX = (1 << 32) - 1


def refuse(field: str, message: str) -> EngineError:
    return EngineError(errors.BAD_REQUEST, f"{field}: {message}")


def int32(field: str, value: int) -> int:
    if not -INT32_MAX - 1 <= value <= INT32_MAX:
        raise refuse(field, f"{value} does not fit the engine's int32 field")
    return value


def uint32(field: str, value: int) -> int:
    if not 0 <= value <= UINT32_MAX:
        raise refuse(field, f"{value} does not fit the engine's uint32 field")
    return value


def uint32s(field: str, values: Iterable[int]) -> list[int]:
    out = list(values)
    for value in out:
        if not 0 <= value <= UINT32_MAX:
            raise refuse(field, f"{value} does not fit the engine's uint32 field")
    return out


def output_logprobs(message: Any, count: int, top: int) -> TokenLogprobs:
    """OutputLogProbs of `count` tokens as TokenLogprobs, alternatives cut to `top` per token.
    A message that does not cover the tokens is the engine's fault (engine_error)."""
    values = list(message.token_logprobs)
    if len(values) != count:
        raise EngineError(
            errors.ENGINE_ERROR,
            f"the engine sent {len(values)} logprobs for {count} tokens",
        )
    if top <= 0 or not message.top_logprobs:
        return TokenLogprobs(values)
    rows = message.top_logprobs
    return TokenLogprobs(
        values,
        [list(row.token_ids[:top]) for row in rows],
        [list(row.values[:top]) for row in rows],
    )


def prompt_logprobs(message: Any, top: int) -> PromptLogprobs:
    """InputLogProbs as PromptLogprobs (the first token's value unset: None)."""
    values = [entry.value if entry.HasField("value") else None for entry in message.token_logprobs]
    if top <= 0 or not message.top_logprobs:
        return PromptLogprobs(values)
    rows = message.top_logprobs
    return PromptLogprobs(
        values,
        [list(row.token_ids[:top]) for row in rows],
        [list(row.values[:top]) for row in rows],
    )
