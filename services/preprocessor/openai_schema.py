"""The OpenAI request bodies as msgspec Structs: types and ranges checked by one C decode.

Every field a client may send is declared here; an undeclared one is rejected (400 naming it),
so nothing is accepted and silently dropped. Numeric bounds are the narrowest of OpenAI's
documented range and what both engine protocols' fields can hold (int32/uint32/float32), so a
value that passes here always fits the engine message. `null` means "not given" everywhere.
Semantic checks that span fields (max_tokens vs min_tokens, ...) are in openai_requests.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
FLOAT32_MAX = 3.4e38

PositiveInt32 = Annotated[int, Meta(ge=1, le=INT32_MAX)]
NonNegInt32 = Annotated[int, Meta(ge=0, le=INT32_MAX)]
Int32 = Annotated[int, Meta(ge=INT32_MIN, le=INT32_MAX)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, Meta(gt=0.0, le=1.0)]
MinP = Annotated[float, Meta(ge=0.0, le=1.0)]
# top_k: -1 (or 0, as vLLM reads it) disables it; SGLang's field is an int32.
TopK = Annotated[int, Meta(ge=-1, le=INT32_MAX)]
RepetitionPenalty = Annotated[float, Meta(gt=0.0, le=FLOAT32_MAX)]
TokenId = Annotated[int, Meta(ge=0, le=INT32_MAX)]
NonEmptyStr = Annotated[str, Meta(min_length=1)]

_CONFIG = {"forbid_unknown_fields": True, "frozen": True, "omit_defaults": True, "kw_only": True}


class StreamOptions(Struct, **_CONFIG):  # type: ignore[call-arg]
    include_usage: bool | None = None


# ---- chat messages (tagged by role) -------------------------------------------------------


class TextPart(Struct, tag_field="type", tag="text", **_CONFIG):  # type: ignore[call-arg]
    text: str


# Media parts are declared so that they get a clear "not supported" (openai_requests): the
# engines' gRPC APIs here take token ids only.
class ImageUrlPart(Struct, tag_field="type", tag="image_url", **_CONFIG):  # type: ignore[call-arg]
    image_url: dict[str, object]


class InputAudioPart(Struct, tag_field="type", tag="input_audio", **_CONFIG):  # type: ignore[call-arg]
    input_audio: dict[str, object]


class FilePart(Struct, tag_field="type", tag="file", **_CONFIG):  # type: ignore[call-arg]
    file: dict[str, object]


ContentPart = TextPart | ImageUrlPart | InputAudioPart | FilePart
ContentParts = Annotated[list[ContentPart], Meta(min_length=1)]
Content = str | ContentParts


class SystemMessage(Struct, tag_field="role", tag="system", **_CONFIG):  # type: ignore[call-arg]
    content: Content
    name: str | None = None


class DeveloperMessage(Struct, tag_field="role", tag="developer", **_CONFIG):  # type: ignore[call-arg]
    content: Content
    name: str | None = None


class UserMessage(Struct, tag_field="role", tag="user", **_CONFIG):  # type: ignore[call-arg]
    content: Content
    name: str | None = None


class FunctionCall(Struct, **_CONFIG):  # type: ignore[call-arg]
    name: NonEmptyStr
    arguments: str  # JSON text, as the model produced it


class ToolCall(Struct, tag_field="type", tag="function", **_CONFIG):  # type: ignore[call-arg]
    id: str
    function: FunctionCall


class AssistantMessage(Struct, tag_field="role", tag="assistant", **_CONFIG):  # type: ignore[call-arg]
    content: Content | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    # Earlier turns' thinking, for templates that render it (DeepSeek-R1, Qwen3 drop it).
    reasoning_content: str | None = None
    refusal: str | None = None


class ToolMessage(Struct, tag_field="role", tag="tool", **_CONFIG):  # type: ignore[call-arg]
    content: Content
    tool_call_id: str  # required, as OpenAI and vLLM have it
    name: str | None = None


Message = SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage


# ---- tools, tool_choice, response_format ---------------------------------------------------


class FunctionDefinition(Struct, **_CONFIG):  # type: ignore[call-arg]
    name: Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema
    strict: bool | None = None


class FunctionTool(Struct, tag_field="type", tag="function", **_CONFIG):  # type: ignore[call-arg]
    function: FunctionDefinition


class NamedFunction(Struct, **_CONFIG):  # type: ignore[call-arg]
    name: NonEmptyStr


class NamedToolChoice(Struct, tag_field="type", tag="function", **_CONFIG):  # type: ignore[call-arg]
    function: NamedFunction


ToolChoiceMode = Literal["none", "auto", "required"]


class TextFormat(Struct, tag_field="type", tag="text", **_CONFIG):  # type: ignore[call-arg]
    pass


class JsonObjectFormat(Struct, tag_field="type", tag="json_object", **_CONFIG):  # type: ignore[call-arg]
    pass


class JsonSchemaSpec(Struct, **_CONFIG):  # type: ignore[call-arg]
    name: Annotated[str, Meta(min_length=1, max_length=64)]
    description: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None


class JsonSchemaFormat(Struct, tag_field="type", tag="json_schema", **_CONFIG):  # type: ignore[call-arg]
    json_schema: JsonSchemaSpec


ResponseFormat = TextFormat | JsonObjectFormat | JsonSchemaFormat


class StructuredOutputs(Struct, **_CONFIG):  # type: ignore[call-arg]
    """vLLM's `structured_outputs` extra: exactly one of these."""

    json: dict[str, Any] | str | None = None
    regex: str | None = None
    choice: Annotated[list[str], Meta(min_length=1)] | None = None
    grammar: str | None = None
    structural_tag: dict[str, Any] | str | None = None
    json_object: bool | None = None


