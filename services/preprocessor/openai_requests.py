"""OpenAI request bodies -> frozen request types: the `parse` stage of every endpoint.

`parse_chat_completion(body)` and `parse_completion(body)` decode the raw HTTP body with the
msgspec schema in openai_schema (types, required fields, ranges, unknown fields: one C pass)
and then check what spans fields. Every failure is an `InvalidRequestError` (400) with a
precise message, a stable code (`invalid_json`, `missing_field`, `invalid_type`,
`invalid_value`, `unknown_field`, `unsupported_value`) and the offending `param` in OpenAI's
dotted form (`messages[0].content`). Absent sampling fields get OpenAI's defaults, except
`top_k` and `max_tokens` (None: not given; `check_context` bounds max_tokens once the prompt is
known). A field is either carried into the request types here or refused with a 400 naming
it: nothing is accepted and dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson

from switchyard.protos.messages import (
    CONSTRAINT_CHOICE,
    CONSTRAINT_EBNF,
    CONSTRAINT_JSON_OBJECT,
    CONSTRAINT_JSON_SCHEMA,
    CONSTRAINT_REGEX,
    CONSTRAINT_STRUCTURAL_TAG,
    Constraint,
)

from . import openai_schema as schema
from .errors import (
    CONTEXT_LENGTH_EXCEEDED,
    INVALID_JSON,
    INVALID_TYPE,
    INVALID_VALUE,
    MISSING_FIELD,
    UNKNOWN_FIELD,
    UNSUPPORTED_VALUE,
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
    stop_token_ids: tuple[int, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()
    n: int = 1
    skip_special_tokens: bool = True
    constraint: Constraint | None = None  # from response_format or the engine extras
    constraint_param: str = ""  # the field it came from (for errors)
    max_tokens_param: str = "max_tokens"  # the field max_tokens came from (for errors)


@dataclass(frozen=True, slots=True)
class ChatCompletionRequest:
    model: str
    # OpenAI-shaped message dicts (what the chat template renders).
    messages: tuple[dict[str, Any], ...]
    sampling: SamplingOptions
    stream: bool = False
    include_usage: bool = False
    # The router's session key (sticks a conversation to a worker): prompt_cache_key, else
    # safety_identifier, else user.
    user: str | None = None
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str | dict[str, Any] | None = None  # None: "auto" with tools, else "none"
    parallel_tool_calls: bool = True
    logprobs: bool = False
    top_logprobs: int = 0
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    separate_reasoning: bool = True
    priority: int | None = None  # vLLM's field: flow control's priority (stages/admit)


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    model: str
    # The prompts: text to tokenize, or token ids given by the client; several = a batch.
    prompts: tuple[str | tuple[int, ...], ...]
    sampling: SamplingOptions
    stream: bool = False
    include_usage: bool = False
    user: str | None = None
    echo: bool = False
    logprobs: int | None = None  # top alternatives per token (0: the chosen token's only)
    best_of: int = 1  # candidates per prompt; the n with the highest logprob sum are returned
    priority: int | None = None  # vLLM's field: flow control's priority (stages/admit)

    @property
    def prompt(self) -> str | tuple[int, ...]:
        return self.prompts[0]


@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    model: str
    inputs: tuple[str | tuple[int, ...], ...]
    base64: bool = False
    dimensions: int | None = None
    user: str | None = None
    sampling: SamplingOptions = SamplingOptions()  # unused: the stages read max_tokens None
    stream: bool = False
    priority: int | None = None  # vLLM's field: flow control's priority (stages/admit)


def parse_embeddings(body: bytes) -> EmbeddingRequest:
    raw: schema.EmbeddingsBody = _decode(schema.EMBEDDINGS_DECODER, body)
    try:
        inputs = _prompts(raw.input, schema.MAX_EMBED_BATCH)
    except InvalidRequestError as exc:
        param = (exc.param or "").replace("prompt", "input", 1)
        raise InvalidRequestError(
            exc.message.replace("'prompt'", "'input'"), exc.code, param
        ) from None
    return EmbeddingRequest(
        raw.model,
        inputs,
        raw.encoding_format == "base64",
        raw.dimensions,
        raw.user,
        priority=raw.priority,
    )


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    """What a chat prompt is rendered from (chat completions, and /tokenize's messages)."""

    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...]
    template_kwargs: dict[str, Any]
    add_generation_prompt: bool
    continue_final_message: bool


