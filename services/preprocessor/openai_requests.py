"""OpenAI request bodies -> frozen request types: the `parse` stage of every endpoint.

`parse_chat_completion(body)` and `parse_completion(body)` decode the raw HTTP body with the
msgspec schema in openai_schema (types, required fields, ranges, unknown fields: one C pass)
and then check what spans fields. Every failure is an `InvalidRequestError` (400) with a
precise message, a stable code (`invalid_json`, `missing_field`, `invalid_type`,
`invalid_value`, `unknown_field`) and the offending `param` in OpenAI's dotted form
(`messages[0].content`). Absent sampling fields get OpenAI's defaults, except `top_k` and
`max_tokens` (None: not given; `check_context` bounds max_tokens once the prompt is known).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import msgspec

from . import openai_schema as schema
from .errors import (
    CONTEXT_LENGTH_EXCEEDED,
    INVALID_JSON,
    INVALID_TYPE,
    INVALID_VALUE,
    MISSING_FIELD,
    UNKNOWN_FIELD,
    InvalidRequestError,
)

MAX_STOP_STRINGS = 4


@dataclass(frozen=True, slots=True)
class SamplingOptions:
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float = 0.0
    min_tokens: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False


@dataclass(frozen=True, slots=True)
class ChatCompletionRequest:
    model: str
    # OpenAI-shaped message dicts (what the chat template renders).
    messages: tuple[dict[str, Any], ...]
    sampling: SamplingOptions
    stream: bool = False
    include_usage: bool = False
    user: str | None = None


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    model: str
    # Text to tokenize, or token ids given by the client.
    prompt: str | tuple[int, ...]
    sampling: SamplingOptions
    stream: bool = False
    include_usage: bool = False
    user: str | None = None


def parse_chat_completion(body: bytes) -> ChatCompletionRequest:
    raw: schema.ChatCompletionBody = _decode(schema.CHAT_DECODER, body)
    if raw.logprobs:
        raise _unsupported("logprobs", "'logprobs' is not supported by this server.")
    if raw.top_logprobs:
        raise _unsupported("top_logprobs", "'top_logprobs' is not supported by this server.")
    for i, message in enumerate(raw.messages):
        _text_only(message.content, f"messages[{i}].content")
    max_tokens = raw.max_completion_tokens or raw.max_tokens
    stream, include_usage = _stream(raw)
    return ChatCompletionRequest(
        raw.model,
        tuple(msgspec.to_builtins(raw.messages)),
        _sampling(raw, max_tokens),
        stream,
        include_usage,
        raw.user,
    )


def parse_completion(body: bytes) -> CompletionRequest:
    raw: schema.CompletionBody = _decode(schema.COMPLETION_DECODER, body)
    if raw.logprobs is True or (raw.logprobs and type(raw.logprobs) is int):
        raise _unsupported("logprobs", "'logprobs' is not supported by this server.")
    if raw.echo:
        raise _unsupported("echo", "'echo' is not supported by this server.")
    if raw.best_of is not None and raw.best_of != 1:
        raise _unsupported("best_of", "'best_of' must be 1: this server samples one sequence.")
    if raw.suffix:
        raise _unsupported("suffix", "'suffix' is not supported by this server.")
    stream, include_usage = _stream(raw)
    return CompletionRequest(
        raw.model,
        _prompt(raw.prompt),
        _sampling(raw, raw.max_tokens),
        stream,
        include_usage,
        raw.user,
    )


def check_context(
    prompt_len: int, max_tokens: int | None, context_length: int, param: str = "messages"
) -> int:
    """The effective max_tokens; 400 `context_length_exceeded` when the request cannot fit.

    `param` is "messages" for chat and "prompt" for completions (it also words the message).
    """
    where = "prompt" if param == "prompt" else "messages"
    if max_tokens is None:
        if prompt_len >= context_length:
            raise InvalidRequestError(
                f"This model's maximum context length is {context_length} tokens. However, "
                f"your {where} resulted in {prompt_len} tokens, which leaves no room for the "
                f"completion. Please reduce the length of the {where}.",
                CONTEXT_LENGTH_EXCEEDED,
                param,
            )
        return context_length - prompt_len
    if prompt_len >= context_length or prompt_len + max_tokens > context_length:
        raise InvalidRequestError(
            f"This model's maximum context length is {context_length} tokens. However, you "
            f"requested {prompt_len + max_tokens} tokens ({prompt_len} in the {where}, "
            f"{max_tokens} in the completion). Please reduce the length of the {where} or "
            "completion.",
            CONTEXT_LENGTH_EXCEEDED,
            param,
        )
    return max_tokens


# --- decoding and msgspec's errors in OpenAI's words ---------------------------------------

# msgspec: "<what> - at `$.messages[0].role`" (no suffix for the top level).
_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<field>[^`]*)`$")
_MISSING = re.compile(r"^Object missing required field `(?P<field>[^`]*)`$")
_EXPECTED = re.compile(r"^Expected `(?P<want>[^`]*)`, got `(?P<got>[^`]*)`$")


def _decode(decoder: msgspec.json.Decoder, body: bytes) -> Any:
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise _validation_error(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequestError(
            f"We could not parse the JSON body of your request: {exc}", INVALID_JSON
        ) from None


def _join(path: str, field: str) -> str:
    return f"{path}.{field}" if path else field


def _validation_error(text: str) -> InvalidRequestError:
    match = _AT.match(text)
    assert match is not None  # the pattern matches any string
    what = match["what"]
    path = (match["path"] or "").lstrip(".")
    if m := _UNKNOWN.match(what):
        param = _join(path, m["field"])
        return InvalidRequestError(
            f"Unrecognized request argument supplied: {param}", UNKNOWN_FIELD, param
        )
    if m := _MISSING.match(what):
        param = _join(path, m["field"])
        return InvalidRequestError(f"Missing required parameter: '{param}'.", MISSING_FIELD, param)
    if not path:
        return InvalidRequestError(f"The request body must be a JSON object: {what}.", INVALID_JSON)
    if m := _EXPECTED.match(what):
        return InvalidRequestError(
            f"Invalid type for '{path}': expected {m['want']}, but got {m['got']} instead.",
            INVALID_TYPE,
            path,
        )
    return InvalidRequestError(f"Invalid value for '{path}': {what}.", INVALID_VALUE, path)


# --- fields that span the schema -----------------------------------------------------------


def _stream(raw: schema._Sampling) -> tuple[bool, bool]:
    stream = bool(raw.stream)
    options = raw.stream_options
    if options is None or not options.include_usage:
        return stream, False
    # Ignored when not streaming: the non-streaming body always carries usage.
    return stream, stream


def _sampling(raw: schema._Sampling, max_tokens: int | None) -> SamplingOptions:
    if raw.n is not None and raw.n != 1:
        raise InvalidRequestError(
            f"'n' must be 1: this server returns a single choice per request (got {raw.n}).",
            INVALID_VALUE,
            "n",
        )
    min_tokens = raw.min_tokens or 0
    if max_tokens is not None and min_tokens > max_tokens:
        raise InvalidRequestError(
            f"'min_tokens' ({min_tokens}) must not exceed 'max_tokens' ({max_tokens}).",
            INVALID_VALUE,
            "min_tokens",
        )
    if raw.top_k == 0:
        raise InvalidRequestError(
            "Invalid value for 'top_k': expected -1 (disabled) or at least 1, got 0.",
            INVALID_VALUE,
            "top_k",
        )
    return SamplingOptions(
        max_tokens=max_tokens,
        temperature=_or(raw.temperature, 1.0),
        top_p=_or(raw.top_p, 1.0),
        top_k=raw.top_k,
        min_p=_or(raw.min_p, 0.0),
        min_tokens=min_tokens,
        seed=raw.seed,
        stop=_stop(raw.stop),
        presence_penalty=_or(raw.presence_penalty, 0.0),
        frequency_penalty=_or(raw.frequency_penalty, 0.0),
        repetition_penalty=_or(raw.repetition_penalty, 1.0),
        ignore_eos=bool(raw.ignore_eos),
    )


def _or(value: float | None, default: float) -> float:
    return default if value is None else float(value)


def _stop(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    if type(stop) is str:
        return (stop,) if stop else ()
    if len(stop) > MAX_STOP_STRINGS:
        raise InvalidRequestError(
            f"'stop' accepts at most {MAX_STOP_STRINGS} strings, got {len(stop)}.",
            INVALID_VALUE,
            "stop",
        )
    # Empty strings would match everywhere; they are dropped.
    return tuple(dict.fromkeys(s for s in stop if s))


def _prompt(prompt: str | list[Any]) -> str | tuple[int, ...]:
    if type(prompt) is str:
        if not prompt:
            raise InvalidRequestError("'prompt' must not be empty.", INVALID_VALUE, "prompt")
        return prompt
    first = prompt[0]
    if type(first) is int:
        for i, t in enumerate(prompt):
            if type(t) is not int:
                raise _mixed(f"prompt[{i}]")
        return tuple(prompt)
    if len(prompt) != 1:
        raise InvalidRequestError(
            f"'prompt' must hold exactly one prompt: batched prompts are not supported "
            f"(got {len(prompt)}).",
            INVALID_VALUE,
            "prompt",
        )
    if type(first) is str:
        if not first:
            raise InvalidRequestError("'prompt' must not be empty.", INVALID_VALUE, "prompt[0]")
        return first
    return tuple(first)


def _text_only(content: object, where: str) -> None:
    if type(content) is not list:
        return
    for j, part in enumerate(content):
        if type(part) is not schema.TextPart:
            kind = type(part).__struct_config__.tag
            raise InvalidRequestError(
                f"Content part type '{kind}' is not supported at '{where}[{j}].type': only "
                "'text' parts are accepted (the engines take token ids, not media).",
                INVALID_VALUE,
                f"{where}[{j}].type",
            )


def _mixed(param: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"Invalid value for '{param}': a list of token ids must hold only integers.",
        INVALID_TYPE,
        param,
    )


def _unsupported(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(message, INVALID_VALUE, param)
