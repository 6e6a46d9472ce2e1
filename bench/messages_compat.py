"""The Anthropic Messages API and tokenize, Switchyard vs smg, checked as a new user would:
the official `anthropic` SDK (and plain HTTP for tokenize) over the same mock engines.

Two SGLang-protocol mock engines with the DeepSeek-V3 chat template and a script (a question
with WEATHER? gets "Let me check." + a DeepSeek-V3 tool call; a tool result gets an answer)
serve `switchyard up --worker ...` and then smg (`smg launch --tool-call-parser deepseek`,
PyPI smg==1.13.0 in bench/.smg-venv, installed on first use). Each check runs against each
gateway and is recorded as pass, or fail with the reason (an exception or a wrong field).

    python bench/messages_compat.py            # both gateways
    python bench/messages_compat.py --no-smg   # Switchyard only

Results: bench/results/messages_compat.md. Correctness only: nothing here is timed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import httpx
from load import (
    MODEL,
    Processes,
    Progress,
    ensure_smg,
    served_tokenizer_dir,
    smg_gateway,
    start_engines,
    switchyard_stack,
)

from switchyard.preprocessor.parsers.deepseek import (
    CALL_BEGIN,
    CALL_END,
    CALLS_BEGIN,
    CALLS_END,
    SEP,
)

HERE = Path(__file__).resolve().parent
ARGS = {"city": "Paris"}
QUESTION = "What is the WEATHER? in Paris"
TOOL_RESULT = "sunny, 21C"
ANSWER = "It is sunny in Paris."
CALL = (
    f"{CALLS_BEGIN}{CALL_BEGIN}function{SEP}get_weather\n```json\n{json.dumps(ARGS)}\n```"
    f"{CALL_END}{CALLS_END}"
)
SCRIPT = [
    {"marker": "WEATHER?", "output": "Let me check." + CALL},
    {"marker": TOOL_RESULT, "output": ANSWER},
]
TOOLS = [
    {
        "name": "get_weather",
        "description": "The weather in a city",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def billed(message: Any) -> int:
    u = message.usage
    return u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0)


class Failed(Exception):
    pass


def expect(ok: bool, what: str) -> None:
    if not ok:
        raise Failed(what)


# --- the checks: (name, fn(client, base_url)) --------------------------------------------------


def create(c: anthropic.Anthropic, base: str) -> None:
    m = c.messages.create(model=MODEL, max_tokens=8, messages=user("say something"))
    expect(m.type == "message" and m.role == "assistant", f"type/role {m.type}/{m.role}")
    expect(m.stop_reason in ("end_turn", "max_tokens"), f"stop_reason {m.stop_reason}")
    expect(1 <= m.usage.output_tokens <= 8, f"output_tokens {m.usage.output_tokens}")


def max_tokens_cut(c: anthropic.Anthropic, base: str) -> None:
    # The scripted answer to the question is longer than 3 tokens.
    m = c.messages.create(model=MODEL, max_tokens=3, messages=user(QUESTION))
    expect(m.stop_reason == "max_tokens", f"stop_reason {m.stop_reason}")
    expect(m.usage.output_tokens == 3, f"output_tokens {m.usage.output_tokens}")


def stream_text(c: anthropic.Anthropic, base: str) -> None:
    with c.messages.stream(model=MODEL, max_tokens=12, messages=user("tell me more")) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    got = final.content[0].text if final.content else ""
    expect(got == text, "final text != streamed text")
    expect(final.usage.output_tokens >= 1, "no output_tokens")


def stream_events(c: anthropic.Anthropic, base: str) -> None:
    with c.messages.with_streaming_response.create(
        model=MODEL, max_tokens=64, messages=user(QUESTION), tools=TOOLS, stream=True
    ) as r:
        lines = [line for line in r.iter_lines() if line]
    names = [line[7:] for line in lines if line.startswith("event: ")]
    datas = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    expect(names == [d["type"] for d in datas], "event names != data types")
    want = {"message_start", "ping", "content_block_start", "content_block_delta",
            "content_block_stop", "message_delta", "message_stop"}  # fmt: skip
    expect(want <= set(names), f"missing events {sorted(want - set(names))}")
    deltas = {d["delta"]["type"] for d in datas if d["type"] == "content_block_delta"}
    expect({"text_delta", "input_json_delta"} <= deltas, f"deltas {sorted(deltas)}")


def system_and_stop(c: anthropic.Anthropic, base: str) -> None:
    m = c.messages.create(
        model=MODEL, max_tokens=64, system=[{"type": "text", "text": "Be brief."}],
        messages=user(QUESTION), stop_sequences=["check"],
    )  # fmt: skip
    expect(m.stop_reason == "stop_sequence", f"stop_reason {m.stop_reason}")
    expect(m.stop_sequence == "check", f"stop_sequence {m.stop_sequence!r}")
    expect(m.content[0].text == "Let me ", f"text {m.content[0].text!r}")


def tool_use(c: anthropic.Anthropic, base: str) -> None:
    m = c.messages.create(model=MODEL, max_tokens=128, messages=user(QUESTION), tools=TOOLS)
    expect(m.stop_reason == "tool_use", f"stop_reason {m.stop_reason}")
    uses = [b for b in m.content if b.type == "tool_use"]
    expect(len(uses) == 1 and uses[0].input == ARGS, f"content {m.content}")


def tool_use_stream(c: anthropic.Anthropic, base: str) -> None:
    with c.messages.stream(model=MODEL, max_tokens=128, messages=user(QUESTION), tools=TOOLS) as s:
        kinds = {e.type for e in s}
        final = s.get_final_message()
    expect("input_json" in kinds, "no input_json_delta")
    uses = [b for b in final.content if b.type == "tool_use"]
    expect(len(uses) == 1 and uses[0].input == ARGS, f"content {final.content}")


def tool_loop(c: anthropic.Anthropic, base: str) -> None:
    first = c.messages.create(model=MODEL, max_tokens=128, messages=user(QUESTION), tools=TOOLS)
    use = next(b for b in first.content if b.type == "tool_use")
    history = [
        *user(QUESTION),
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": use.id, "content": TOOL_RESULT}
        ]},
    ]  # fmt: skip
    m = c.messages.create(model=MODEL, max_tokens=64, messages=history, tools=TOOLS)
    expect(m.stop_reason == "end_turn", f"stop_reason {m.stop_reason}")
    expect([b.type for b in m.content] == ["text"] and m.content[0].text == ANSWER,
           f"content {m.content}")  # fmt: skip


def unanswered_tool_use(c: anthropic.Anthropic, base: str) -> None:
    """A tool_use not answered by a tool_result in the next message: Anthropic's 400."""
    use = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": ARGS}
    history = [
        *user(QUESTION),
        {"role": "assistant", "content": [{"type": "text", "text": "Let me check."}, use]},
        *user("go on"),
    ]
    try:
        c.messages.create(model=MODEL, max_tokens=8, messages=history, tools=TOOLS)
    except anthropic.BadRequestError as exc:
        expect("toolu_1" in str(exc.body), f"the id is not named: {exc.body}")
        return
    raise Failed("accepted")