def chat_prompt(
    messages: list[schema.Message],
    tools: list[schema.FunctionTool] | None,
    chat_template_kwargs: dict[str, Any] | None,
    add_generation_prompt: bool | None,
    continue_final_message: bool | None,
) -> ChatPrompt:
    """The prompt fields checked (text parts only, free JSON bounded, the generation prompt
    and continue_final_message consistent) and turned into the template's inputs."""
    for i, message in enumerate(messages):
        _text_only(message.content, f"messages[{i}].content")
    builtins = tuple(msgspec.to_builtins(tools)) if tools else ()
    for i, tool in enumerate(builtins):
        free_json_text(tool["function"].get("parameters"), f"tools[{i}].function.parameters")
    generation_prompt = True if add_generation_prompt is None else add_generation_prompt
    if continue_final_message:
        if add_generation_prompt:
            raise InvalidRequestError(
                "'continue_final_message' and 'add_generation_prompt' cannot both be true.",
                INVALID_VALUE,
                "continue_final_message",
            )
        if type(messages[-1]) is not schema.AssistantMessage:
            raise InvalidRequestError(
                "'continue_final_message' needs an assistant message last.",
                INVALID_VALUE,
                "continue_final_message",
            )
        generation_prompt = False
    kwargs = dict(chat_template_kwargs or {})
    if kwargs:
        free_json_text(kwargs, "chat_template_kwargs")
    return ChatPrompt(
        tuple(msgspec.to_builtins(messages)),
        builtins,
        kwargs,
        generation_prompt,
        bool(continue_final_message),
    )


def parse_chat_completion(body: bytes) -> ChatCompletionRequest:
    raw: schema.ChatCompletionBody = _decode(schema.CHAT_DECODER, body)
    prompt = chat_prompt(
        raw.messages,
        raw.tools,
        raw.chat_template_kwargs,
        raw.add_generation_prompt,
        raw.continue_final_message,
    )
    _no_effect_fields(raw)
    if raw.top_logprobs and not raw.logprobs:
        raise InvalidRequestError(
            "'top_logprobs' requires 'logprobs' to be true.", INVALID_VALUE, "top_logprobs"
        )
    tools = prompt.tools
    if not tools:
        _needs_tools(raw)
    tool_choice = _tool_choice(raw.tool_choice, tools)
    kwargs = prompt.template_kwargs
    if raw.reasoning_effort is not None:
        kwargs["reasoning_effort"] = raw.reasoning_effort
    max_tokens = raw.max_completion_tokens or raw.max_tokens
    max_param = "max_completion_tokens" if raw.max_completion_tokens else "max_tokens"
    stream, include_usage = _stream(raw)
    return ChatCompletionRequest(
        raw.model,
        prompt.messages,
        _sampling(raw, max_tokens, max_param),
        stream,
        include_usage,
        # The router's session key: the client's cache key, else its end-user identifiers.
        raw.prompt_cache_key or raw.safety_identifier or raw.user,
        tools,
        tool_choice,
        True if raw.parallel_tool_calls is None else raw.parallel_tool_calls,
        bool(raw.logprobs),
        raw.top_logprobs or 0,
        kwargs,
        prompt.add_generation_prompt,
        prompt.continue_final_message,
        True if raw.separate_reasoning is None else raw.separate_reasoning,
        priority=raw.priority,
    )


def parse_completion(body: bytes) -> CompletionRequest:
    raw: schema.CompletionBody = _decode(schema.COMPLETION_DECODER, body)
    _no_effect_fields(raw)
    if raw.suffix:
        raise _unsupported("suffix", "'suffix' is not supported: the engines do no infilling.")
    stream, include_usage = _stream(raw)
    sampling = _sampling(raw, raw.max_tokens)
    best_of = raw.best_of or sampling.n
    if best_of < sampling.n:
        raise InvalidRequestError(
            f"'best_of' ({best_of}) must be at least 'n' ({sampling.n}).", INVALID_VALUE, "best_of"
        )
    if best_of > sampling.n and stream:
        raise InvalidRequestError(
            "'best_of' greater than 'n' cannot be streamed: the best are known only at the end.",
            INVALID_VALUE,
            "best_of",
        )
    return CompletionRequest(
        raw.model,
        _prompts(raw.prompt),
        sampling,
        stream,
        include_usage,
        raw.user,
        bool(raw.echo),
        raw.logprobs,
        best_of,
        priority=raw.priority,
    )


