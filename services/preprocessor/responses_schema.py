"""The Responses API request body (POST /v1/responses) as msgspec Structs.

As in openai_schema, every field a client may send is declared and an undeclared one is a
400 naming it. `input` items and `tools` are decoded one by one (responses_requests), since
a message item may come without its `type` tag and a tool of another type deserves a
"not supported" rather than a bad-tag error. Fields declared only to be refused by name
(background, include, ...) are checked in responses_requests.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from .openai_schema import Int32, NonEmptyStr, PositiveInt32, Temperature, TopP

_CONFIG = {"forbid_unknown_fields": True, "frozen": True, "omit_defaults": True, "kw_only": True}
Status = Literal["in_progress", "completed", "incomplete"]


# ---- content parts ------------------------------------------------------------------------


class InputText(Struct, tag_field="type", tag="input_text", **_CONFIG):  # type: ignore[call-arg]
    text: str


class OutputText(Struct, tag_field="type", tag="output_text", **_CONFIG):  # type: ignore[call-arg]
    """An earlier answer's text, passed back (its annotations and logprobs are not read)."""

    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class Refusal(Struct, tag_field="type", tag="refusal", **_CONFIG):  # type: ignore[call-arg]
    refusal: str


# Media parts are declared so that they get a clear "not supported": the engines' gRPC APIs
# here take token ids only.
class InputImage(Struct, tag_field="type", tag="input_image", **_CONFIG):  # type: ignore[call-arg]
    detail: str | None = None
    image_url: str | None = None
    file_id: str | None = None


class InputFile(Struct, tag_field="type", tag="input_file", **_CONFIG):  # type: ignore[call-arg]
    file_id: str | None = None
    file_data: str | None = None
    file_url: str | None = None
    filename: str | None = None
    detail: str | None = None


class InputAudio(Struct, tag_field="type", tag="input_audio", **_CONFIG):  # type: ignore[call-arg]
    input_audio: dict[str, Any] | None = None


Part = InputText | OutputText | Refusal | InputImage | InputFile | InputAudio
MEDIA_PARTS = (InputImage, InputFile, InputAudio)


# ---- input items ----------------------------------------------------------------------------


class MessageItem(Struct, **_CONFIG):  # type: ignore[call-arg]
    role: Literal["user", "system", "developer", "assistant"]
    content: str | Annotated[list[Part], Meta(min_length=1)]
    type: Literal["message"] | None = None
    # Set on an earlier output passed back; they label it and change nothing in the prompt.
    id: str | None = None
    status: Status | None = None
    phase: Literal["commentary", "final_answer"] | None = None


class FunctionCallItem(Struct, **_CONFIG):  # type: ignore[call-arg]
    type: Literal["function_call"]
    call_id: NonEmptyStr
    name: NonEmptyStr
    arguments: str
    id: str | None = None
    status: Status | None = None


class FunctionCallOutputItem(Struct, **_CONFIG):  # type: ignore[call-arg]
    type: Literal["function_call_output"]
    call_id: NonEmptyStr
    output: str | list[Part]
    id: str | None = None
    status: Status | None = None


class SummaryText(Struct, tag_field="type", tag="summary_text", **_CONFIG):  # type: ignore[call-arg]
    text: str


class ReasoningText(Struct, tag_field="type", tag="reasoning_text", **_CONFIG):  # type: ignore[call-arg]
    text: str


class ReasoningItem(Struct, **_CONFIG):  # type: ignore[call-arg]
    type: Literal["reasoning"]
    summary: list[SummaryText]
    id: str | None = None
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: Status | None = None


# ---- tools, text, reasoning -------------------------------------------------------------------


class FunctionToolDef(Struct, **_CONFIG):  # type: ignore[call-arg]
    """A function tool in the Responses API's flat shape."""

    type: Literal["function"]
    name: Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TextFormat(Struct, tag_field="type", tag="text", **_CONFIG):  # type: ignore[call-arg]
    pass


class JsonObjectFormat(Struct, tag_field="type", tag="json_object", **_CONFIG):  # type: ignore[call-arg]
    pass


class JsonSchemaFormat(Struct, tag_field="type", tag="json_schema", **_CONFIG):  # type: ignore[call-arg]
    """The Responses API's flat json_schema format (chat nests it under `json_schema`)."""

    name: Annotated[str, Meta(min_length=1, max_length=64)]
    schema: dict[str, Any]
    description: str | None = None
    strict: bool | None = None


class TextConfig(Struct, **_CONFIG):  # type: ignore[call-arg]
    format: TextFormat | JsonObjectFormat | JsonSchemaFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningConfig(Struct, **_CONFIG):  # type: ignore[call-arg]
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class StreamOptions(Struct, **_CONFIG):  # type: ignore[call-arg]
    include_obfuscation: bool | None = None


# ---- the body ---------------------------------------------------------------------------------

Metadata = Annotated[
    dict[Annotated[str, Meta(max_length=64)], Annotated[str, Meta(max_length=512)]],
    Meta(max_length=16),
]


class ResponsesBody(Struct, **_CONFIG):  # type: ignore[call-arg]
    model: NonEmptyStr
    input: str | Annotated[list[Any], Meta(min_length=1)]  # items: see responses_requests
    instructions: str | None = None
    tools: Annotated[list[Any], Meta(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: PositiveInt32 | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    metadata: Metadata | None = None  # echoed in the response object
    user: str | None = None  # logged with the request
    # Hints with nothing to do here (the engines cache prefixes by themselves), as in chat.
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    priority: Int32 | None = None  # vLLM's: flow control's priority
    service_tier: str | None = None  # only auto / default
    # Stored state (stages/stored.py).
    store: bool | None = None
    previous_response_id: NonEmptyStr | None = None
    conversation: str | dict[str, Any] | None = None
    # Refused unless neutral (responses_requests says why).
    background: bool | None = None
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    prompt: dict[str, Any] | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    max_tool_calls: PositiveInt32 | None = None


RESPONSES_DECODER = msgspec.json.Decoder(ResponsesBody)
