"""Where the token loop puts each choice's output: an SSE stream, or one JSON body.

`StreamSink` gathers the frames of one batch of replies and writes them in one go (the role
chunk with the first content; finish, usage and [DONE] together): what one choice produced
in a batch (text, reasoning, tool-call deltas, logprobs) is one chunk. The HTTP status goes
out with the first write, so a failure before any output still gets a proper error status.
`CollectSink` keeps everything per choice and answers once, at the end. Plain text (no
parsers, no logprobs) takes a pre-encoded fast path. Both implement context.Sink
(responses.py has the Responses API's, messages.py the Messages API's; both stream their
output as parts: `PartStream`).
"""

from __future__ import annotations

from typing import Any

import orjson

from switchyard.preprocessor import sse
from switchyard.preprocessor.errors import RequestError
from switchyard.preprocessor.parsers import ParsedDelta, ToolCallDelta
from switchyard.preprocessor.stages.choice import ChoiceOutput
from switchyard.preprocessor.stages.context import HttpOut


class Usage:
    __slots__ = ("prompt_tokens", "completion_tokens", "cached_tokens", "reasoning_tokens")

    def __init__(
        self,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int,
        reasoning_tokens: int = 0,
    ) -> None:
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.cached_tokens = cached_tokens
        self.reasoning_tokens = reasoning_tokens

    def as_dict(self) -> dict[str, Any]:
        return sse.usage_dict(
            self.prompt_tokens, self.completion_tokens, self.cached_tokens, self.reasoning_tokens
        )


def _merge_calls(pending: list[ToolCallDelta], calls: tuple[ToolCallDelta, ...]) -> None:
    for call in calls:
        last = pending[-1] if pending else None
        if last is not None and call.name is None and last.index == call.index:
            last.arguments += call.arguments  # one call's fragments in one batch: one entry
        else:
            pending.append(ToolCallDelta(call.index, call.id, call.name, call.arguments))


class SseBody:
    """An event-stream body: frames queue in `_out` and go out in one write per batch (the
    output a subclass holds back to merge is queued first, `_queue_held`); the last write
    carries the end of the body too (one syscall and one segment where flush + end took two)."""

    __slots__ = ("_http", "_out", "started")

    def __init__(self, http: HttpOut) -> None:
        self._http = http
        self._out: list[bytes] = []
        self.started = False  # the status line and headers went out

    def _queue_held(self) -> None:
        pass

    async def flush(self) -> None:
        self._queue_held()
        out = self._out
        if not out:
            return
        data = b"".join(out) if len(out) > 1 else out[0]
        out.clear()
        if not self.started:
            self.started = True
            await self._http.start_stream()
        await self._http.write(data)

    async def _last(self) -> None:
        self._queue_held()
        data = b"".join(self._out)
        self._out.clear()
        if not self.started:
            self.started = True
            await self._http.start_stream()
        await self._http.end_stream(data)


class PartStream(SseBody):
    """An event stream of output parts (the Responses API's items, the Messages API's content
    blocks): one part open at a time, a new one when the kind of output changes (reasoning,
    text, a tool call, as the model writes them), each part's text batched into one delta
    event per write. Subclasses name the kinds and write the events (`_open`, `_delta`); an
    open part has `kind` and `parts` (its text so far)."""

    __slots__ = ("_part", "_pending")

    TEXT = REASONING = CALL = ""  # the subclass's names of the kinds

    def __init__(self, http: HttpOut) -> None:
        super().__init__(http)
        self._part: Any = None  # the open part
        self._pending: list[str] = []  # its text not yet in a delta event

    def _open(self, kind: str, call: ToolCallDelta | None = None) -> Any:
        """Start a part of `kind` (after closing the open one); `_opened` records it."""
        raise NotImplementedError

    def _opened(self, part: Any) -> None:
        self._part = part

    def _closed(self) -> None:
        self._part = None

    def _add(self, kind: str, text: str) -> None:
        part = self._part
        if part is None or part.kind != kind:
            part = self._open(kind)
        part.parts.append(text)
        self._pending.append(text)

    def content(self, choice: ChoiceOutput, text: str) -> None:
        self._add(self.TEXT, text)

    def echo(self, choice: ChoiceOutput) -> None:
        choice.echoed = True  # completions only

    def parsed(self, choice: ChoiceOutput, parsed: ParsedDelta) -> None:
        content, reasoning, calls = parsed
        if reasoning:
            self._add(self.REASONING, reasoning)
        if content:
            self._add(self.TEXT, content)
        for call in calls:
            part = self._part
            if call.name is not None:  # a call starts: its id and name come first
                part = self._open(self.CALL, call)
            elif part is None or part.kind != self.CALL:
                continue  # parsers send a call's name before its arguments
            if call.arguments:
                part.parts.append(call.arguments)
                self._pending.append(call.arguments)

    def logprobs(self, choice: ChoiceOutput, part: Any) -> None:
        pass  # never asked of the engine (neither API offers them here)