def check_max_tokens(max_tokens: int | None, context_length: int, param: str) -> None:
    """400 naming the max_tokens field when the completion alone cannot fit (a prompt has at
    least one token): checked before tokenizing, whose early refusal would blame the prompt."""
    if max_tokens is not None and max_tokens >= context_length:
        raise InvalidRequestError(
            f"'{param}' is too large: {max_tokens}. This model's maximum context length is "
            f"{context_length} tokens, prompt and completion together, so the completion can "
            f"have at most {context_length - 1}.",
            CONTEXT_LENGTH_EXCEEDED,
            param,
        )


def check_context(
    prompt_len: int, max_tokens: int | None, context_length: int, param: str = "messages"
) -> int:
    """The effective max_tokens; 400 `context_length_exceeded` when the request cannot fit.

    `param` is "messages" for chat and "prompt" for completions (it also words the message).
    """
    where = "prompt" if param.startswith("prompt") else "messages"
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

# msgspec: "<what> - at `$.messages[0].role`" (no suffix for the top level; "- at `key` in
# `$.logit_bias`" for an object's key; "[...]" stands for a value under any key).
_AT = re.compile(r"^(?P<what>.*?)(?: - at (?:`key` in )?`\$(?P<path>[^`]*)`)?$", re.S)
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
    except RecursionError:  # msgspec decodes nested values recursively
        raise InvalidRequestError(
            "We could not parse the JSON body of your request: it is nested too deeply.",
            INVALID_JSON,
        ) from None


def convert_at(value: Any, kind: type, where: str) -> Any:
    """One part of a body (a content block, a tool) decoded into its Struct, errors named
    from the body's root (`where`: its path there)."""
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        text = str(exc)
        if "`$" in text:
            text = text.replace("`$", f"`$.{where}", 1)
        else:
            text += f" - at `$.{where}`"
        raise _validation_error(text) from None


def _join(path: str, field: str) -> str:
    return f"{path}.{field}" if path else field


def _validation_error(text: str) -> InvalidRequestError:
    match = _AT.match(text)
    assert match is not None  # the pattern matches any string
    what = match["what"]
    path = (match["path"] or "").lstrip(".").replace("[...]", "")
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


def _no_effect_fields(raw: schema._Sampling) -> None:
    """OpenAI fields that only their neutral value can honour here."""
    if raw.service_tier not in (None, "auto", "default"):
        raise _unsupported(
            "service_tier", f"service_tier {raw.service_tier!r} is not offered by this server."
        )
    if raw.store:
        raise _unsupported("store", "'store' must be false: this server stores no completions.")
    if raw.metadata:
        raise _unsupported(
            "metadata", "'metadata' is kept with stored completions, which this server has not."
        )


def _stream(raw: schema._Sampling) -> tuple[bool, bool]:
    stream = bool(raw.stream)
    options = raw.stream_options
    if options is None:
        return stream, False
    if not stream:  # as OpenAI and vLLM: the options of a stream that is not there
        raise InvalidRequestError(
            "'stream_options' is only allowed when 'stream' is true.",
            INVALID_VALUE,
            "stream_options",
        )
    return stream, bool(options.include_usage)


def _sampling(
    raw: schema._Sampling, max_tokens: int | None, max_param: str = "max_tokens"
) -> SamplingOptions:
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
    constraint, constraint_param = _constraint(raw)
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
        stop_token_ids=tuple(dict.fromkeys(raw.stop_token_ids or ())),
        logit_bias=tuple((int(k), float(v)) for k, v in (raw.logit_bias or {}).items()),
        n=raw.n or 1,
        skip_special_tokens=True if raw.skip_special_tokens is None else raw.skip_special_tokens,
        constraint=constraint,
        constraint_param=constraint_param,
        max_tokens_param=max_param,
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


