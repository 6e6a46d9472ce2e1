"""POST /v1/messages and /v1/messages/count_tokens bodies -> a `MessagesRequest`: the parse
stage of the Anthropic Messages API.

A Messages request is carried through the chat stages as its chat-completions equivalent
(`MessagesRequest` is a `ChatCompletionRequest`), plus what only this API has (thinking).
The mapping:

    system (string or text blocks)      a system message first
    user text blocks                    a user message (consecutive texts joined)
    user tool_result blocks             tool messages (tool_call_id = tool_use_id; text
                                        content; is_error: the text after "Error: ")
    assistant text / thinking /         one assistant message: content, reasoning_content
      tool_use blocks                   (templates that render it), tool_calls (input as
                                        JSON arguments)
    a last assistant message            prefill: the answer continues its text
                                        (continue_final_message)
    tools (custom: input_schema)        chat's {"type": "function", "function": {...}}
    tool_choice auto / any / tool /     auto / required / a named function / none;
      none; disable_parallel_tool_use   parallel_tool_calls false
    max_tokens, stop_sequences,         max_tokens, stop (matched by the frontend: the
      temperature, top_p, top_k         answer's stop_reason "stop_sequence" names it)
    metadata.user_id                    the router's session key
    output_config.effort                the template's reasoning_effort (refused if unread)
    output_config.format                the JSON-schema engine constraint
    thinking                            the model's thinking switch (stages.messages)
    cache_control (anywhere)            accepted: the engines cache every prompt's prefix

As in Anthropic's API, a tool_use is answered by a tool_result in the next message and a
tool_result answers a tool_use of the message before it (`_paired`): else a 400.

Refused with a 400 naming them: image, document and other media or server-tool blocks,
redacted_thinking, citations, server tools (bash, web search, ...), input_examples,
defer_loading, allowed_callers, thinking.display "summarized" (no summarizer here),
container, diagnostics, inference_geo, speed "fast", context_management, mcp_servers,
user_profile_id, workspace_id. Errors are rendered in Anthropic's shape at the edge
(`anthropic_error`); errors of the shared stages name chat's fields, renamed here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from switchyard.protos.messages import CONSTRAINT_JSON_SCHEMA, Constraint

from . import anthropic_schema as schema
from . import openai_schema
from .chat_template import PART_SEPARATOR
from .errors import (
    INVALID_VALUE,
    MISSING_FIELD,
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

THINKING_ON = ("enabled", "adaptive")
ERROR_PREFIX = "Error: "  # a tool_result with is_error, as the model reads it


@dataclass(frozen=True, slots=True)
class MessagesRequest(ChatCompletionRequest):
    # The thinking block's type (enabled / adaptive / disabled), None: the model's default.
    thinking: str | None = None
    thinking_omitted: bool = False  # display "omitted": thinking blocks come empty


def parse_messages(body: bytes) -> MessagesRequest:
    raw: schema.MessagesBody = _decode(schema.MESSAGES_DECODER, body)
    for name in ("container", "diagnostics", "inference_geo"):
        if getattr(raw, name) is not None:
            raise _unsupported(name, f"'{name}' is not offered by this server.")
    stops = raw.stop_sequences or []
    for i, stop in enumerate(stops):
        if not stop:
            raise InvalidRequestError(
                "A stop sequence must not be empty.", INVALID_VALUE, f"stop_sequences[{i}]"
            )
    thinking = raw.thinking
    if type(thinking) is schema.ThinkingEnabled and thinking.budget_tokens >= raw.max_tokens:
        raise InvalidRequestError(
            f"'thinking.budget_tokens' ({thinking.budget_tokens}) must be less than "
            f"'max_tokens' ({raw.max_tokens}): thinking counts toward max_tokens.",
            INVALID_VALUE,
            "thinking.budget_tokens",
        )
    fmt = raw.output_config.format if raw.output_config is not None else None
    sampling = SamplingOptions(
        max_tokens=raw.max_tokens,
        temperature=1.0 if raw.temperature is None else float(raw.temperature),
        top_p=1.0 if raw.top_p is None else float(raw.top_p),
        top_k=raw.top_k,
        stop=tuple(dict.fromkeys(stops)),
        constraint=(
            Constraint(
                kind=CONSTRAINT_JSON_SCHEMA,
                value=free_json_text(fmt.schema, "output_config.format.schema"),
            )
            if fmt is not None
            else None
        ),
        constraint_param="output_config.format",
    )
    user = raw.metadata.user_id if raw.metadata is not None else None
    return _request(raw, sampling, bool(raw.stream), user)


def parse_count_tokens(body: bytes) -> MessagesRequest:
    """count_tokens: the prompt /v1/messages would render, nothing to sample."""
    raw: schema.CountTokensBody = _decode(schema.COUNT_TOKENS_DECODER, body)
    return _request(raw, SamplingOptions(), False, None)


def _request(
    raw: schema._Prompt, sampling: SamplingOptions, stream: bool, user: str | None
) -> MessagesRequest:
    _refused(raw)
    messages: list[dict[str, Any]] = []
    if raw.system:
        messages.append({"role": "system", "content": _text(raw.system, "system")})
    messages += _messages(raw.messages)
    prefill = raw.messages[-1].role == "assistant"
    if prefill and (messages[-1].get("tool_calls") or not messages[-1].get("content")):
        raise InvalidRequestError(
            "A last assistant message is a prefill the answer continues: it must hold text "
            "and no tool_use (a tool_use is answered with a user tool_result).",
            INVALID_VALUE,
            f"messages[{len(raw.messages) - 1}].content",
        )
    tools = tuple(_tool(t, i) for i, t in enumerate(raw.tools or ()))
    tool_choice, parallel = _tool_choice_of(raw.tool_choice, tools)
    kwargs: dict[str, Any] = {}
    effort = raw.output_config.effort if raw.output_config is not None else None
    if effort is not None:
        kwargs["reasoning_effort"] = effort
    thinking = raw.thinking
    display = getattr(thinking, "display", None)
    if display == "summarized":
        raise _unsupported(
            "thinking.display",
            "thinking.display 'summarized' is not offered: this server has no summarizer. "
            "Leave 'display' out for the full thinking, or use 'omitted'.",
        )
    return MessagesRequest(
        raw.model,
        tuple(messages),
        sampling,
        stream,
        False,
        user,  # the router's session key
        tools,
        tool_choice,
        parallel,
        template_kwargs=kwargs,
        add_generation_prompt=not prefill,
        continue_final_message=prefill,
        thinking=_THINKING.get(type(thinking)),
        thinking_omitted=display == "omitted",
    )


_THINKING: dict[type, str] = {
    schema.ThinkingEnabled: "enabled",
    schema.ThinkingAdaptive: "adaptive",
    schema.ThinkingDisabled: "disabled",
}


# --- what cannot take effect here -------------------------------------------------------------


def _refused(raw: schema._Prompt) -> None:
    if raw.speed == "fast":
        raise _unsupported("speed", "speed 'fast' is not offered by this server.")
    for name in ("context_management", "mcp_servers", "user_profile_id", "workspace_id"):
        if getattr(raw, name) is not None:
            raise _unsupported(name, f"'{name}' is not offered by this server.")


def _unsupported(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(message, UNSUPPORTED_VALUE, param)


# --- content blocks -> chat messages ----------------------------------------------------------

_MEDIA = {"image", "document", "search_result", "container_upload"}


def _block(value: Any, where: str) -> tuple[str, Any]:
    """A content block's type and its Struct; a 400 for any type not served here."""
    kind = value.get("type") if isinstance(value, dict) else None
    known = {
        "text": schema.TextBlock,
        "thinking": schema.ThinkingBlock,
        "tool_use": schema.ToolUseBlock,
        "tool_result": schema.ToolResultBlock,
    }.get(kind)  # type: ignore[arg-type]
    if known is not None:
        return kind, convert_at(value, known, where)  # type: ignore[return-value]
    if not isinstance(kind, str):
        raise InvalidRequestError(
            f"'{where}' must be a content block: an object with a 'type'.",
            INVALID_VALUE,
            f"{where}.type",
        )
    if kind in _MEDIA:
        why = "the engines' gRPC APIs here take token ids, not media"
    elif kind == "redacted_thinking":
        why = "redacted thinking is opaque and cannot be given to this model"
    else:
        why = "server tools and their results are not offered here"
    raise _unsupported(
        f"{where}.type",
        f"Content blocks of type {kind!r} are not supported at '{where}.type' ({why}): "
        "text, thinking, tool_use and tool_result blocks are.",
    )


