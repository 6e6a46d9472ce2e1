"""The Anthropic Messages API's own stage (thinking) and its output: the message object, its
SSE events, and the two sinks.

`thinking` (after `model`, before `template`) says the request's `thinking` in the model's
own terms: the chat template's thinking switch (`enable_thinking` / `thinking`, whichever
the template reads) on or off. A model without a reasoning parser cannot think (enabled is a
400 naming `thinking`); one that always reasons and has no switch cannot stop (disabled is a
400). Left out, the model does what its template does by default.

The token loop feeds these sinks exactly as it feeds chat's (stages.sinks.Sink); one choice's
(content, reasoning, tool-call) deltas become content blocks, in the order the model writes
them:

    thinking    {"type": "thinking", "thinking", "signature"}  (reasoning parser's text)
    text        {"type": "text", "text"}
    tool_use    {"type": "tool_use", "id", "name", "input"}     (parsed arguments)

`MessageStreamSink` streams message_start (and a ping) with the first output, then per
block content_block_start, content_block_delta (text_delta / thinking_delta /
input_json_delta; a thinking block ends with its signature_delta), content_block_stop, and
at the end message_delta (stop_reason, stop_sequence, usage) and message_stop. Nothing is
written before the first output, so a request that fails before it gets an HTTP error
status; a failure after it is an `error` event. `MessageCollectSink` answers once with the
whole message. stop_reason: end_turn, max_tokens, stop_sequence (with `stop_sequence`, the
string), tool_use. usage: input_tokens (the prompt tokens not read from the prefix cache),
cache_read_input_tokens (read from it), cache_creation_input_tokens 0, output_tokens
(thinking included); input_tokens + cache_read_input_tokens is what count_tokens counts.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import orjson

from switchyard.preprocessor.anthropic_requests import THINKING_ON, MessagesRequest
from switchyard.preprocessor.errors import UNSUPPORTED_VALUE, InvalidRequestError, RequestError
from switchyard.preprocessor.parsers import ParsedDelta, ToolCallDelta
from switchyard.preprocessor.stages.choice import ChoiceOutput
from switchyard.preprocessor.stages.context import HttpOut, RequestContext
from switchyard.preprocessor.stages.sinks import PartStream, Usage

TEXT, THINKING, TOOL_USE = "text", "thinking", "tool_use"
_DELTA = {TEXT: b"text_delta", THINKING: b"thinking_delta", TOOL_USE: b"input_json_delta"}
_FIELD = {TEXT: b"text", THINKING: b"thinking", TOOL_USE: b"partial_json"}
PING = b'event: ping\ndata: {"type":"ping"}\n\n'


# --- the thinking stage ---------------------------------------------------------------------


def thinking(ctx: RequestContext) -> None:
    req = ctx.request
    assert isinstance(req, MessagesRequest)
    if req.thinking is None:
        return
    assert ctx.tokenizer is not None
    reasoning = ctx.parsers.reasoning if ctx.parsers is not None else None
    on = req.thinking in THINKING_ON
    model = req.model
    if reasoning is None:
        if on:
            raise InvalidRequestError(
                f"Model {model!r} does not think: it has no reasoning parser (--reasoning-parser).",
                UNSUPPORTED_VALUE,
                "thinking",
            )
        return  # disabled, and it never thinks
    source = ctx.tokenizer.chat_template.source
    switches = [name for name in reasoning.switches if name in source]
    if not switches:
        if not on:
            raise InvalidRequestError(
                f"Thinking cannot be disabled for model {model!r}: its chat template has no "
                "thinking switch, and the model may reason anyway.",
                UNSUPPORTED_VALUE,
                "thinking",
            )
        return  # it reasons on its own terms
    kwargs = {**req.template_kwargs, **dict.fromkeys(switches, on)}
    ctx.body = dataclasses.replace(req, template_kwargs=kwargs)


# --- the message object -----------------------------------------------------------------------


def stop_reason(choice: ChoiceOutput) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a finished choice."""
    reason = choice.finish_reason
    if reason == "length":
        return "max_tokens", None
    if reason == "tool_calls":
        return "tool_use", None
    matched = choice.stop_sequence
    if matched is not None:
        return "stop_sequence", matched
    return "end_turn", None