# A request's free-form JSON values (JSON schemas, tool parameters, template kwargs, tags) are
# written again as JSON, by orjson, inside larger documents: the engine's constraint, the
# Responses object that echoes its tools. orjson writes at most 254 levels, so such a value
# may nest at most MAX_FREE_JSON_DEPTH levels (real schemas nest a few dozen at most).
MAX_FREE_JSON_DEPTH = 128
_ORJSON_DEPTH = 254
_WRAP = _ORJSON_DEPTH - MAX_FREE_JSON_DEPTH


def free_json_text(value: Any, param: str) -> str:
    """`value` as JSON text, or a 400 naming `param` when it cannot be passed on: nested more
    than MAX_FREE_JSON_DEPTH levels, or holding an integer beyond 64 bits."""
    wrapped = value
    for _ in range(_WRAP):  # written under _WRAP arrays, it fails past the allowed depth
        wrapped = (wrapped,)
    try:
        text = orjson.dumps(wrapped)
    except orjson.JSONEncodeError as exc:
        if "ecursion" in str(exc):
            why = f"is nested more than {MAX_FREE_JSON_DEPTH} levels deep"
        else:
            why = f"cannot be passed on ({exc})"
        raise InvalidRequestError(f"'{param}' {why}.", INVALID_VALUE, param) from None
    return text[_WRAP:-_WRAP].decode()


def _json_text(value: dict[str, Any] | str, param: str) -> str:
    if isinstance(value, str):
        try:
            parsed = orjson.loads(value)
        except orjson.JSONDecodeError:
            raise InvalidRequestError(
                f"'{param}' must be a JSON schema (an object, or its JSON text).",
                INVALID_VALUE,
                param,
            ) from None
        if not isinstance(parsed, dict):
            raise InvalidRequestError(f"'{param}' must be a JSON object.", INVALID_VALUE, param)
        return value
    return free_json_text(value, param)


def _constraint(raw: schema._Sampling) -> tuple[Constraint | None, str]:
    """The one structured-output constraint the request asks for, and the field it came from."""
    found: list[tuple[str, Constraint]] = []
    fmt = raw.response_format
    if type(fmt) is schema.JsonObjectFormat:
        found.append(("response_format", Constraint(kind=CONSTRAINT_JSON_OBJECT)))
    elif type(fmt) is schema.JsonSchemaFormat:
        spec = fmt.json_schema
        schema_param = "response_format.json_schema.schema"
        value = free_json_text(spec.schema if spec.schema is not None else {}, schema_param)
        found.append(("response_format", Constraint(kind=CONSTRAINT_JSON_SCHEMA, value=value)))
    if raw.regex is not None:
        found.append(("regex", Constraint(kind=CONSTRAINT_REGEX, value=raw.regex)))
    if raw.ebnf is not None:
        found.append(("ebnf", Constraint(kind=CONSTRAINT_EBNF, value=raw.ebnf)))
    if raw.guided_json is not None:
        value = _json_text(raw.guided_json, "guided_json")
        found.append(("guided_json", Constraint(kind=CONSTRAINT_JSON_SCHEMA, value=value)))
    if raw.guided_regex is not None:
        found.append(("guided_regex", Constraint(kind=CONSTRAINT_REGEX, value=raw.guided_regex)))
    if raw.guided_choice is not None:
        choices = list(raw.guided_choice)
        found.append(("guided_choice", Constraint(kind=CONSTRAINT_CHOICE, choices=choices)))
    if raw.guided_grammar is not None:
        found.append(("guided_grammar", Constraint(kind=CONSTRAINT_EBNF, value=raw.guided_grammar)))
    so = raw.structured_outputs
    if so is not None:
        inner: list[tuple[str, Constraint]] = []
        if so.json is not None:
            value = _json_text(so.json, "structured_outputs.json")
            inner.append(("json", Constraint(kind=CONSTRAINT_JSON_SCHEMA, value=value)))
        if so.regex is not None:
            inner.append(("regex", Constraint(kind=CONSTRAINT_REGEX, value=so.regex)))
        if so.choice is not None:
            inner.append(("choice", Constraint(kind=CONSTRAINT_CHOICE, choices=list(so.choice))))
        if so.grammar is not None:
            inner.append(("grammar", Constraint(kind=CONSTRAINT_EBNF, value=so.grammar)))
        if so.structural_tag is not None:
            tag = so.structural_tag
            tag_param = "structured_outputs.structural_tag"
            value = tag if isinstance(tag, str) else free_json_text(tag, tag_param)
            inner.append(
                ("structural_tag", Constraint(kind=CONSTRAINT_STRUCTURAL_TAG, value=value))
            )
        if so.json_object:
            inner.append(("json_object", Constraint(kind=CONSTRAINT_JSON_OBJECT)))
        if len(inner) != 1:
            raise InvalidRequestError(
                "'structured_outputs' takes exactly one of json, regex, choice, grammar, "
                f"structural_tag, json_object (got {len(inner)}).",
                INVALID_VALUE,
                "structured_outputs",
            )
        found.append((f"structured_outputs.{inner[0][0]}", inner[0][1]))
    if not found:
        return None, ""
    if len(found) > 1:
        names = ", ".join(param for param, _ in found)
        raise InvalidRequestError(
            f"A request takes one structured-output constraint; got {names}.",
            INVALID_VALUE,
            found[1][0],
        )
    param, constraint = found[0]
    return constraint, param