def max_tokens_required(c: anthropic.Anthropic, base: str) -> None:
    try:
        c.messages.create(model=MODEL, messages=user("x"), max_tokens=anthropic.omit, timeout=30)
    except anthropic.BadRequestError as exc:
        body = exc.body
        expect(isinstance(body, dict) and body.get("type") == "error", f"body {body}")
        expect(body["error"]["type"] == "invalid_request_error", f"body {body}")
        return
    raise Failed("accepted without max_tokens")


def error_shapes(c: anthropic.Anthropic, base: str) -> None:
    try:
        c.messages.create(model="no-such-model", max_tokens=4, messages=user("x"))
    except anthropic.APIStatusError as exc:
        body = exc.body
        expect(exc.status_code == 404, f"unknown model: HTTP {exc.status_code}")
        shaped = isinstance(body, dict) and body.get("type") == "error"
        expect(shaped and body["error"]["type"] == "not_found_error", f"unknown model: {body}")
    else:
        raise Failed("unknown model accepted")
    try:
        c.messages.create(model=MODEL, max_tokens=4, messages=user("x"),
                          extra_body={"unknown_thing": 1})  # fmt: skip
    except anthropic.BadRequestError as exc:
        expect("unknown_thing" in str(exc.body), f"unknown field not named: {exc.body}")
    else:
        raise Failed("unknown field accepted silently")


def count_tokens(c: anthropic.Anthropic, base: str) -> None:
    for extra in ({}, {"system": "Be brief.", "tools": TOOLS}):
        n = c.messages.count_tokens(model=MODEL, messages=user(QUESTION), **extra)
        m = c.messages.create(model=MODEL, max_tokens=2, messages=user(QUESTION), **extra)
        expect(n.input_tokens == billed(m), f"count {n.input_tokens} != billed {billed(m)}")


def metadata_user_id(c: anthropic.Anthropic, base: str) -> None:
    m = c.messages.create(
        model=MODEL, max_tokens=2, messages=user("hi"), metadata={"user_id": "user-7"}
    )
    expect(m.usage.output_tokens >= 1, "no output")


