"""Items as they are stored and shown back: a request's `input` (or a conversation's new
items) with an id and a status each, in the object shapes OpenAI returns them in.

    "hi" / {"role": "user", "content": "hi"}
        -> {"id": "msg_...", "type": "message", "status": "completed", "role": "user",
            "content": [{"type": "input_text", "text": "hi"}]}
    an assistant's string content -> one output_text part (annotations [], logprobs [])
    function_call, function_call_output, reasoning items -> the same with an id
        (fc_, fco_, rs_) and status "completed"

Each item gets a new id (a client passing back an earlier output keeps it unique). Items
are checked as /v1/responses checks its input (responses_requests.input_messages: the
same 400s), so what is stored can always be fed back into a prompt.
"""

from __future__ import annotations

import uuid
from typing import Any

import msgspec

from . import responses_schema as schema
from .errors import INVALID_TYPE, InvalidRequestError
from .openai_requests import convert_at
from .responses_requests import input_messages

PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def new_id(kind: str) -> str:
    return f"{PREFIX[kind]}_{uuid.uuid4().hex}"


def stored_items(
    given: str | list[Any], where: str = "input", checked: bool = False
) -> list[dict[str, Any]]:
    """A request's input -> the items kept for it (InvalidRequestError naming `where`).
    `checked`: the input already went through input_messages (a parsed request's)."""
    items = [{"role": "user", "content": given}] if isinstance(given, str) else given
    if not checked:
        input_messages(items, where)  # every check the prompt makes, before anything is kept
    return [_stored(item, f"{where}[{i}]") for i, item in enumerate(items)]


def _stored(item: dict[str, Any], where: str) -> dict[str, Any]:
    kind = item.get("type", "message")
    if kind == "message":
        msg: schema.MessageItem = convert_at(item, schema.MessageItem, where)
        out: dict[str, Any] = {
            "id": new_id(kind),
            "type": kind,
            "status": "completed",
            "role": msg.role,
            "content": _parts(msg.role, msg.content),
        }
        if msg.phase is not None:
            out["phase"] = msg.phase
        return out
    if kind == "function_call":
        call: schema.FunctionCallItem = convert_at(item, schema.FunctionCallItem, where)
        return {
            "id": new_id(kind),
            "type": kind,
            "status": "completed",
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments,
        }
    if kind == "function_call_output":
        result: schema.FunctionCallOutputItem = convert_at(
            item, schema.FunctionCallOutputItem, where
        )
        output = result.output
        return {
            "id": new_id(kind),
            "type": kind,
            "status": "completed",
            "call_id": result.call_id,
            "output": output if isinstance(output, str) else msgspec.to_builtins(output),
        }
    if kind == "reasoning":
        thought: schema.ReasoningItem = convert_at(item, schema.ReasoningItem, where)
        return {
            "id": new_id(kind),
            "type": kind,
            "summary": msgspec.to_builtins(thought.summary),
            "content": msgspec.to_builtins(thought.content or []),
            "status": "completed",
        }
    raise InvalidRequestError(f"Invalid item type at '{where}.type'.", INVALID_TYPE, where)


def _parts(role: str, content: str | list[Any]) -> list[dict[str, Any]]:
    if isinstance(content, str):
        if role == "assistant":
            return [{"type": "output_text", "text": content, "annotations": [], "logprobs": []}]
        return [{"type": "input_text", "text": content}]
    parts = []
    for part in content:
        shown = msgspec.to_builtins(part)
        if type(part) is schema.OutputText:
            shown.setdefault("annotations", [])
            shown.setdefault("logprobs", [])
        parts.append(shown)
    return parts