class StreamSink(SseBody):
    __slots__ = (
        "_frames",
        "_chat",
        "_include_usage",
        "_at",
        "_text",
        "_reasoning",
        "_calls",
        "_lp",
    )

    def __init__(
        self,
        http: HttpOut,
        frames: sse.ChatStream | sse.CompletionStream,
        chat: bool,
        include_usage: bool,
    ) -> None:
        super().__init__(http)
        self._frames = frames
        self._chat = chat
        self._include_usage = include_usage
        self._at = -1  # the choice whose output is pending (not framed yet)
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._calls: list[ToolCallDelta] = []
        self._lp: Any = None  # chat: list of content entries; completions: a logprobs dict

    def _open(self, choice: ChoiceOutput) -> None:
        if self._at != choice.index and self._at != -1:
            self._frame()
        self._at = choice.index
        if not choice.first_sent:
            choice.first_sent = True
            if self._chat:
                self._out.append(self._frames.first(choice.index))

    def _frame(self) -> None:
        at, text = self._at, self._text
        content = text[0] if len(text) == 1 else "".join(text)
        if not self._reasoning and not self._calls and self._lp is None:
            if content:
                self._out.append(self._frames.delta(content, at))
            text.clear()
            self._at = -1
            return
        if self._chat:
            delta: dict[str, Any] = {}
            if content:
                delta["content"] = content
            if self._reasoning:
                delta["reasoning_content"] = "".join(self._reasoning)
            if self._calls:
                delta["tool_calls"] = [call.to_openai() for call in self._calls]
            lp = {"content": self._lp} if self._lp is not None else None
            self._out.append(self._frames.chunk(at, delta, lp))  # type: ignore[call-arg, arg-type]
        else:
            self._out.append(self._frames.chunk(at, content, self._lp))  # type: ignore[arg-type]
        text.clear()
        self._reasoning.clear()
        self._calls.clear()
        self._lp = None
        self._at = -1

    def content(self, choice: ChoiceOutput, text: str) -> None:
        self._open(choice)
        self._text.append(text)

    def echo(self, choice: ChoiceOutput) -> None:
        """Completions echo: the prompt's text, ahead of the output."""
        choice.echoed = True
        self.content(choice, choice.echo)

    def parsed(self, choice: ChoiceOutput, parsed: ParsedDelta) -> None:
        self._open(choice)
        content, reasoning, calls = parsed
        if content:
            self._text.append(content)
        if reasoning:
            self._reasoning.append(reasoning)
        if calls:
            _merge_calls(self._calls, calls)

    def logprobs(self, choice: ChoiceOutput, part: Any) -> None:
        """Chat: a list of `logprobs.content` entries; completions: a logprobs dict part."""
        self._open(choice)
        if self._lp is None:
            self._lp = part
        elif self._chat:
            self._lp.extend(part)
        else:
            for key, values in part.items():
                self._lp[key].extend(values)

    def finish(self, choice: ChoiceOutput) -> None:
        self._open(choice)
        self._frame()
        self._out.append(self._frames.finish(choice.finish_reason or "stop", choice.index))

    def _queue_held(self) -> None:
        if self._at != -1:
            self._frame()

    async def end(self, choices: list[ChoiceOutput], usage: Usage) -> None:
        if self._include_usage:
            self._out.append(
                self._frames.usage(
                    usage.prompt_tokens,
                    usage.completion_tokens,
                    usage.cached_tokens,
                    usage.reasoning_tokens,
                )
            )
        self._out.append(sse.DONE)
        await self._last()

    async def fail(self, err: RequestError) -> bool:
        """Report a failure inside the stream; False when nothing was sent yet (the caller
        then answers with the error's HTTP status instead)."""
        if not self.started:
            self._out.clear()
            self._text.clear()
            self._at = -1
            return False
        self._out.append(sse.sse_error(err.message, err.type, err.code, err.param))
        self._out.append(sse.DONE)
        await self._last()
        return True