def tokenize_prompt(c: anthropic.Anthropic, base: str) -> None:
    """A text's tokens: their count is a completion's prompt_tokens; detokenized and tokenized
    again (no special tokens added) they are the same ids (or the same less a leading BOS,
    for a detokenizer that skips special tokens)."""
    completion = httpx.post(base + "/v1/completions", timeout=30, json={
        "model": MODEL, "prompt": QUESTION, "max_tokens": 1
    }).json()  # fmt: skip
    got = httpx.post(base + "/v1/tokenize", timeout=30, json={"model": MODEL, "prompt": QUESTION})
    expect(got.status_code == 200, f"HTTP {got.status_code} {got.text[:120]}")
    tokens = got.json()["tokens"]
    prompt_tokens = completion["usage"]["prompt_tokens"]
    expect(len(tokens) == prompt_tokens, f"{len(tokens)} tokens != prompt_tokens {prompt_tokens}")
    text = httpx.post(base + "/v1/detokenize", timeout=30, json={"model": MODEL, "tokens": tokens})
    expect(text.status_code == 200, f"/v1/detokenize: HTTP {text.status_code} {text.text[:120]}")
    detok = text.json()
    expect("prompt" in detok, f"/v1/detokenize answered {str(detok)[:100]} (vLLM's key: prompt)")
    again = httpx.post(base + "/v1/tokenize", timeout=30, json={
        "model": MODEL, "prompt": detok["prompt"], "add_special_tokens": False
    })  # fmt: skip
    expect(again.status_code == 200, f"HTTP {again.status_code} {again.text[:120]}")
    body = again.json()
    expect(body["tokens"] in (tokens, tokens[1:]), "tokenize(detokenize(t)) != t")


def tokenize_messages(c: anthropic.Anthropic, base: str) -> None:
    """vLLM's `messages` form: the chat template's prompt, as many tokens as chat bills."""
    chat = httpx.post(base + "/v1/chat/completions", timeout=30, json={
        "model": MODEL, "messages": user(QUESTION), "max_tokens": 1
    }).json()  # fmt: skip
    got = httpx.post(base + "/v1/tokenize", timeout=30,
                     json={"model": MODEL, "messages": user(QUESTION)})  # fmt: skip
    expect(got.status_code == 200, f"HTTP {got.status_code} {got.text[:120]}")
    count = len(got.json()["tokens"])
    prompt_tokens = chat["usage"]["prompt_tokens"]
    expect(count == prompt_tokens, f"{count} tokens != prompt_tokens {prompt_tokens}")


CHECKS: list[tuple[str, Callable[[anthropic.Anthropic, str], None]]] = [
    ("create", create),
    ("stop_reason max_tokens", max_tokens_cut),
    ("stream: text", stream_text),
    ("stream: every event type incl. ping", stream_events),
    ("system blocks + stop_sequences", system_and_stop),
    ("tool_use (input parsed)", tool_use),
    ("tool_use streamed (input_json_delta)", tool_use_stream),
    ("tool loop with tool_result", tool_loop),
    ("tool_use without tool_result: 400", unanswered_tool_use),
    ("max_tokens required (400, Anthropic shape)", max_tokens_required),
    ("errors: 404 model, 400 unknown field", error_shapes),
    ("count_tokens == billed input", count_tokens),
    ("metadata.user_id", metadata_user_id),
    ("/v1/tokenize prompt + /v1/detokenize round trip", tokenize_prompt),
    ("/v1/tokenize messages (chat template)", tokenize_messages),
]


def run_checks(base: str) -> dict[str, str]:
    out: dict[str, str] = {}
    with anthropic.Anthropic(base_url=base, api_key="x", max_retries=0, timeout=60) as client:
        for name, check in CHECKS:
            try:
                check(client, base)
                out[name] = "pass"
            except Failed as exc:
                out[name] = f"FAIL: {exc}"
            except Exception as exc:  # a gateway's answer the SDK could not take
                text = str(exc).replace("\n", " ")[:160]
                out[name] = f"FAIL: {type(exc).__name__}: {text}"
                traceback.print_exc(file=sys.stderr)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-smg", action="store_true")
    parser.add_argument("--smg-spec", default="smg==1.13.0")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "messages_compat.md")
    args = parser.parse_args()
    progress = Progress(0)
    results: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory(prefix="messages-compat-") as tmp:
        procs = Processes(Path(tmp))
        try:
            tokenizer, template = served_tokenizer_dir(Path(tmp) / "tokenizer")
            script = Path(tmp) / "script.json"
            script.write_text(json.dumps(SCRIPT))
            _, urls, kv_urls = start_engines(
                procs, 2, tokenizer, 5.0, 2.0, extra=["--script", str(script)]
            )
            with switchyard_stack(procs, "switchyard", kv_urls, "kv") as (base, _):
                results["switchyard"] = run_checks(base)
            if not args.no_smg:
                exe = ensure_smg(HERE / ".smg-venv", args.smg_spec, progress)
                extra = ["--tool-call-parser", "deepseek"]
                with smg_gateway(procs, exe, urls, tokenizer, template, "round_robin", extra) as (
                    base,
                    _,
                ):
                    results[f"smg ({args.smg_spec})"] = run_checks(base)
        finally:
            procs.stop_all()
    names = list(results)
    lines = [
        "# Anthropic Messages API and tokenize: Switchyard vs smg (bench/messages_compat.py)",
        "",
        "| check | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for check, _ in CHECKS:
        lines.append(f"| {check} | " + " | ".join(results[n][check] for n in names) + " |")
    for n in names:
        passed = sum(v == "pass" for v in results[n].values())
        lines.append(f"\n{n}: {passed}/{len(CHECKS)} pass")
    text = "\n".join(lines) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
