from __future__ import annotations

from typing import Any

import orjson
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletionChunk

from switchyard.preprocessor.sse import (
    DONE,
    ChatStream,
    CompletionStream,
    sse_error,
)

ID, MODEL, CREATED = "chatcmpl-abc", 'deep"seek', 1_700_000_000


def parse_frame(frame: bytes) -> dict[str, Any]:
    assert frame.startswith(b"data: ") and frame.endswith(b"\n\n")
    assert frame.count(b"\n") == 2, "a frame holds exactly one data line"
    return orjson.loads(frame[len(b"data: ") : -2])


class TestChatStream:
    def test_first_chunk_has_role(self) -> None:
        chunk = parse_frame(ChatStream(ID, MODEL, CREATED).first())
        parsed = ChatCompletionChunk.model_validate(chunk)
        assert parsed.id == ID and parsed.model == MODEL and parsed.created == CREATED
        assert parsed.object == "chat.completion.chunk"
        assert parsed.choices[0].delta.role == "assistant"
        assert parsed.choices[0].delta.content == ""
        assert parsed.choices[0].finish_reason is None

    @pytest.mark.parametrize("text", ["hello", 'quote " back\\slash', "新\n😀", "\u2028", ""])
    def test_content_delta(self, text: str) -> None:
        chunk = parse_frame(ChatStream(ID, MODEL, CREATED).delta(text))
        parsed = ChatCompletionChunk.model_validate(chunk)
        assert parsed.choices[0].delta.content == text
        assert parsed.choices[0].delta.role is None
        assert parsed.choices[0].index == 0
        assert chunk["choices"][0]["finish_reason"] is None

    @pytest.mark.parametrize("reason", ["stop", "length"])
    def test_finish(self, reason: str) -> None:
        chunk = parse_frame(ChatStream(ID, MODEL, CREATED).finish(reason))
        parsed = ChatCompletionChunk.model_validate(chunk)
        assert parsed.choices[0].finish_reason == reason
        assert chunk["choices"][0]["delta"] == {}

    def test_usage_chunk(self) -> None:
        chunk = parse_frame(ChatStream(ID, MODEL, CREATED).usage(12, 5, cached_tokens=8))
        parsed = ChatCompletionChunk.model_validate(chunk)
        assert parsed.choices == []
        assert parsed.usage is not None
        assert (parsed.usage.prompt_tokens, parsed.usage.completion_tokens) == (12, 5)
        assert parsed.usage.total_tokens == 17
        assert parsed.usage.prompt_tokens_details is not None
        assert parsed.usage.prompt_tokens_details.cached_tokens == 8

    def test_done(self) -> None:
        assert DONE == b"data: [DONE]\n\n"


class TestCompletionStream:
    def test_delta(self) -> None:
        chunk = parse_frame(CompletionStream("cmpl-1", MODEL, CREATED).delta("tok 😀"))
        assert chunk["object"] == "text_completion"
        assert chunk["id"] == "cmpl-1" and chunk["model"] == MODEL
        assert chunk["choices"] == [
            {"index": 0, "text": "tok 😀", "logprobs": None, "finish_reason": None}
        ]

    def test_finish_validates(self) -> None:
        chunk = parse_frame(CompletionStream("cmpl-1", MODEL, CREATED).finish("length"))
        parsed = Completion.model_validate(chunk)
        assert parsed.choices[0].finish_reason == "length"
        assert parsed.choices[0].text == ""

    def test_usage(self) -> None:
        chunk = parse_frame(CompletionStream("cmpl-1", MODEL, CREATED).usage(3, 4))
        parsed = Completion.model_validate(chunk)
        assert parsed.choices == []
        assert parsed.usage is not None and parsed.usage.total_tokens == 7


class TestErrorFrame:
    def test_shape(self) -> None:
        frame = parse_frame(sse_error("engine went away", "service_unavailable", "engine_lost"))
        assert frame == {
            "error": {
                "message": "engine went away",
                "type": "service_unavailable",
                "param": None,
                "code": "engine_lost",
            }
        }
