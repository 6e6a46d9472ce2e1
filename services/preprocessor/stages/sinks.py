"""Where the token loop puts each choice's output: an SSE stream, or one JSON body.

`StreamSink` gathers the frames of one batch of replies and writes them in one go (the role
chunk with the first content; finish, usage and [DONE] together). The HTTP status goes out
with the first write, so a failure before any output still gets a proper error status.
`CollectSink` keeps the text per choice and answers once, at the end.
"""

from __future__ import annotations

from typing import Protocol

from switchyard.preprocessor import sse
from switchyard.preprocessor.errors import RequestError
from switchyard.preprocessor.stages.choice import ChoiceOutput

Sink = "StreamSink | CollectSink"


class HttpOut(Protocol):
    """The response side of one HTTP exchange (edge.py implements it over ASGI)."""

    async def start_stream(self) -> None: ...

    async def write(self, data: bytes) -> None: ...

    async def end_stream(self) -> None: ...

    async def respond(self, status: int, body: bytes) -> None: ...


class Usage:
    __slots__ = ("prompt_tokens", "completion_tokens", "cached_tokens")

    def __init__(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.cached_tokens = cached_tokens


class StreamSink:
    """Text of one choice that arrives in one batch goes out as one content chunk."""

    __slots__ = ("_http", "_frames", "_chat", "_include_usage", "_out", "_text", "_at", "started")

    def __init__(
        self,
        http: HttpOut,
        frames: sse.ChatStream | sse.CompletionStream,
        chat: bool,
        include_usage: bool,
    ) -> None:
        self._http = http
        self._frames = frames
        self._chat = chat
        self._include_usage = include_usage
        self._out: list[bytes] = []
        self._text: list[str] = []  # content not framed yet, all of choice `_at`
        self._at = -1
        self.started = False  # the status line and headers went out

    def _open(self, choice: ChoiceOutput) -> None:
        choice.first_sent = True
        if self._chat:
            self._out.append(self._frames.first(choice.index))

    def _frame_text(self) -> None:
        text = self._text
        self._out.append(self._frames.delta(text[0] if len(text) == 1 else "".join(text), self._at))
        text.clear()

    def content(self, choice: ChoiceOutput, text: str) -> None:
        if self._text and self._at != choice.index:
            self._frame_text()
        if not choice.first_sent:
            self._open(choice)
        self._at = choice.index
        self._text.append(text)

    def finish(self, choice: ChoiceOutput) -> None:
        if self._text:
            self._frame_text()
        if not choice.first_sent:
            self._open(choice)
        self._out.append(self._frames.finish(choice.finish_reason or "stop", choice.index))

    async def flush(self) -> None:
        if self._text:
            self._frame_text()
        if not self._out:
            return
        data = b"".join(self._out) if len(self._out) > 1 else self._out[0]
        self._out.clear()
        if not self.started:
            self.started = True
            await self._http.start_stream()
        await self._http.write(data)

    async def end(self, choices: list[ChoiceOutput], usage: Usage) -> None:
        if self._include_usage:
            self._out.append(
                self._frames.usage(
                    usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens
                )
            )
        self._out.append(sse.DONE)
        await self.flush()
        await self._http.end_stream()

    async def fail(self, err: RequestError) -> bool:
        """Report a failure inside the stream; False when nothing was sent yet (the caller
        then answers with the error's HTTP status instead)."""
        if not self.started:
            self._out.clear()
            self._text.clear()
            return False
        self._out.append(sse.sse_error(err.message, err.type, err.code, err.param))
        self._out.append(sse.DONE)
        await self.flush()
        await self._http.end_stream()
        return True


class CollectSink:
    __slots__ = ("_http", "_inp", "_chat", "_parts")

    started = False

    def __init__(self, http: HttpOut, completion_id: str, model: str, created: int, chat: bool):
        self._http = http
        self._inp = (completion_id, model, created)
        self._chat = chat
        self._parts: dict[int, list[str]] = {}

    def content(self, choice: ChoiceOutput, text: str) -> None:
        parts = self._parts.get(choice.index)
        if parts is None:
            parts = self._parts[choice.index] = []
        parts.append(text)

    def finish(self, choice: ChoiceOutput) -> None:
        pass

    async def flush(self) -> None:
        pass

    def text(self, index: int) -> str:
        return "".join(self._parts.get(index, ()))

    async def end(self, choices: list[ChoiceOutput], usage: Usage) -> None:
        build = sse.chat_completion_body if self._chat else sse.text_completion_body
        choice = choices[0]
        body = build(
            *self._inp,
            self.text(choice.index),
            choice.finish_reason or "stop",
            usage.prompt_tokens,
            usage.completion_tokens,
            usage.cached_tokens,
        )
        await self._http.respond(200, body)

    async def fail(self, err: RequestError) -> bool:
        return False
