"""The OpenAI request bodies as msgspec Structs: types and ranges checked by one C decode.

Every field a client may send is declared here; an undeclared one is rejected (400 naming it),
so nothing is accepted and silently dropped. Numeric bounds are the narrowest of OpenAI's
documented range and what both engine protocols' fields can hold (int32/uint32/float32), so a
value that passes here always fits the engine message. `null` means "not given" everywhere.
Semantic checks that span fields (max_tokens vs min_tokens, ...) are in openai_requests.
"""

from __future__ import annotations

from typing import Annotated

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


class AssistantMessage(Struct, tag_field="role", tag="assistant", **_CONFIG):  # type: ignore[call-arg]
    content: Content | None = None
    name: str | None = None


class ToolMessage(Struct, tag_field="role", tag="tool", **_CONFIG):  # type: ignore[call-arg]
    content: Content
    tool_call_id: str | None = None


Message = SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage


# ---- request bodies -----------------------------------------------------------------------


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
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None
    ignore_eos: bool | None = None
    n: Annotated[int, Meta(ge=1, le=128)] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None  # logged with the request


class ChatCompletionBody(
    _Sampling, forbid_unknown_fields=True, frozen=True, omit_defaults=True, kw_only=True
):
    messages: Annotated[list[Message], Meta(min_length=1)]
    max_completion_tokens: PositiveInt32 | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None


PromptIds = Annotated[list[TokenId], Meta(min_length=1)]
# A string, token ids, or a batch of either: msgspec takes one array type per union, so the
# shape of a list (all ids, all strings, all id lists) is checked in openai_requests.
Prompt = str | Annotated[list[str | TokenId | PromptIds], Meta(min_length=1)]


class CompletionBody(
    _Sampling, forbid_unknown_fields=True, frozen=True, omit_defaults=True, kw_only=True
):
    prompt: Prompt
    echo: bool | None = None
    logprobs: Annotated[int, Meta(ge=0, le=5)] | bool | None = None
    best_of: Annotated[int, Meta(ge=1, le=128)] | None = None
    suffix: str | None = None


CHAT_DECODER = msgspec.json.Decoder(ChatCompletionBody)
COMPLETION_DECODER = msgspec.json.Decoder(CompletionBody)