def _text(value: str | list[Any], where: str) -> str:
    """A string, or text blocks joined (as chat joins text parts)."""
    if isinstance(value, str):
        return value
    texts = []
    for j, item in enumerate(value):
        kind, block = _block(item, f"{where}[{j}]")
        if kind != "text":
            raise _unsupported(
                f"{where}[{j}].type",
                f"Only text blocks are accepted at '{where}', not {kind!r}.",
            )
        texts.append(_plain(block, f"{where}[{j}]"))
    return PART_SEPARATOR.join(texts)


def _plain(block: schema.TextBlock, where: str) -> str:
    if block.citations:
        raise _unsupported(f"{where}.citations", "Citations are not offered by this server.")
    return block.text


def _messages(raw: list[schema.MessageParam]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool_use id -> tool name, for the tool messages
    for i, message in enumerate(raw):
        where = f"messages[{i}].content"
        if isinstance(message.content, str):
            out.append({"role": message.role, "content": message.content})
        elif not message.content:
            raise InvalidRequestError(
                f"'{where}' must not be empty.", MISSING_FIELD, f"messages[{i}].content"
            )
        elif message.role == "user":
            out += _user(message.content, where, names)
        else:
            out.append(_assistant(message.content, where, names))
        _paired(raw, i)  # its blocks are valid now
    return out


def _ids(message: schema.MessageParam, kind: str, key: str) -> list[tuple[int, Any]]:
    """(block index, id) of the message's blocks of one kind (an id is not checked here)."""
    if isinstance(message.content, str):
        return []
    return [
        (j, b.get(key))
        for j, b in enumerate(message.content)
        if isinstance(b, dict) and b.get("type") == kind
    ]


def _paired(raw: list[schema.MessageParam], i: int) -> None:
    """As Anthropic's API: the tool_use blocks of an assistant message are answered by
    tool_result blocks in the next message, and a tool_result answers a tool_use of the
    message before it. (A lone last assistant message is a prefill, refused with tool_use.)"""
    message = raw[i]
    before = raw[i - 1] if i > 0 and raw[i - 1].role == "assistant" else None
    asked = {u for _, u in _ids(before, "tool_use", "id")} if before is not None else set()
    answered = _ids(message, "tool_result", "tool_use_id") if message.role == "user" else []
    for j, use_id in answered:
        if use_id not in asked:
            raise InvalidRequestError(
                f"Unexpected `tool_use_id` found in `tool_result` blocks: {use_id}. Each "
                "`tool_result` block must have a corresponding `tool_use` block in the "
                "previous message.",
                INVALID_VALUE,
                f"messages[{i}].content[{j}].tool_use_id",
            )
    missing = sorted(asked - {u for _, u in answered})
    if missing:
        raise InvalidRequestError(
            f"`tool_use` ids were found without `tool_result` blocks immediately after: "
            f"{', '.join(map(str, missing))}. Each `tool_use` block must have a corresponding "
            "`tool_result` block in the next message.",
            INVALID_VALUE,
            f"messages[{i}].content",
        )


def _user(blocks: list[Any], where: str, names: dict[str, str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, item in enumerate(blocks):
        at = f"{where}[{j}]"
        kind, block = _block(item, at)
        if kind == "text":
            texts.append(_plain(block, at))
        elif kind == "tool_result":
            if texts:
                out.append({"role": "user", "content": PART_SEPARATOR.join(texts)})
                texts = []
            content = _text(block.content or "", f"{at}.content")
            if block.is_error:
                content = ERROR_PREFIX + content
            tool: dict[str, Any] = {
                "role": "tool",
                "content": content,
                "tool_call_id": block.tool_use_id,
            }
            if block.tool_use_id in names:
                tool["name"] = names[block.tool_use_id]
            out.append(tool)
        else:
            raise _unsupported(
                f"{at}.type", f"A user message holds text and tool_result blocks, not {kind!r}."
            )
    if texts:
        out.append({"role": "user", "content": PART_SEPARATOR.join(texts)})
    return out


def _assistant(blocks: list[Any], where: str, names: dict[str, str]) -> dict[str, Any]:
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, item in enumerate(blocks):
        at = f"{where}[{j}]"
        kind, block = _block(item, at)
        if kind == "text":
            texts.append(_plain(block, at))
        elif kind == "thinking":
            thoughts.append(block.thinking)
        elif kind == "tool_use":
            if block.caller is not None and block.caller.get("type") != "direct":
                raise _unsupported(f"{at}.caller", "Only direct tool calls are offered here.")
            names[block.id] = block.name
            arguments = free_json_text(block.input, f"{at}.input")
            calls.append(
                {
                    "type": "function",
                    "id": block.id,
                    "function": {"name": block.name, "arguments": arguments},
                }
            )
        else:
            raise _unsupported(
                f"{at}.type",
                f"An assistant message holds text, thinking and tool_use blocks, not {kind!r}.",
            )
    message: dict[str, Any] = {"role": "assistant"}
    if texts or not calls:
        message["content"] = PART_SEPARATOR.join(texts)
    if thoughts:
        message["reasoning_content"] = PART_SEPARATOR.join(thoughts)
    if calls:
        message["tool_calls"] = calls
    return message


# --- tools and tool_choice ----------------------------------------------------------------------


def _tool(raw: Any, i: int) -> dict[str, Any]:
    where = f"tools[{i}]"
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind not in (None, "custom"):
        if not isinstance(raw, dict) or not isinstance(kind, str):
            raise InvalidRequestError(
                f"'{where}' must be a tool object.", INVALID_VALUE, f"{where}.type"
            )
        raise _unsupported(
            f"{where}.type",
            f"Tools of type {kind!r} are not supported at '{where}.type': only custom tools "
            "(name, description, input_schema), which the client runs, are offered here.",
        )
    tool: schema.CustomTool = convert_at(raw, schema.CustomTool, where)
    if tool.input_examples:
        raise _unsupported(f"{where}.input_examples", "'input_examples' is not offered here.")
    if tool.defer_loading:
        raise _unsupported(f"{where}.defer_loading", "Tool search (defer_loading) is not offered.")
    if tool.allowed_callers is not None:
        raise _unsupported(
            f"{where}.allowed_callers", "Only direct tool calls are offered: no allowed_callers."
        )
    free_json_text(tool.input_schema, f"{where}.input_schema")
    function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
    if tool.description is not None:
        function["description"] = tool.description
    if tool.strict is not None:
        function["strict"] = tool.strict
    return {"type": "function", "function": function}


def _tool_choice_of(
    choice: schema.ToolChoice | None, tools: tuple[dict[str, Any], ...]
) -> tuple[str | dict[str, Any] | None, bool]:
    """Chat's tool_choice and parallel_tool_calls."""
    if choice is None:
        return None, True
    parallel = not choice.disable_parallel_tool_use
    if not tools and (choice.type in ("any", "tool") or choice.disable_parallel_tool_use):
        raise InvalidRequestError(
            f"tool_choice {choice.type!r} needs 'tools'.", INVALID_VALUE, "tool_choice"
        )
    if choice.type == "tool":
        if not choice.name:
            raise InvalidRequestError(
                "tool_choice 'tool' needs the tool's 'name'.", MISSING_FIELD, "tool_choice.name"
            )
        named = openai_schema.NamedToolChoice(
            function=openai_schema.NamedFunction(name=choice.name)
        )
        return _tool_choice(named, tools), parallel
    if choice.name is not None:
        raise InvalidRequestError(
            "'tool_choice.name' goes with type 'tool'.", INVALID_VALUE, "tool_choice.name"
        )
    if not tools:
        return None, True
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type], parallel


# --- errors in Anthropic's words ----------------------------------------------------------------

# chat's field -> the Messages API field it came from
_RENAMED = {
    "reasoning_effort": "output_config.effort",
    "stop": "stop_sequences",
    "chat_template_kwargs": "thinking",
    "continue_final_message": "messages",
    "response_format": "output_config.format",
}
# status -> (Anthropic's status, error type)
_STATUS = {
    400: (400, "invalid_request_error"),
    401: (401, "authentication_error"),
    403: (403, "permission_error"),
    404: (404, "not_found_error"),
    405: (405, "invalid_request_error"),
    413: (413, "request_too_large"),
    415: (415, "invalid_request_error"),
    429: (429, "rate_limit_error"),
    503: (529, "overloaded_error"),  # retry later (the SDK retries 529)
    504: (504, "timeout_error"),
}


class AnthropicError(RequestError):
    """A request's error as the Messages API shapes it: `{"type": "error", "error": {"type",
    "message"}}` with Anthropic's status (an unavailable or overloaded engine set is 529
    overloaded_error); the message names the field."""

    def body(self) -> bytes:
        return orjson.dumps(
            {"type": "error", "error": {"type": self.type, "message": self.message}}
        )


def anthropic_error(err: RequestError) -> AnthropicError:
    if isinstance(err, AnthropicError):
        return err
    err = renamed(err, _RENAMED)
    status, kind = _STATUS.get(err.status, (500, "api_error") if err.status >= 500 else (
        err.status, "invalid_request_error"))  # fmt: skip
    message = err.message
    if err.param and err.param not in message:
        message = f"{err.param}: {message}"
    return AnthropicError(status, message, kind, err.code, err.param)
