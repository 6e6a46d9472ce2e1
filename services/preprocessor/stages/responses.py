"""The Responses API's output: the response object, its SSE events, and the two sinks.

The token loop feeds these sinks exactly as it feeds chat's (stages.sinks.Sink); they turn
one choice's (content, reasoning, tool-call) deltas into output items:

    reasoning       {"type": "reasoning", "content": [{"type": "reasoning_text", ...}],
                    "summary": []}  (the raw reasoning; there is no summarizer here)
    message         {"type": "message", "role": "assistant", "content": [{"type":
                    "output_text", "text", "annotations": [], "logprobs": []}]}
    function_call   {"type": "function_call", "call_id", "name", "arguments"}

`ResponseStreamSink` opens an item when the kind of output changes (reasoning, then the
message, then each call, as the model writes them) and streams its events:
output_item.added, content_part.added, ...delta per batch, ...done, content_part.done,
output_item.done; the first output is preceded by response.created and
response.in_progress, and the end is response.completed, or response.incomplete when
max_output_tokens cut the output. Nothing is written before the first output, so a request
that fails before the engine generated anything gets an HTTP error status, as in chat; a
failure after that is a response.failed event (the item being written closed as
incomplete). Every frame has its `event:` line and a `sequence_number`.
`ResponseCollectSink` answers once with the whole response object: the reasoning item, the
message (omitted when the output is only tool calls) and the calls. A kept response
(stages/stored) is written before the last frame goes out. Once the engine generated a
token the response exists (not streamed: once an engine took it, as its tokens come only at
the end): a failure of its generation then is answered (the 200 body when not streaming) and
kept as `failed`, with its error, usage and output so far; a refusal (a bad request, load)
stays an HTTP error. A client that disconnects ends the generation and nothing is kept, as
OpenAI does for a response that is not `background`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from switchyard.preprocessor.errors import NO_ENGINE_AVAILABLE, STORE_UNAVAILABLE, RequestError
from switchyard.preprocessor.parsers import ParsedDelta, ToolCallDelta
from switchyard.preprocessor.stages.choice import ChoiceOutput
from switchyard.preprocessor.stages.context import HttpOut
from switchyard.preprocessor.stages.sinks import PartStream, Usage
from switchyard.preprocessor.storage.errors import StoreUnavailable

MESSAGE, REASONING, CALL = "message", "reasoning", "function_call"
_PREFIX = {MESSAGE: "msg", REASONING: "rs", CALL: "fc"}
_DELTA_EVENT = {
    MESSAGE: "response.output_text.delta",
    REASONING: "response.reasoning_text.delta",
    CALL: "response.function_call_arguments.delta",
}


def usage_dict(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


# Keeps the final response object before its last frame goes out (stages/stored.keep):
# (body, headers already sent) -> the stored encoding when the body went in unchanged.
Keep = Callable[[dict[str, Any], bool], Awaitable[bytes | None]]
# A response's choices and usage so far, and whether an engine took it (read when it fails).
Progress = tuple[list[ChoiceOutput], Usage, bool]
# Failures of a response an engine was generating (a refusal, of the request or for load, is
# none of these): with no token seen (not streamed: the engine answers once, at the end) the
# response still existed, and failed.
MID_GENERATION = frozenset(
    {"request_timeout", "engine_error", "engine_unavailable", NO_ENGINE_AVAILABLE}
)


def _nothing() -> Progress:
    return [], Usage(0, 0, 0), False


class ResponseHead:
    """What every response object of one request shares: id, model, time, echoed params,
    and where it is kept (None: nowhere)."""

    __slots__ = ("id", "model", "created_at", "shown", "keep", "progress")

    def __init__(
        self,
        response_id: str,
        model: str,
        created_at: int,
        shown: dict[str, Any],
        keep: Keep | None = None,
        progress: Callable[[], Progress] = _nothing,
    ):
        self.id = response_id
        self.model = model
        self.created_at = created_at
        self.shown = shown
        self.keep = keep
        self.progress = progress

    def generated(self, err: RequestError, streamed: bool) -> Usage | None:
        """The usage so far when the response existed (a failure is then answered and kept
        as a `failed` response), else None (an HTTP error, nothing kept). It exists once a
        token came, and, not streamed, once an engine took it and failed to finish it. A
        failure of the store, which refused this response at its end, is a 503 either way."""
        _, usage, dispatched = self.progress()
        if err.code == STORE_UNAVAILABLE:
            return None
        if usage.completion_tokens or (not streamed and dispatched and err.code in MID_GENERATION):
            return usage
        return None

    async def kept_failed(self, body: dict[str, Any], started: bool) -> None:
        """Keep a failed response; a store that is down then is not what the client hears
        about (the body says `store: false`)."""
        try:
            await self.kept(body, started)
        except StoreUnavailable:
            body["store"] = False

    async def kept(self, body: dict[str, Any], started: bool) -> bytes | None:
        return await self.keep(body, started) if self.keep is not None else None

    def body(
        self,
        status: str,
        output: list[dict[str, Any]],
        usage: Usage | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "error": error,
            "incomplete_details": (
                {"reason": "max_output_tokens"} if status == "incomplete" else None
            ),
            "model": self.model,
            "output": output,
            "previous_response_id": None,
            "store": False,  # `shown` says otherwise when the response is kept
            "truncation": "disabled",
            "max_tool_calls": None,
            "top_logprobs": 0,
            **self.shown,
            "usage": usage_dict(usage) if usage is not None else None,
        }
        if status in ("completed", "incomplete"):
            body["completed_at"] = int(time.time())
        return body


def _item_id(kind: str) -> str:
    return f"{_PREFIX[kind]}_{uuid.uuid4().hex}"


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": MESSAGE,
        "status": status,
        "role": "assistant",
        "content": [_output_text(text)] if status != "in_progress" else [],
    }


def reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}] if status != "in_progress" else []
    return {"id": item_id, "type": REASONING, "summary": [], "content": content, "status": status}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict:
    return {
        "id": item_id,
        "type": CALL,
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def failure(err: RequestError) -> dict[str, Any]:
    """A response object's `error` (its codes are the API's: server_error for our side)."""
    return {
        "code": "server_error" if err.status >= 500 else "invalid_prompt",
        "message": err.message,
    }


class _Item:
    """The output item being streamed."""

    __slots__ = ("kind", "id", "index", "parts", "call_id", "name", "delta_head")

    def __init__(self, kind: str, index: int, call: ToolCallDelta | None = None) -> None:
        self.kind = kind
        self.id = _item_id(kind)
        self.index = index  # its output_index
        self.parts: list[str] = []  # its text (arguments for a call)
        self.call_id = (call.id or "") if call is not None else ""
        self.name = (call.name or "") if call is not None else ""
        event = _DELTA_EVENT[kind].encode()
        head = [b"event: ", event, b'\ndata: {"type":"', event, b'","item_id":"', self.id.encode()]
        head += [b'","output_index":', str(index).encode()]
        if kind != CALL:
            head.append(b',"content_index":0')
        if kind == MESSAGE:
            head.append(b',"logprobs":[]')
        head.append(b',"delta":')
        self.delta_head = b"".join(head)  # the constant start of this item's delta events

    def done(self, status: str) -> dict[str, Any]:
        text = "".join(self.parts)
        if self.kind == MESSAGE:
            return message_item(self.id, text, status)
        if self.kind == REASONING:
            return reasoning_item(self.id, text, status)
        return call_item(self.id, self.call_id, self.name, text, status)

    def added(self) -> dict[str, Any]:
        if self.kind == CALL:
            return call_item(self.id, self.call_id, self.name, "", "in_progress")
        return self.done("in_progress")


class ResponseStreamSink(PartStream):
    __slots__ = ("_head", "_seq", "_items", "_announced", "_incomplete")

    TEXT, REASONING, CALL = MESSAGE, REASONING, CALL

    def __init__(self, http: HttpOut, head: ResponseHead) -> None:
        super().__init__(http)
        self._head = head
        self._seq = 0
        self._items: list[dict[str, Any]] = []  # finished output items
        self._announced = False  # response.created went out
        self._incomplete = False  # max_output_tokens cut the output

    # --- frames ---------------------------------------------------------------------------

    def _event(self, name: str, fields: dict[str, Any]) -> None:
        fields = {"type": name, **fields, "sequence_number": self._seq}
        self._seq += 1
        self._out.append(b"event: %s\ndata: %s\n\n" % (name.encode(), orjson.dumps(fields)))

    def _announce(self) -> None:
        if not self._announced:
            self._announced = True
            body = self._head.body("in_progress", [])
            self._event("response.created", {"response": body})
            self._event("response.in_progress", {"response": body})

    def _delta(self) -> None:
        pending = self._pending
        item = self._part
        if not pending or item is None:
            return
        text = pending[0] if len(pending) == 1 else "".join(pending)
        pending.clear()
        seq = self._seq
        self._seq += 1
        self._out.append(
            b'%s%s,"sequence_number":%d}\n\n' % (item.delta_head, orjson.dumps(text), seq)
        )

    def _part_fields(self, item: _Item) -> dict[str, Any]:
        return {"item_id": item.id, "output_index": item.index, "content_index": 0}

    def _open(self, kind: str, call: ToolCallDelta | None = None) -> _Item:
        self._announce()
        self._close()
        item = _Item(kind, len(self._items), call)
        self._opened(item)
        self._event(
            "response.output_item.added", {"output_index": item.index, "item": item.added()}
        )
        if kind == MESSAGE:
            part: dict[str, Any] = _output_text("")
        elif kind == REASONING:
            part = {"type": "reasoning_text", "text": ""}
        else:
            return item
        self._event("response.content_part.added", {**self._part_fields(item), "part": part})
        return item

    def _close(self, status: str = "completed") -> None:
        item = self._part
        if item is None:
            return
        self._delta()
        done = item.done(status)
        text = "".join(item.parts)
        if item.kind == CALL:
            fields = {"item_id": item.id, "output_index": item.index, "name": item.name}
            self._event("response.function_call_arguments.done", {**fields, "arguments": text})
        else:
            part = done["content"][0]
            if item.kind == MESSAGE:
                self._event(
                    "response.output_text.done",
                    {**self._part_fields(item), "text": text, "logprobs": []},
                )
            else:
                self._event(
                    "response.reasoning_text.done", {**self._part_fields(item), "text": text}
                )
            self._event("response.content_part.done", {**self._part_fields(item), "part": part})
        self._event("response.output_item.done", {"output_index": item.index, "item": done})
        self._items.append(done)
        self._closed()

    # --- the token loop's calls (the rest are PartStream's) --------------------------------

    def finish(self, choice: ChoiceOutput) -> None:
        self._incomplete = choice.finish_reason == "length"
        if self._part is None and not self._items:
            self._open(MESSAGE)  # an empty answer is still a message
        self._close("incomplete" if self._incomplete else "completed")

    def _queue_held(self) -> None:
        self._delta()

    async def end(self, choices: list[ChoiceOutput], usage: Usage) -> None:
        self._announce()
        self._close()
        status = "incomplete" if self._incomplete else "completed"
        body = self._head.body(status, self._items, usage)
        await self._head.kept(body, True)  # before the last frame: a chained turn finds it
        self._event(f"response.{status}", {"response": body})
        await self._last()

    async def fail(self, err: RequestError) -> bool:
        """response.failed inside the stream, the item being written closed as incomplete
        and the response kept as failed; False when nothing was sent and nothing generated
        yet (the caller then answers with the error's HTTP status, and nothing is kept)."""
        usage = self._head.generated(err, True)
        if not self.started and usage is None:
            self._out.clear()
            self._pending.clear()
            return False
        self._announce()
        self._close("incomplete")  # as far as it got
        body = self._head.body("failed", self._items, usage, error=failure(err))
        await self._head.kept_failed(body, self.started)
        self._event("response.failed", {"response": body})
        await self._last()
        return True


class ResponseCollectSink:
    """The whole response object at the end (not streaming)."""

    __slots__ = ("_http", "_head", "_content", "_reasoning")

    started = False

    def __init__(self, http: HttpOut, head: ResponseHead) -> None:
        self._http = http
        self._head = head
        self._content: list[str] = []
        self._reasoning: list[str] = []

    def content(self, choice: ChoiceOutput, text: str) -> None:
        self._content.append(text)

    def echo(self, choice: ChoiceOutput) -> None:
        choice.echoed = True

    def parsed(self, choice: ChoiceOutput, parsed: ParsedDelta) -> None:
        if parsed[0]:
            self._content.append(parsed[0])
        if parsed[1]:
            self._reasoning.append(parsed[1])

    def logprobs(self, choice: ChoiceOutput, part: Any) -> None:
        pass  # never asked of the engine (top_logprobs is refused)

    def finish(self, choice: ChoiceOutput) -> None:
        pass

    async def flush(self) -> None:
        pass

    def output(self, choice: ChoiceOutput, failed: bool = False) -> tuple[str, list[dict]]:
        """The response's status and output items (`failed`: as far as it got)."""
        incomplete = failed or choice.finish_reason == "length"
        items: list[dict[str, Any]] = []
        if self._reasoning:
            items.append(reasoning_item(_item_id(REASONING), "".join(self._reasoning), "completed"))
        calls = choice.parser.calls if choice.parser is not None else []
        text = "".join(self._content)
        if text or not calls:
            items.append(message_item(_item_id(MESSAGE), text, "completed"))
        for call in calls:
            items.append(call_item(_item_id(CALL), call.id, call.name, call.arguments, "completed"))
        if incomplete:
            items[-1]["status"] = "incomplete"
            return "failed" if failed else "incomplete", items
        return "completed", items

    async def end(self, choices: list[ChoiceOutput], usage: Usage) -> None:
        (choice,) = choices  # the Responses API has no n
        status, items = self.output(choice)
        body = self._head.body(status, items, usage)
        encoded = await self._head.kept(body, False)
        await self._http.respond(200, encoded or orjson.dumps(body))

    async def fail(self, err: RequestError) -> bool:
        """A response that existed (ResponseHead.generated) is answered (200) and kept as
        `failed`, with its error and its output so far; False otherwise (the caller answers
        with the error's HTTP status; nothing is kept)."""
        usage = self._head.generated(err, False)
        if usage is None:
            return False
        choices = self._head.progress()[0]
        _, items = self.output(choices[0], failed=True)
        body = self._head.body("failed", items, usage, error=failure(err))
        await self._head.kept_failed(body, False)
        await self._http.respond(200, orjson.dumps(body))
        return True
