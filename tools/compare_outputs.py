"""Same requests, two checkouts: are the answers byte for byte the same?

Starts `switchyard up` on one mock engine from each checkout (its own .venv, from its own
folder), sends the same fixed requests (chat and completions, streamed and not, n > 1,
logprobs, stop strings, echo, JSON mode, the Responses API, errors), and compares the
response bodies with what must differ masked: ids and timestamps. The mock engines run slow
steps (--itl-ms, 40 ms by default) so that each token arrives alone and the streams' chunk
boundaries do not depend on the machine's load, and the dispatchers hold no reply back for a
reply window (`--reply-window-ms=0`, where the checkout has it): a window of a few ms merges
tokens that a stalled engine sends late into one chunk. Both engine protocols (SGLang, vLLM).

    python tools/compare_outputs.py --ref ../before     # that checkout vs this one
    python tools/compare_outputs.py --ref ../before --mask conversation

`--mask FIELD` drops a `"FIELD":null` the other side does not have (a field added on purpose
between the two). Exit status 1 when any answer differs.
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from switchyard.common.ports import read_ready_file

ROOT = Path(__file__).resolve().parent.parent
MODEL = "deepseek-mock"


def _chat(content: str, **fields: Any) -> tuple[str, dict[str, Any]]:
    body = {"messages": [{"role": "user", "content": content}], "temperature": 0, **fields}
    return "/v1/chat/completions", body


def _completion(prompt: str | list[str], **fields: Any) -> tuple[str, dict[str, Any]]:
    return "/v1/completions", {"prompt": prompt, "temperature": 0, **fields}


def _response(text: str, **fields: Any) -> tuple[str, dict[str, Any]]:
    # store off: an older checkout may have ignored it, and a stored response is no output
    return "/v1/responses", {"input": text, "temperature": 0, "store": False, **fields}


REQUESTS = [
    _chat("The sea.", max_tokens=40, stream=True, stream_options={"include_usage": True}),
    _chat("Hello there", max_tokens=25, n=3),
    _chat("Count for me", max_tokens=30, n=2, stream=True, logprobs=True, top_logprobs=2),
    _chat("Stop strings please", max_tokens=60, stop=["e", "the"], stream=True),
    _chat("JSON?", max_tokens=30, response_format={"type": "json_object"}),
    _completion("Once upon a time", max_tokens=30, stream=True, logprobs=2),
    _completion(["a b c", "d e f"], max_tokens=20, n=2),
    _completion("Echo me", max_tokens=10, echo=True),
    _response("A haiku about rivers", max_output_tokens=30, stream=True),
    _response("Short answer", max_output_tokens=20),
    ("/v1/embeddings", {"input": ["one two", "three"]}),  # a generation model: a 400
    _chat("x", max_tokens=-1),
    _chat("x", bogus_field=1),
]
MASKS = [
    (re.compile(rb'"(id|response_id|item_id)":"[^"]*"'), rb'"\1":"X"'),
    (re.compile(rb'"(created|created_at|completed_at)":[0-9.]+'), rb'"\1":0'),
    (re.compile(rb'"system_fingerprint":"[^"]*"'), rb'"system_fingerprint":"X"'),
    (re.compile(rb"(chatcmpl|cmpl|resp|msg|rs|fc)[-_][A-Za-z0-9-]+"), rb"\1-X"),
]


def masked(body: bytes, fields: list[str]) -> bytes:
    for pattern, replacement in MASKS:
        body = pattern.sub(replacement, body)
    for field in fields:
        body = body.replace(b',"' + field.encode() + b'":null', b"")
    return body


def answers(checkout: Path, protocol: str, itl_ms: float, fields: list[str]) -> list[bytes]:
    """Each request's status and masked body, from `checkout`'s stack on one mock engine."""
    with tempfile.TemporaryDirectory(prefix="compare-") as folder:
        ready = Path(folder) / "ready.json"
        argv = [str(checkout / ".venv" / "bin" / "python"), "-m", "switchyard", "up"]
        argv += ["--mock-engines", protocol, "--mock-itl-ms", str(itl_ms), "--http-port", "0"]
        argv += ["--log-level", "WARNING", "--ready-file", str(ready)]
        if "--reply-window-ms" in (checkout / "services/dispatcher/cli.py").read_text():
            argv.append("--dispatcher-arg=--reply-window-ms=0")
        # From the checkout's folder: `python -m` puts the working directory first on sys.path.
        proc = subprocess.Popen(
            argv, cwd=checkout, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            base = read_ready_file(ready, proc, 180)["base_url"]
            with httpx.Client(timeout=60) as client:
                _wait_ready(client, base, proc)
                out = []
                for path, body in REQUESTS:
                    reply = client.post(base + path, json={"model": MODEL, **body})
                    out.append(b"%d " % reply.status_code + masked(reply.content, fields))
                return out
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_ready(client: httpx.Client, base: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if client.get(base + "/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the stack at {base} did not become ready")


def first_difference(a: bytes, b: bytes) -> str:
    at = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
    window = slice(max(0, at - 80), at + 120)
    return f"at byte {at}:\n  ref:  {a[window]!r}\n  this: {b[window]!r}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ref", type=Path, required=True, help="the other checkout (with .venv)")
    parser.add_argument("--itl-ms", type=float, default=40.0, help="mock engines' step time")
    parser.add_argument("--mask", action="append", default=[], help="a field added on purpose")
    args = parser.parse_args()
    differ = 0
    for protocol in ("sglang", "vllm"):
        ref = answers(args.ref.resolve(), protocol, args.itl_ms, args.mask)
        this = answers(ROOT, protocol, args.itl_ms, args.mask)
        for (path, _), a, b in zip(REQUESTS, ref, this, strict=True):
            verdict = "same" if a == b else "DIFFERENT"
            print(f"{protocol:6} {path:22} {len(b):6} bytes  {verdict}")
            if a != b:
                differ += 1
                print(first_difference(a, b))
    print(f"{differ} of {2 * len(REQUESTS)} answers differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
