"""OpenAI streaming response bytes: SSE chunks, and the `usage` object every body carries
(whole bodies are built by stages/sinks).

Per request, `ChatStream` / `CompletionStream` render the constant head of every chunk
(id, object, created, model) once; a content chunk is then that head, one `orjson.dumps`
of the text and a constant tail. Frames are `b"data: " + json + b"\\n\\n"`; the stream ends
with `DONE`. A failure after the stream started is sent as `sse_error(...)` before `DONE`.
"""

from __future__ import annotations

from typing import Any

import orjson

from .errors import error_body

DONE = b"data: [DONE]\n\n"
_END = b"\n\n"


def usage_dict(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0, reasoning_tokens: int = 0
) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }
    if reasoning_tokens:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return usage


def _head(completion_id: str, obj: str, created: int, model: str) -> bytes:
    return b"".join(
        (
            b'{"id":',
            orjson.dumps(completion_id),
            b',"object":"',
            obj.encode(),
            b'","created":',
            str(int(created)).encode(),
            b',"model":',
            orjson.dumps(model),
        )
    )


class ChatStream:
    """The `chat.completion.chunk` frames of one streamed chat completion."""

    __slots__ = ("_head", "_content_pre", "_finish_pre")

    _CONTENT_POST = b'},"logprobs":null,"finish_reason":null}]}\n\n'
    _FINISH_POST = b"}]}\n\n"

    def __init__(self, completion_id: str, model: str, created: int) -> None:
        self._head = b"data: " + _head(completion_id, "chat.completion.chunk", created, model)
        self._content_pre = [self._choice(0) + b'"delta":{"content":']
        self._finish_pre = [self._choice(0) + b'"delta":{},"logprobs":null,']

    def _choice(self, index: int) -> bytes:
        return self._head + b',"choices":[{"index":' + str(index).encode() + b","

    def _grow(self, index: int) -> None:
        while len(self._content_pre) <= index:
            i = len(self._content_pre)
            self._content_pre.append(self._choice(i) + b'"delta":{"content":')
            self._finish_pre.append(self._choice(i) + b'"delta":{},"logprobs":null,')

    def first(self, index: int = 0) -> bytes:
        """The opening chunk of a choice: role "assistant", empty content."""
        return self._choice(index) + (
            b'"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
        )

    def delta(self, text: str, index: int = 0) -> bytes:
        if index >= len(self._content_pre):
            self._grow(index)
        return self._content_pre[index] + orjson.dumps(text) + self._CONTENT_POST

    def chunk(self, index: int, delta: dict[str, Any], logprobs: dict[str, Any] | None) -> bytes:
        """A chunk with any delta (reasoning_content, tool_calls, ...) and logprobs."""
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": None}
        return self._head + b',"choices":[' + orjson.dumps(choice) + b"]}" + _END

    def finish(self, finish_reason: str, index: int = 0) -> bytes:
        """The last chunk of a choice: empty delta and the finish reason ("stop", "length")."""
        if index >= len(self._finish_pre):
            self._grow(index)
        return b"".join(
            (
                self._finish_pre[index],
                b'"finish_reason":',
                orjson.dumps(finish_reason),
                self._FINISH_POST,
            )
        )

    def usage(
        self,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int = 0,
        reasoning_tokens: int = 0,
    ) -> bytes:
        """The include_usage chunk: no choices, the request's usage."""
        usage = orjson.dumps(
            usage_dict(prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens)
        )
        return self._head + b',"choices":[],"usage":' + usage + b"}" + _END


class CompletionStream:
    """The `text_completion` frames of one streamed /v1/completions request."""

    __slots__ = ("_head", "_text_pre")

    _TEXT_POST = b',"logprobs":null,"finish_reason":null}]}\n\n'

    def __init__(self, completion_id: str, model: str, created: int) -> None:
        self._head = b"data: " + _head(completion_id, "text_completion", created, model)
        self._text_pre = [self._choice(0)]

    def _choice(self, index: int) -> bytes:
        return self._head + b',"choices":[{"index":' + str(index).encode() + b',"text":'

    def first(self, index: int = 0) -> bytes:
        """Completions have no role chunk."""
        return b""

    def delta(self, text: str, index: int = 0) -> bytes:
        pre = self._text_pre
        while len(pre) <= index:
            pre.append(self._choice(len(pre)))
        return pre[index] + orjson.dumps(text) + self._TEXT_POST

    def chunk(self, index: int, text: str, logprobs: dict[str, Any] | None) -> bytes:
        choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": None}
        return self._head + b',"choices":[' + orjson.dumps(choice) + b"]}" + _END

    def finish(self, finish_reason: str, index: int = 0) -> bytes:
        return (
            self._choice(index)
            + b'"","logprobs":null,"finish_reason":'
            + orjson.dumps(finish_reason)
            + b"}]}"
            + _END
        )

    def usage(
        self,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int = 0,
        reasoning_tokens: int = 0,
    ) -> bytes:
        usage = orjson.dumps(
            usage_dict(prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens)
        )
        return self._head + b',"choices":[],"usage":' + usage + b"}" + _END


def sse_error(message: str, type: str, code: str, param: str | None = None) -> bytes:
    """An error frame for a failure after the stream started (follow it with DONE)."""
    return b"data: " + error_body(message, type, code, param) + _END