def usage_dict(usage: Usage, final: bool = True) -> dict[str, Any]:
    cached = usage.cached_tokens if final else 0
    return {
        "input_tokens": usage.prompt_tokens - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": usage.completion_tokens if final else 0,
    }


def signature(text: str) -> str:
    """A thinking block's signature: opaque to clients, made of its text (nothing is checked
    when it comes back)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def parsed_input(arguments: str) -> Any:
    """A call's arguments as the tool_use block's input (an object; {} when empty)."""
    if not arguments.strip():
        return {}
    try:
        return orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {"arguments": arguments}  # only a streamed call cut by max_tokens


class MessageHead:
    """What every message object of one request shares: id, model, prompt tokens."""

    __slots__ = ("id", "model", "prompt_tokens", "omit_thinking")

    def __init__(self, message_id: str, model: str, prompt_tokens: int, omit: bool) -> None:
        self.id = message_id
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.omit_thinking = omit  # thinking.display "omitted"

    def body(
        self,
        content: list[dict[str, Any]],
        reason: str | None,
        sequence: str | None,
        usage: dict[str, Any],
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": usage,
        }


def error_event(err: RequestError) -> bytes:
    return b"event: error\ndata: %s\n\n" % err.body()


# --- streaming --------------------------------------------------------------------------------


_DELTA_HEAD = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d,'
_DELTA_HEAD += b'"delta":{"type":"%s","%s":'


class _Block:
    __slots__ = ("kind", "index", "parts", "head")

    def __init__(self, kind: str, index: int) -> None:
        self.kind = kind
        self.index = index
        self.parts: list[str] = []  # its text (a thinking block's signature is made of it)
        self.head = _DELTA_HEAD % (index, _DELTA[kind], _FIELD[kind])  # its deltas' constant start


class MessageStreamSink(PartStream):
    __slots__ = ("_head", "_count", "_announced", "_reason")

    TEXT, REASONING, CALL = TEXT, THINKING, TOOL_USE

    def __init__(self, http: HttpOut, head: MessageHead) -> None:
        super().__init__(http)
        self._head = head
        self._count = 0  # blocks opened
        self._announced = False
        self._reason: tuple[str, str | None] = ("end_turn", None)

    def _event(self, name: str, fields: dict[str, Any]) -> None:
        data = orjson.dumps({"type": name, **fields})
        self._out.append(b"event: %s\ndata: %s\n\n" % (name.encode(), data))

    def _announce(self) -> None:
        if not self._announced:
            self._announced = True
            head = self._head
            usage = {
                "input_tokens": head.prompt_tokens,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "output_tokens": 0,
            }
            self._event("message_start", {"message": head.body([], None, None, usage)})
            self._out.append(PING)

    def _delta(self) -> None:
        pending, block = self._pending, self._part
        if not pending or block is None:
            return
        text = pending[0] if len(pending) == 1 else "".join(pending)
        pending.clear()
        if block.kind == THINKING and self._head.omit_thinking:
            return
        self._out.append(b"%s%s}}\n\n" % (block.head, orjson.dumps(text)))

    def _open(self, kind: str, call: ToolCallDelta | None = None) -> _Block:
        self._announce()
        self._close()
        block = _Block(kind, self._count)
        self._opened(block)
        self._count += 1
        if kind == TEXT:
            start: dict[str, Any] = {"type": TEXT, "text": ""}
        elif kind == THINKING:
            start = {"type": THINKING, "thinking": "", "signature": ""}
        else:
            assert call is not None
            start = {"type": TOOL_USE, "id": call.id or "", "name": call.name or "", "input": {}}
        self._event("content_block_start", {"index": block.index, "content_block": start})
        return block

    def _close(self) -> None:
        block = self._part
        if block is None:
            return
        self._delta()
        if block.kind == THINKING:
            sig = signature("".join(block.parts))
            delta = {"type": "signature_delta", "signature": sig}
            self._event("content_block_delta", {"index": block.index, "delta": delta})
        self._event("content_block_stop", {"index": block.index})
        self._closed()

    # --- the token loop's calls (the rest are PartStream's) --------------------------------

    def finish(self, choice: ChoiceOutput) -> None:
        self._reason = stop_reason(choice)
        self._announce()
        self._close()

    def _queue_held(self) -> None:
        self._delta()

    async def end(self, choices: list[ChoiceOutput], usage: Usage) -> None:
        self._announce()
        self._close()
        reason, sequence = self._reason
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        self._event("message_delta", {"delta": delta, "usage": usage_dict(usage)})
        self._event("message_stop", {})
        await self._last()

    async def fail(self, err: RequestError) -> bool:
        """An error event inside the stream; False when nothing was sent yet (the caller
        then answers with the error's HTTP status). `err` is in Anthropic's shape."""
        if not self.started:
            self._out.clear()
            self._pending.clear()
            return False
        self._delta()
        self._out.append(error_event(err))
        await self._last()
        return True


# --- not streaming ------------------------------------------------------------------------------


class MessageCollectSink:
    """The whole message at the end."""

    __slots__ = ("_http", "_head", "_blocks")

    started = False

    def __init__(self, http: HttpOut, head: MessageHead) -> None:
        self._http = http
        self._head = head
        self._blocks: list[list[str]] = []  # [kind, text...] per block, in the model's order

    def _add(self, kind: str, text: str) -> None:
        blocks = self._blocks
        if not blocks or blocks[-1][0] != kind:
            blocks.append([kind])
        blocks[-1].append(text)

    def content(self, choice: ChoiceOutput, text: str) -> None:
        self._add(TEXT, text)

    def echo(self, choice: ChoiceOutput) -> None:
        choice.echoed = True

    def parsed(self, choice: ChoiceOutput, parsed: ParsedDelta) -> None:
        if parsed[1]:
            self._add(THINKING, parsed[1])
        if parsed[0]:
            self._add(TEXT, parsed[0])

    def logprobs(self, choice: ChoiceOutput, part: Any) -> None:
        pass

    def finish(self, choice: ChoiceOutput) -> None:
        pass

    async def flush(self) -> None:
        pass

    def content_blocks(self, choice: ChoiceOutput) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for kind, *parts in self._blocks:
            text = "".join(parts)
            if kind == THINKING:
                shown = "" if self._head.omit_thinking else text
                out.append({"type": THINKING, "thinking": shown, "signature": signature(text)})
            elif text:
                out.append({"type": TEXT, "text": text})
        for call in choice.parser.calls if choice.parser is not None else ():
            block = {"type": TOOL_USE, "id": call.id, "name": call.name}
            out.append({**block, "input": parsed_input(call.arguments)})
        return out

    async def end(self, choices: list[ChoiceOutput], usage: Usage) -> None:
        (choice,) = choices  # the Messages API has no n
        reason, sequence = stop_reason(choice)
        body = self._head.body(self.content_blocks(choice), reason, sequence, usage_dict(usage))
        await self._http.respond(200, orjson.dumps(body))

    async def fail(self, err: RequestError) -> bool:
        return False


def sink(ctx: RequestContext) -> MessageStreamSink | MessageCollectSink:
    req = ctx.request
    assert isinstance(req, MessagesRequest)
    prompt = sum(len(ids) for ids in ctx.prompt_ids)
    head = MessageHead(ctx.inp.request_id, req.model, prompt, req.thinking_omitted)
    http = ctx.inp.http
    return MessageStreamSink(http, head) if req.stream else MessageCollectSink(http, head)