def _needs_tools(raw: schema.ChatCompletionBody) -> None:
    """tool_choice (other than "none") and parallel_tool_calls without tools are refused, as
    OpenAI does (and vLLM for tool_choice): they would have nothing to act on."""
    if raw.tool_choice is not None and raw.tool_choice != "none":
        raise InvalidRequestError(
            "'tool_choice' is only allowed when 'tools' are specified.",
            INVALID_VALUE,
            "tool_choice",
        )
    if raw.parallel_tool_calls is not None:
        raise InvalidRequestError(
            "'parallel_tool_calls' is only allowed when 'tools' are specified.",
            INVALID_VALUE,
            "parallel_tool_calls",
        )


def _tool_choice(
    choice: str | schema.NamedToolChoice | None, tools: tuple[dict[str, Any], ...]
) -> str | dict[str, Any] | None:
    if choice is None:
        return None
    if isinstance(choice, str):
        if choice in ("required",) and not tools:
            raise InvalidRequestError(
                'tool_choice "required" needs at least one tool in "tools".',
                INVALID_VALUE,
                "tool_choice",
            )
        return choice
    name = choice.function.name
    if name not in {t["function"]["name"] for t in tools}:
        raise InvalidRequestError(
            f"tool_choice names the function {name!r}, which is not in 'tools'.",
            INVALID_VALUE,
            "tool_choice",
        )
    return msgspec.to_builtins(choice)


def _prompts(
    prompt: str | list[Any], max_batch: int = schema.MAX_BATCH
) -> tuple[str | tuple[int, ...], ...]:
    if type(prompt) is str:
        if not prompt:
            raise InvalidRequestError("'prompt' must not be empty.", INVALID_VALUE, "prompt")
        return (prompt,)
    first = prompt[0]
    if type(first) is int:
        for i, t in enumerate(prompt):
            if type(t) is not int:
                raise _mixed(f"prompt[{i}]", "a list of token ids must hold only integers")
        return (tuple(prompt),)
    if len(prompt) > max_batch:
        raise InvalidRequestError(
            f"'prompt' holds {len(prompt)} prompts; at most {max_batch} go in one request.",
            INVALID_VALUE,
            "prompt",
        )
    kind = type(first)
    out: list[str | tuple[int, ...]] = []
    for i, item in enumerate(prompt):
        if type(item) is not kind:
            raise _mixed(f"prompt[{i}]", "a batch holds only strings or only token id lists")
        if not item:
            raise InvalidRequestError("'prompt' must not be empty.", INVALID_VALUE, f"prompt[{i}]")
        out.append(item if isinstance(item, str) else tuple(item))
    return tuple(out)


def _mixed(param: str, what: str) -> InvalidRequestError:
    return InvalidRequestError(f"Invalid value for '{param}': {what}.", INVALID_TYPE, param)


def _text_only(content: object, where: str) -> None:
    if type(content) is not list:
        return
    for j, part in enumerate(content):
        if type(part) is not schema.TextPart:
            kind = type(part).__struct_config__.tag
            raise InvalidRequestError(
                f"Content part type '{kind}' is not supported at '{where}[{j}].type': only "
                "'text' parts are accepted (the engines take token ids, not media).",
                UNSUPPORTED_VALUE,
                f"{where}[{j}].type",
            )


def _unsupported(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(message, UNSUPPORTED_VALUE, param)
