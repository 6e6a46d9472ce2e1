"""OpenAI request bodies -> frozen request types, validated by hand.

`parse_chat_completion(body)` and `parse_completion(body)` take the raw HTTP body and raise
`InvalidRequestError` (400) with a precise message, a stable code (`invalid_json`,
`missing_field`, `invalid_value`) and the offending `param`. Unknown keys are ignored.
Absent sampling fields get OpenAI's defaults, except `top_k` and `max_tokens` (None: not
given; the app bounds max_tokens with `check_context` once it knows the prompt length).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import orjson

from .errors import (
    CONTEXT_LENGTH_EXCEEDED,
    INVALID_JSON,
    INVALID_VALUE,
    MISSING_FIELD,
    InvalidRequestError,
)

CHAT_ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})
MAX_STOP_STRINGS = 4
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class SamplingOptions:
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    min_tokens: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    # A string, or the texts of a list of text parts (the chat template joins them).
    content: str | tuple[str, ...]
    name: str | None = None
    tool_call_id: str | None = None


@dataclass(frozen=True, slots=True)
class ChatCompletionRequest:
    model: str
    messages: tuple[ChatMessage, ...]
    sampling: SamplingOptions
    stream: bool = False
    include_usage: bool = False
    user: str | None = None  # the router's session key (sticks a conversation to a worker)


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
    obj = _load_object(body)
    model = _model(obj)
    messages = _messages(obj)
    _reject_logprobs_chat(obj)
    max_tokens = _opt_int(obj, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _opt_int(obj, "max_tokens", 1)
    stream, include_usage = _stream(obj)
    return ChatCompletionRequest(
        model, messages, _sampling(obj, max_tokens), stream, include_usage, _opt_str(obj, "user")
    )


def parse_completion(body: bytes) -> CompletionRequest:
    obj = _load_object(body)
    model = _model(obj)
    prompt = _prompt(obj)
    _reject_completion_extras(obj)
    max_tokens = _opt_int(obj, "max_tokens", 1)
    stream, include_usage = _stream(obj)
    return CompletionRequest(
        model, prompt, _sampling(obj, max_tokens), stream, include_usage, _opt_str(obj, "user")
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


# --- the body and its top-level fields ---------------------------------------------------


def _load_object(body: bytes) -> dict[str, Any]:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequestError(
            f"We could not parse the JSON body of your request: {exc}", INVALID_JSON
        ) from None
    if type(obj) is not dict:
        raise InvalidRequestError(
            f"The request body must be a JSON object, got {_json_type(obj)}.", INVALID_JSON
        )
    return obj


def _model(obj: dict[str, Any]) -> str:
    model = obj.get("model")
    if model is None:
        raise _missing("model")
    if type(model) is not str or not model:
        raise _invalid("model", "a non-empty string", model)
    return model


def _stream(obj: dict[str, Any]) -> tuple[bool, bool]:
    stream = _opt_bool(obj, "stream", False)
    options = obj.get("stream_options")
    if options is None:
        return stream, False
    if type(options) is not dict:
        raise _invalid("stream_options", "an object", options)
    include_usage = options.get("include_usage")
    if include_usage is None:
        return stream, False
    if type(include_usage) is not bool:
        raise _invalid("stream_options.include_usage", "a boolean", include_usage)
    # Ignored when not streaming: the non-streaming body always carries usage.
    return stream, include_usage and stream


def _sampling(obj: dict[str, Any], max_tokens: int | None) -> SamplingOptions:
    n = obj.get("n")
    if n is not None:
        if type(n) is not int:
            raise _invalid("n", "an integer", n)
        if n != 1:
            raise InvalidRequestError(
                f"'n' must be 1: this server returns a single choice per request (got {n}).",
                INVALID_VALUE,
                "n",
            )
    min_tokens = _opt_int(obj, "min_tokens", 0)
    if min_tokens is None:
        min_tokens = 0
    if max_tokens is not None and min_tokens > max_tokens:
        raise InvalidRequestError(
            f"'min_tokens' ({min_tokens}) must not exceed 'max_tokens' ({max_tokens}).",
            INVALID_VALUE,
            "min_tokens",
        )
    top_k = obj.get("top_k")
    if top_k is not None:
        if type(top_k) is not int or not (top_k == -1 or top_k >= 1):
            raise _invalid("top_k", "an integer, -1 (disabled) or at least 1", top_k)
    seed = obj.get("seed")
    if seed is not None and (type(seed) is not int or not _INT64_MIN <= seed <= _INT64_MAX):
        raise _invalid("seed", "a 64-bit signed integer", seed)
    return SamplingOptions(
        max_tokens=max_tokens,
        temperature=_opt_float(obj, "temperature", 0.0, 2.0, 1.0),
        top_p=_opt_float(obj, "top_p", 0.0, 1.0, 1.0, exclusive_low=True),
        top_k=top_k,
        min_tokens=min_tokens,
        seed=seed,
        stop=_stop(obj),
        presence_penalty=_opt_float(obj, "presence_penalty", -2.0, 2.0, 0.0),
        frequency_penalty=_opt_float(obj, "frequency_penalty", -2.0, 2.0, 0.0),
        repetition_penalty=_opt_float(
            obj, "repetition_penalty", 0.0, None, 1.0, exclusive_low=True
        ),
        ignore_eos=_opt_bool(obj, "ignore_eos", False),
    )


def _stop(obj: dict[str, Any]) -> tuple[str, ...]:
    stop = obj.get("stop")
    if stop is None:
        return ()
    if type(stop) is str:
        return (stop,) if stop else ()
    if type(stop) is not list:
        raise _invalid("stop", "a string or a list of strings", stop)
    if len(stop) > MAX_STOP_STRINGS:
        raise InvalidRequestError(
            f"'stop' accepts at most {MAX_STOP_STRINGS} strings, got {len(stop)}.",
            INVALID_VALUE,
            "stop",
        )
    for i, s in enumerate(stop):
        if type(s) is not str:
            raise _invalid(f"stop[{i}]", "a string", s)
    # Empty strings would match everywhere; they are dropped.
    return tuple(dict.fromkeys(s for s in stop if s))


# --- chat messages -----------------------------------------------------------------------


def _messages(obj: dict[str, Any]) -> tuple[ChatMessage, ...]:
    messages = obj.get("messages")
    if messages is None:
        raise _missing("messages")
    if type(messages) is not list:
        raise _invalid("messages", "a list of messages", messages)
    if not messages:
        raise InvalidRequestError(
            "'messages' must contain at least one message.", INVALID_VALUE, "messages"
        )
    return tuple(_message(m, i) for i, m in enumerate(messages))


def _message(m: Any, i: int) -> ChatMessage:
    where = f"messages[{i}]"
    if type(m) is not dict:
        raise _invalid(where, "an object", m)
    role = m.get("role")
    if role is None:
        raise _missing(f"{where}.role")
    if role not in CHAT_ROLES:
        raise _invalid(f"{where}.role", "one of " + ", ".join(sorted(CHAT_ROLES)), role)
    content = m.get("content")
    if content is None:
        # An assistant turn may carry only tool_calls; every other role needs content.
        if role != "assistant":
            raise _missing(f"{where}.content")
        content = ""
    elif type(content) is list:
        content = _text_parts(content, f"{where}.content")
    elif type(content) is not str:
        raise _invalid(f"{where}.content", "a string or a list of content parts", content)
    name = m.get("name")
    if name is not None and type(name) is not str:
        raise _invalid(f"{where}.name", "a string", name)
    tool_call_id = m.get("tool_call_id")
    if tool_call_id is not None and type(tool_call_id) is not str:
        raise _invalid(f"{where}.tool_call_id", "a string", tool_call_id)
    return ChatMessage(role, content, name, tool_call_id)


def _text_parts(parts: list[Any], where: str) -> tuple[str, ...]:
    texts = []
    for j, part in enumerate(parts):
        at = f"{where}[{j}]"
        if type(part) is not dict:
            raise _invalid(at, "a content part object", part)
        kind = part.get("type")
        if kind is None:
            raise _missing(f"{at}.type")
        if kind != "text":
            raise InvalidRequestError(
                f"Content part type {_short(kind)} is not supported at '{at}.type': "
                "only 'text' parts are accepted by this server.",
                INVALID_VALUE,
                f"{at}.type",
            )
        text = part.get("text")
        if text is None:
            raise _missing(f"{at}.text")
        if type(text) is not str:
            raise _invalid(f"{at}.text", "a string", text)
        texts.append(text)
    return tuple(texts)


def _reject_logprobs_chat(obj: dict[str, Any]) -> None:
    logprobs = obj.get("logprobs")
    if logprobs is not None and type(logprobs) is not bool:
        raise _invalid("logprobs", "a boolean", logprobs)
    if logprobs:
        raise _unsupported("logprobs", "'logprobs' is not supported by this server.")
    top_logprobs = obj.get("top_logprobs")
    if top_logprobs is not None and top_logprobs != 0:
        raise _unsupported("top_logprobs", "'top_logprobs' is not supported by this server.")


# --- completion prompt -------------------------------------------------------------------


def _prompt(obj: dict[str, Any]) -> str | tuple[int, ...]:
    prompt = obj.get("prompt")
    if prompt is None:
        raise _missing("prompt")
    if type(prompt) is str:
        if not prompt:
            raise InvalidRequestError("'prompt' must not be empty.", INVALID_VALUE, "prompt")
        return prompt
    if type(prompt) is not list:
        raise _invalid("prompt", "a string, a list of token ids, or a list of one of those", prompt)
    if not prompt:
        raise InvalidRequestError("'prompt' must not be empty.", INVALID_VALUE, "prompt")
    first = prompt[0]
    if type(first) is int:
        return _token_ids(prompt, "prompt")
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
    if type(first) is list:
        if not first:
            raise InvalidRequestError("'prompt' must not be empty.", INVALID_VALUE, "prompt[0]")
        return _token_ids(first, "prompt[0]")
    raise _invalid("prompt[0]", "a string or a list of token ids", first)


def _token_ids(ids: list[Any], where: str) -> tuple[int, ...]:
    for i, t in enumerate(ids):
        if type(t) is not int or t < 0:
            raise _invalid(f"{where}[{i}]", "a non-negative integer token id", t)
    return tuple(ids)


def _reject_completion_extras(obj: dict[str, Any]) -> None:
    logprobs = obj.get("logprobs")
    if logprobs is not None and logprobs is not False:
        raise _unsupported("logprobs", "'logprobs' is not supported by this server.")
    if obj.get("echo"):
        raise _unsupported("echo", "'echo' is not supported by this server.")
    best_of = obj.get("best_of")
    if best_of is not None and best_of != 1:
        raise _unsupported("best_of", "'best_of' must be 1: this server samples one sequence.")
    if obj.get("suffix"):
        raise _unsupported("suffix", "'suffix' is not supported by this server.")


# --- scalar helpers ----------------------------------------------------------------------


def _opt_int(obj: dict[str, Any], key: str, minimum: int) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if type(value) is not int:
        raise _invalid(key, f"an integer of at least {minimum}", value)
    if value < minimum:
        raise _invalid(key, f"an integer of at least {minimum}", value)
    return value


def _opt_float(
    obj: dict[str, Any],
    key: str,
    low: float,
    high: float | None,
    default: float,
    exclusive_low: bool = False,
) -> float:
    value = obj.get(key)
    if value is None:
        return default
    t = type(value)
    if t is not float and t is not int:
        raise _invalid(key, _range_text(low, high, exclusive_low), value)
    number = float(value)
    if (
        not math.isfinite(number)
        or number < low
        or (exclusive_low and number == low)
        or (high is not None and number > high)
    ):
        raise _invalid(key, _range_text(low, high, exclusive_low), value)
    return number


def _opt_str(obj: dict[str, Any], key: str) -> str | None:
    value = obj.get(key)
    if value is None:
        return None
    if type(value) is not str:
        raise _invalid(key, "a string", value)
    return value


def _opt_bool(obj: dict[str, Any], key: str, default: bool) -> bool:
    value = obj.get(key)
    if value is None:
        return default
    if type(value) is not bool:
        raise _invalid(key, "a boolean", value)
    return value


def _range_text(low: float, high: float | None, exclusive_low: bool) -> str:
    if high is None:
        return f"a number greater than {low:g}" if exclusive_low else f"a number >= {low:g}"
    if exclusive_low:
        return f"a number greater than {low:g} and at most {high:g}"
    return f"a number between {low:g} and {high:g}"


def _missing(param: str) -> InvalidRequestError:
    return InvalidRequestError(f"Missing required field '{param}'.", MISSING_FIELD, param)


def _invalid(param: str, expected: str, got: Any) -> InvalidRequestError:
    return InvalidRequestError(
        f"Invalid value for '{param}': expected {expected}, got {_short(got)}.",
        INVALID_VALUE,
        param,
    )


def _unsupported(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(message, INVALID_VALUE, param)


def _short(value: Any) -> str:
    text = orjson.dumps(value).decode()
    return text if len(text) <= 60 else text[:57] + "..."


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if type(value) is bool:
        return "a boolean"
    if type(value) is list:
        return "an array"
    if type(value) is str:
        return "a string"
    return "a number"