class _Collected:
    __slots__ = ("text", "reasoning", "logprobs")

    def __init__(self) -> None:
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.logprobs: list[dict[str, Any]] = []


class CollectSink:
    """One JSON body at the end: every choice's text (reasoning and tool calls apart)."""

    __slots__ = ("_http", "_inp", "_chat", "_choices", "keep")

    started = False

    def __init__(self, http: HttpOut, completion_id: str, model: str, created: int, chat: bool):
        self._http = http
        self._inp = (completion_id, model, created)
        self._chat = chat
        self._choices: dict[int, _Collected] = {}
        self.keep: int | None = None  # best_of: how many of the choices to answer with

    def _of(self, choice: ChoiceOutput) -> _Collected:
        got = self._choices.get(choice.index)
        if got is None:
            got = self._choices[choice.index] = _Collected()
        return got

    def content(self, choice: ChoiceOutput, text: str) -> None:
        self._of(choice).text.append(text)

    def echo(self, choice: ChoiceOutput) -> None:
        choice.echoed = True  # the body puts choice.echo first

    def parsed(self, choice: ChoiceOutput, parsed: ParsedDelta) -> None:
        got = self._of(choice)
        if parsed[0]:
            got.text.append(parsed[0])
        if parsed[1]:
            got.reasoning.append(parsed[1])

    def logprobs(self, choice: ChoiceOutput, part: Any) -> None:
        if self._chat:
            self._of(choice).logprobs.extend(part)
        # completions keep theirs in choice.completion_logprobs

    def finish(self, choice: ChoiceOutput) -> None:
        pass

    async def flush(self) -> None:
        pass

    def text(self, index: int) -> str:
        got = self._choices.get(index)
        return "".join(got.text) if got is not None else ""

    def _chat_choice(self, choice: ChoiceOutput, logprobs: bool) -> dict[str, Any]:
        got = self._choices.get(choice.index) or _Collected()
        message: dict[str, Any] = {"role": "assistant", "content": "".join(got.text)}
        if got.reasoning:
            message["reasoning_content"] = "".join(got.reasoning)
        calls = choice.parser.calls if choice.parser is not None else []
        if calls:
            message["tool_calls"] = [call.to_openai() for call in calls]
        if (calls or got.reasoning) and not message["content"]:
            message["content"] = None  # no answer besides them (vLLM's server: null too)
        return {
            "index": choice.index,
            "message": message,
            "logprobs": {"content": got.logprobs} if logprobs else None,
            "finish_reason": choice.finish_reason or "stop",
        }

    def _completion_choice(
        self, choice: ChoiceOutput, index: int, logprobs: bool
    ) -> dict[str, Any]:
        lp = choice.completion_logprobs
        return {
            "index": index,
            "text": choice.echo + self.text(choice.index),
            "logprobs": lp.whole() if lp is not None and logprobs else None,
            "finish_reason": choice.finish_reason or "stop",
        }

    async def end(self, choices: list[ChoiceOutput], usage: Usage, logprobs: bool = False) -> None:
        completion_id, model, created = self._inp
        if self._chat:
            body = {
                "id": completion_id,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [self._chat_choice(c, logprobs) for c in choices],
                "usage": usage.as_dict(),
            }
        else:
            kept = choices if self.keep is None else _best(choices, self.keep)
            body = {
                "id": completion_id,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": [self._completion_choice(c, i, logprobs) for i, c in enumerate(kept)],
                "usage": usage.as_dict(),
            }
        await self._http.respond(200, orjson.dumps(body))

    async def fail(self, err: RequestError) -> bool:
        return False


def _best(choices: list[ChoiceOutput], keep: int) -> list[ChoiceOutput]:
    """best_of: per prompt (choices come in groups of best_of), the `keep` with the highest
    total logprob, in their original order."""
    groups: dict[int, list[ChoiceOutput]] = {}
    for choice in choices:
        groups.setdefault(choice.group, []).append(choice)
    out: list[ChoiceOutput] = []
    for batch in groups.values():
        ranked = sorted(
            batch,
            key=lambda c: -(c.completion_logprobs.total() if c.completion_logprobs else 0.0),
        )
        best = {id(c) for c in ranked[:keep]}
        out.extend(c for c in batch if id(c) in best)
    return out
