"""POST /v1/responses bodies -> a `ResponsesRequest`: the parse stage of the Responses API.

A Responses request is carried through the chat stages as its chat-completions equivalent
(a `ChatCompletionRequest`), plus `shown`, the request's parameters as the response object
echoes them. The mapping:

    instructions                    a system message first
    input (string)                  one user message
    message items                   messages of that role (input_text / output_text / refusal
                                    parts joined into one text, as chat joins text parts)
    function_call items             the assistant message's tool_calls (consecutive calls, and a
                                    call right after an assistant message, share one message)
    function_call_output items      tool messages (tool_call_id = call_id)
    reasoning items                 reasoning_content of the assistant message that follows,
                                    for templates that render it (most drop it)
    tools (flat function shape)     chat's nested {"type": "function", "function": {...}}
    tool_choice {type, name}        chat's {"type": "function", "function": {"name"}}
    max_output_tokens               max_tokens
    text.format                     the engine constraint response_format would give
    reasoning.effort                the template's reasoning_effort (refused if it has none)

`store` (true unless false), `previous_response_id` and `conversation` are carried as they
came: stages/stored.py reads the stored context before the first engine call and keeps the
response at its end. Fields that cannot take effect here are refused with a 400 naming
them: background, include, truncation "auto", prompt, top_logprobs, max_tool_calls,
reasoning.summary, text.verbosity, stream_options.include_obfuscation, media parts,
encrypted reasoning, and tools / tool_choice of any type but function. Errors of later
stages name chat's fields; `responses_error` renames them for the client.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from switchyard.protos.messages import CONSTRAINT_JSON_OBJECT, CONSTRAINT_JSON_SCHEMA, Constraint

from . import openai_schema
from . import responses_schema as schema
from .chat_template import PART_SEPARATOR
from .errors import (
    INVALID_TYPE,
    INVALID_VALUE,
    UNSUPPORTED_VALUE,
    InvalidRequestError,
    RequestError,
    renamed,
)
from .openai_requests import (
    ChatCompletionRequest,
    SamplingOptions,
    _decode,
    _tool_choice,
    convert_at,
    free_json_text,
)


@dataclass(frozen=True, slots=True)
class ResponsesRequest(ChatCompletionRequest):
    # The request's parameters as the response object shows them (instructions, tools,
    # tool_choice, temperature, ...).
    shown: dict[str, Any] = field(default_factory=dict)
    # State (stages/stored.py): keep the response (OpenAI's default), continue an earlier
    # one, or a conversation. `input` is the body's, for the items kept; the stored context
    # goes into `messages` after the instructions (`head`: 1 with instructions, else 0).
    store: bool | None = None  # None: absent (true in OpenAI's API)
    previous_response_id: str | None = None
    conversation: str | None = None
    input: str | list[Any] = ""
    head: int = 0


def parse_responses(body: bytes) -> ResponsesRequest:
    raw: schema.ResponsesBody = _decode(schema.RESPONSES_DECODER, body)
    _refused_fields(raw)
    conversation = _conversation_id(raw)
    messages: list[dict[str, Any]] = []
    if raw.instructions:
        messages.append({"role": "system", "content": raw.instructions})
    if isinstance(raw.input, str):
        messages.append({"role": "user", "content": raw.input})
    else:
        messages += input_messages(raw.input)
    defs = [_function_def(t, i) for i, t in enumerate(raw.tools or ())]
    tools = tuple(_chat_tool(t) for t in defs)
    tool_choice = _chat_tool_choice(raw.tool_choice, tools)
    parallel = True if raw.parallel_tool_calls is None else raw.parallel_tool_calls
    kwargs: dict[str, Any] = {}
    effort = raw.reasoning.effort if raw.reasoning is not None else None
    if effort is not None:
        kwargs["reasoning_effort"] = effort
    fmt = raw.text.format if raw.text is not None else None
    sampling = SamplingOptions(
        max_tokens=raw.max_output_tokens,
        temperature=1.0 if raw.temperature is None else float(raw.temperature),
        top_p=1.0 if raw.top_p is None else float(raw.top_p),
        constraint=_constraint(fmt),
        constraint_param="text.format",
    )
    shown = {
        "instructions": raw.instructions,
        "max_output_tokens": raw.max_output_tokens,
        "metadata": dict(raw.metadata or {}),
        "parallel_tool_calls": parallel,
        "reasoning": {"effort": effort, "summary": None},
        "service_tier": raw.service_tier or "auto",
        "temperature": sampling.temperature,
        "text": {"format": msgspec.to_builtins(fmt) if fmt is not None else {"type": "text"}},
        "tool_choice": raw.tool_choice if raw.tool_choice is not None else "auto",
        "tools": [msgspec.to_builtins(t) for t in defs],
        "top_p": sampling.top_p,
        "user": raw.user,
    }
    return ResponsesRequest(
        raw.model,
        tuple(messages),
        sampling,
        bool(raw.stream),
        False,
        raw.prompt_cache_key or raw.safety_identifier or raw.user,  # the session key
        tools,
        tool_choice,
        parallel,
        template_kwargs=kwargs,
        priority=raw.priority,
        shown=shown,
        store=raw.store,
        previous_response_id=raw.previous_response_id,
        conversation=conversation,
        input=raw.input,
        head=1 if raw.instructions else 0,
    )


# --- what cannot take effect here -------------------------------------------------------------


def _conversation_id(raw: schema.ResponsesBody) -> str | None:
    """`conversation` as an id or {"id": ...}; it needs the turn kept, and excludes
    previous_response_id (as in OpenAI's API)."""
    value = raw.conversation
    if value is None:
        return None
    if isinstance(value, dict):
        value = value.get("id") if set(value) == {"id"} else None
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(
            "'conversation' must be a conversation id or {\"id\": <id>}.",
            INVALID_VALUE,
            "conversation",
        )
    if raw.previous_response_id is not None:
        raise InvalidRequestError(
            "'previous_response_id' and 'conversation' cannot be used together.",
            INVALID_VALUE,
            "conversation",
        )
    if raw.store is False:
        raise InvalidRequestError(
            "A response in a conversation is kept with it: 'store' cannot be false.",
            INVALID_VALUE,
            "store",
        )
    return value


def _refused_fields(raw: schema.ResponsesBody) -> None:
    if raw.background:
        raise _unsupported(
            "background", "'background' responses need storage, which this server has not."
        )
    if raw.include:
        raise _unsupported(
            "include", f"'include' {raw.include[0]!r} is not offered by this server."
        )
    if raw.truncation == "auto":
        raise _unsupported(
            "truncation",
            "truncation 'auto' is not offered: an input too long for the context is a 400.",
        )
    if raw.prompt is not None:
        raise _unsupported("prompt", "Stored prompt templates ('prompt') are not offered here.")
    if raw.top_logprobs:
        raise _unsupported("top_logprobs", "'top_logprobs' is not offered on /v1/responses.")
    if raw.max_tool_calls is not None:
        raise _unsupported(
            "max_tool_calls", "'max_tool_calls' is for built-in tools, which this server has not."
        )
    if raw.service_tier not in (None, "auto", "default"):
        raise _unsupported(
            "service_tier", f"service_tier {raw.service_tier!r} is not offered by this server."
        )
    options = raw.stream_options
    if options is not None and options.include_obfuscation:
        raise _unsupported(
            "stream_options.include_obfuscation",
            "Stream obfuscation is not offered by this server.",
        )
    reasoning = raw.reasoning
    if reasoning is not None:
        for name in ("summary", "generate_summary"):
            if getattr(reasoning, name) is not None:
                raise _unsupported(
                    f"reasoning.{name}",
                    "Reasoning summaries are not offered: the reasoning text itself is in the "
                    "reasoning item's content.",
                )
    if raw.text is not None and raw.text.verbosity is not None:
        raise _unsupported("text.verbosity", "'text.verbosity' is not offered by this server.")


def _unsupported(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(message, UNSUPPORTED_VALUE, param)


# --- input items -> chat messages ----------------------------------------------------------------


def _text(parts: str | list[Any], where: str) -> str:
    if isinstance(parts, str):
        return parts
    texts = []
    for j, part in enumerate(parts):
        if isinstance(part, schema.MEDIA_PARTS):
            kind = type(part).__struct_config__.tag
            raise InvalidRequestError(
                f"Content part type '{kind}' is not supported at '{where}[{j}].type': only "
                "text parts are accepted (the engines take token ids, not media).",
                UNSUPPORTED_VALUE,
                f"{where}[{j}].type",
            )
        texts.append(part.refusal if type(part) is schema.Refusal else part.text)
    return PART_SEPARATOR.join(texts)


def input_messages(items: list[Any], base: str = "input") -> list[dict[str, Any]]:
    """Input items -> chat messages (400s name the item as `base[i]`)."""
    messages: list[dict[str, Any]] = []
    reasoning: str | None = None  # a reasoning item's text, for the next assistant message
    names: dict[str, str] = {}  # call_id -> function name
    last_assistant: dict[str, Any] | None = None  # the message a function_call joins
    for i, item in enumerate(items):
        where = f"{base}[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequestError(
                f"Invalid type for '{where}': expected an object.", INVALID_TYPE, where
            )
        kind = item.get("type", "message")
        if kind == "message":
            msg = convert_at(item, schema.MessageItem, where)
            message: dict[str, Any] = {
                "role": msg.role,
                "content": _text(msg.content, f"{where}.content"),
            }
            last_assistant = None
            if msg.role == "assistant":
                if reasoning is not None:
                    message["reasoning_content"] = reasoning
                    reasoning = None
                last_assistant = message
            messages.append(message)
        elif kind == "function_call":
            call = convert_at(item, schema.FunctionCallItem, where)
            names[call.call_id] = call.name
            if last_assistant is None:
                last_assistant = {"role": "assistant"}
                if reasoning is not None:
                    last_assistant["reasoning_content"] = reasoning
                    reasoning = None
                messages.append(last_assistant)
            last_assistant.setdefault("tool_calls", []).append(
                {
                    "type": "function",
                    "id": call.call_id,
                    "function": {"name": call.name, "arguments": call.arguments},
                }
            )
        elif kind == "function_call_output":
            out = convert_at(item, schema.FunctionCallOutputItem, where)
            tool: dict[str, Any] = {
                "role": "tool",
                "content": _text(out.output, f"{where}.output"),
                "tool_call_id": out.call_id,
            }
            if out.call_id in names:
                tool["name"] = names[out.call_id]
            messages.append(tool)
            last_assistant = None
        elif kind == "reasoning":
            thought = convert_at(item, schema.ReasoningItem, where)
            if thought.encrypted_content is not None:
                raise _unsupported(
                    f"{where}.encrypted_content",
                    "Encrypted reasoning cannot be read here: pass the reasoning item as this "
                    "server returned it (its text in 'content').",
                )
            parts = thought.content or ()
            reasoning = PART_SEPARATOR.join(p.text for p in parts) if parts else None
        else:
            raise InvalidRequestError(
                f"Input items of type {kind!r} are not supported at '{where}.type': messages, "
                "function_call, function_call_output and reasoning items are.",
                UNSUPPORTED_VALUE,
                f"{where}.type",
            )
    return messages


# --- tools, tool_choice, text.format ------------------------------------------------------------


def _function_def(raw: Any, i: int) -> schema.FunctionToolDef:
    where = f"tools[{i}]"
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind != "function":
        if not isinstance(raw, dict) or not isinstance(kind, str):
            raise InvalidRequestError(
                f"'{where}' must be an object with a 'type'.", INVALID_VALUE, f"{where}.type"
            )
        raise InvalidRequestError(
            f"Tools of type {kind!r} are not supported at '{where}.type': only 'function' "
            "tools, which the client runs, are offered here.",
            UNSUPPORTED_VALUE,
            f"{where}.type",
        )
    tool: schema.FunctionToolDef = convert_at(raw, schema.FunctionToolDef, where)
    free_json_text(tool.parameters, f"{where}.parameters")  # the response object echoes it
    return tool


def _chat_tool(tool: schema.FunctionToolDef) -> dict[str, Any]:
    """A flat Responses function tool -> chat's nested shape."""
    function: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        function["description"] = tool.description
    if tool.parameters is not None:
        function["parameters"] = tool.parameters
    if tool.strict is not None:
        function["strict"] = tool.strict
    return {"type": "function", "function": function}


def _chat_tool_choice(
    choice: str | dict[str, Any] | None, tools: tuple[dict[str, Any], ...]
) -> str | dict[str, Any] | None:
    if not isinstance(choice, dict):
        return _tool_choice(choice, tools)
    kind = choice.get("type")
    if kind != "function":
        raise InvalidRequestError(
            f"tool_choice of type {kind!r} is not supported: use 'none', 'auto', 'required' "
            'or {"type": "function", "name": ...}.',
            UNSUPPORTED_VALUE,
            "tool_choice",
        )
    name = choice.get("name")
    extra = set(choice) - {"type", "name"}
    if not isinstance(name, str) or not name or extra:
        raise InvalidRequestError(
            'tool_choice must be {"type": "function", "name": <a function in tools>}.',
            INVALID_VALUE,
            "tool_choice",
        )
    named = openai_schema.NamedToolChoice(function=openai_schema.NamedFunction(name=name))
    return _tool_choice(named, tools)


def _constraint(
    fmt: schema.TextFormat | schema.JsonObjectFormat | schema.JsonSchemaFormat | None,
) -> Constraint | None:
    """text.format -> the constraint chat's response_format gives."""
    if type(fmt) is schema.JsonObjectFormat:
        return Constraint(kind=CONSTRAINT_JSON_OBJECT)
    if type(fmt) is schema.JsonSchemaFormat:
        value = free_json_text(fmt.schema, "text.format.schema")
        return Constraint(kind=CONSTRAINT_JSON_SCHEMA, value=value)
    return None


# --- errors of the shared stages, in this API's words ---------------------------------------------

# chat's field -> the Responses field it came from
_RENAMED = {
    "messages": "input",
    "reasoning_effort": "reasoning.effort",
    "max_tokens": "max_output_tokens",
}
_WORDS = (("your messages", "your input"), ("the messages", "the input"))


def responses_error(err: RequestError) -> RequestError:
    """A shared stage's error naming a chat field, renamed to the Responses field."""
    return renamed(err, _RENAMED, _WORDS)