# ---- request bodies -----------------------------------------------------------------------

# OpenAI's logit_bias: token ids as keys (JSON object keys are strings), -100..100.
LogitBias = dict[
    Annotated[str, Meta(pattern=r"^[0-9]{1,10}$")], Annotated[float, Meta(ge=-100, le=100)]
]
StopTokenIds = Annotated[list[TokenId], Meta(max_length=64)]


class _Sampling(Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=True, kw_only=True):
    """Fields both endpoints share."""

    model: NonEmptyStr
    max_tokens: PositiveInt32 | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    min_tokens: NonNegInt32 | None = None
    seed: Int32 | None = None
    stop: str | list[str] | None = None
    stop_token_ids: StopTokenIds | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None
    logit_bias: LogitBias | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    n: Annotated[int, Meta(ge=1, le=128)] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None  # logged; the session key the router uses without x-session-id
    # Engine extras for structured output (SGLang's names, vLLM's structured_outputs and its
    # older guided_* names): at most one constraint per request.
    regex: str | None = None
    ebnf: str | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: Annotated[list[str], Meta(min_length=1)] | None = None
    guided_grammar: str | None = None
    response_format: ResponseFormat | None = None
    # vLLM's: lower is served first (flow control, --flow-config; without it only 0).
    priority: Int32 | None = None
    # OpenAI fields with no effect here unless set to their neutral value (checked in
    # openai_requests: anything else is a 400 naming the field).
    service_tier: str | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None


class ChatCompletionBody(
    _Sampling, forbid_unknown_fields=True, frozen=True, omit_defaults=True, kw_only=True
):
    messages: Annotated[list[Message], Meta(min_length=1)]
    max_completion_tokens: PositiveInt32 | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    tools: Annotated[list[FunctionTool], Meta(max_length=128)] | None = None
    tool_choice: ToolChoiceMode | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    separate_reasoning: bool | None = None  # SGLang's switch: False keeps thinking in content
    modalities: list[Literal["text"]] | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None


PromptIds = Annotated[list[TokenId], Meta(min_length=1)]
# A string, token ids, or a batch of either: msgspec takes one array type per union, so the
# shape of a list (all ids, all strings, all id lists) is checked in openai_requests.
# One prompt as token ids, or a batch of strings / id lists: the batch bound (MAX_BATCH) is checked
# by the parser, since a single prompt's ids are not a batch.
MAX_BATCH = 256
MAX_EMBED_BATCH = 2048
Prompt = str | Annotated[list[str | TokenId | PromptIds], Meta(min_length=1)]


class CompletionBody(
    _Sampling, forbid_unknown_fields=True, frozen=True, omit_defaults=True, kw_only=True
):
    prompt: Prompt
    echo: bool | None = None
    logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    best_of: Annotated[int, Meta(ge=1, le=128)] | None = None
    suffix: str | None = None


class EmbeddingsBody(Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    model: NonEmptyStr
    # A string, token ids, or a batch of either (the shape is checked in openai_requests).
    input: str | Annotated[list[str | TokenId | PromptIds], Meta(min_length=1)]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: PositiveInt32 | None = None
    user: str | None = None
    priority: Int32 | None = None  # vLLM's, as on the other endpoints


CHAT_DECODER = msgspec.json.Decoder(ChatCompletionBody)
COMPLETION_DECODER = msgspec.json.Decoder(CompletionBody)
EMBEDDINGS_DECODER = msgspec.json.Decoder(EmbeddingsBody)
