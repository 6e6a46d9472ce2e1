"""The Anthropic Messages API request bodies (POST /v1/messages, /v1/messages/count_tokens)
as msgspec Structs.

As in openai_schema, every field a client may send is declared and an undeclared one is a
400 naming it. Content blocks and tools are decoded one by one (anthropic_requests), so a
block or tool of a type this server does not serve gets a "not supported" naming it rather
than a bad-tag error. Fields declared only to be refused unless neutral (container,
inference_geo, ...) are checked in anthropic_requests.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from .openai_schema import NonEmptyStr, PositiveInt32

_CONFIG = {"forbid_unknown_fields": True, "frozen": True, "kw_only": True}

ToolName = Annotated[str, Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")]


class CacheControl(Struct, **_CONFIG):  # type: ignore[call-arg]
    """A prompt-cache breakpoint: the engines cache every prompt's prefix by themselves."""

    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


# ---- content blocks -------------------------------------------------------------------------


class TextBlock(Struct, **_CONFIG):  # type: ignore[call-arg]
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    citations: list[Any] | None = None  # refused when not empty (nothing to cite here)


class ThinkingBlock(Struct, **_CONFIG):  # type: ignore[call-arg]
    """An earlier answer's thinking, passed back (its signature is not checked)."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None
    cache_control: CacheControl | None = None


class ToolUseBlock(Struct, **_CONFIG):  # type: ignore[call-arg]
    type: Literal["tool_use"]
    id: NonEmptyStr
    name: NonEmptyStr
    input: dict[str, Any]
    cache_control: CacheControl | None = None
    caller: dict[str, Any] | None = None  # how it was called: direct calls only here


class ToolResultBlock(Struct, **_CONFIG):  # type: ignore[call-arg]
    type: Literal["tool_result"]
    tool_use_id: NonEmptyStr
    content: str | list[Any] | None = None  # text blocks
    is_error: bool | None = None
    cache_control: CacheControl | None = None


# ---- tools, tool_choice, thinking, output_config ---------------------------------------------


class CustomTool(Struct, **_CONFIG):  # type: ignore[call-arg]
    name: ToolName
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    description: str | None = None
    cache_control: CacheControl | None = None
    strict: bool | None = None
    eager_input_streaming: bool | None = None  # arguments stream as the model writes them
    # Refused unless neutral (anthropic_requests says why).
    input_examples: list[Any] | None = None
    defer_loading: bool | None = None
    allowed_callers: list[Any] | None = None


class ToolChoice(Struct, **_CONFIG):  # type: ignore[call-arg]
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingEnabled(Struct, tag_field="type", tag="enabled", **_CONFIG):  # type: ignore[call-arg]
    budget_tokens: Annotated[int, Meta(ge=1024, le=2**31 - 1)]
    display: Literal["summarized", "omitted"] | None = None


class ThinkingAdaptive(Struct, tag_field="type", tag="adaptive", **_CONFIG):  # type: ignore[call-arg]
    display: Literal["summarized", "omitted"] | None = None


class ThinkingDisabled(Struct, tag_field="type", tag="disabled", **_CONFIG):  # type: ignore[call-arg]
    pass


Thinking = ThinkingEnabled | ThinkingAdaptive | ThinkingDisabled


class JsonOutputFormat(Struct, **_CONFIG):  # type: ignore[call-arg]
    type: Literal["json_schema"]
    schema: dict[str, Any]


class OutputConfig(Struct, **_CONFIG):  # type: ignore[call-arg]
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: JsonOutputFormat | None = None


class Metadata(Struct, **_CONFIG):  # type: ignore[call-arg]
    user_id: Annotated[str, Meta(max_length=256)] | None = None


class MessageParam(Struct, **_CONFIG):  # type: ignore[call-arg]
    role: Literal["user", "assistant"]
    content: str | list[Any]  # blocks: see anthropic_requests


# ---- the bodies ------------------------------------------------------------------------------


class _Prompt(Struct, **_CONFIG):  # type: ignore[call-arg]
    """What makes the prompt: shared by /v1/messages and /v1/messages/count_tokens."""

    model: NonEmptyStr
    messages: Annotated[list[MessageParam], Meta(min_length=1)]
    system: str | list[Any] | None = None  # text blocks
    tools: Annotated[list[Any], Meta(max_length=128)] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    cache_control: CacheControl | None = None
    # Refused unless neutral (anthropic_requests).
    speed: Literal["standard", "fast"] | None = None
    context_management: dict[str, Any] | None = None
    mcp_servers: list[Any] | None = None
    user_profile_id: str | None = None
    workspace_id: str | None = None


class MessagesBody(_Prompt, **_CONFIG):  # type: ignore[call-arg]
    max_tokens: PositiveInt32  # type: ignore[misc]  # required; fields are keyword-only
    stop_sequences: Annotated[list[str], Meta(max_length=64)] | None = None
    stream: bool | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Meta(ge=1, le=2**31 - 1)] | None = None
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    # Refused unless neutral (anthropic_requests).
    container: str | dict[str, Any] | None = None
    diagnostics: dict[str, Any] | None = None
    inference_geo: str | None = None


class CountTokensBody(_Prompt, **_CONFIG):  # type: ignore[call-arg]
    pass


MESSAGES_DECODER = msgspec.json.Decoder(MessagesBody)
COUNT_TOKENS_DECODER = msgspec.json.Decoder(CountTokensBody)
