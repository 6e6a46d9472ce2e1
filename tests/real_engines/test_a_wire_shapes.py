"""What the real vLLM servicer answers a gateway, against the committed fixture the mock
engine's tests compare the mock with (services/mock_engine/tests/test_real_parity.py).

Runs first (the file name): the engine has served nothing yet, so the KV replay from sequence
0 shows the servicer's warm-up exactly. With SWITCHYARD_RECORD_FIXTURES=1 the observation is
written to the fixture instead of compared (after an engine upgrade).
"""

from __future__ import annotations

import asyncio
import json
import os

import msgspec
import pytest
import zmq
from support.wire_shapes import observe

FIXTURE = (
    __import__("pathlib").Path(__file__).resolve().parents[2]
    / "services/mock_engine/tests/fixtures/vllm_real.json"
)
END = b"\xff" * 8

pytestmark = pytest.mark.timeout(600)


def replay_from_zero(endpoint: str) -> list[list[bytes]]:
    ctx = zmq.Context.instance()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(endpoint)
    try:
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        frames = []
        while dealer.poll(10_000):
            frame = dealer.recv_multipart()
            frames.append(frame)
            if frame[-2] == END:
                break
        return frames
    finally:
        dealer.close(linger=0)


def event_types(frames: list[list[bytes]]) -> list[str]:
    types = []
    for frame in frames:
        if frame[-2] == END:
            continue
        for event in msgspec.msgpack.decode(frame[-1])[1]:
            types.append(event["type"] if isinstance(event, dict) else event[0])
    return types


def warm_up(before: list[list[bytes]], after: list[list[bytes]]) -> dict[str, object]:
    """The servicer's warm-up as the KV events show it: blocks stored before any request,
    cleared only once the first request makes the engine step."""
    first, then = event_types(before), event_types(after)
    return {
        "replay_frames": sorted({len(f) for f in before + after if f[-2] != END}),
        "end_marker_frames": sorted({len(f) for f in before + after if f[-2] == END}),
        "stored_before_first_request": first.count("BlockStored") > 0,
        "cleared_before_first_request": "AllBlocksCleared" in first,
        "cleared_after_first_request": "AllBlocksCleared" in then[len(first) :],
    }


def test_the_servicer_answers_as_recorded(grpc_a):
    before = replay_from_zero(grpc_a.kv_replay)
    seen = asyncio.run(observe(f"127.0.0.1:{grpc_a.port}", grpc_a.kv_events))
    seen["warm_up"] = warm_up(before, replay_from_zero(grpc_a.kv_replay))
    if os.environ.get("SWITCHYARD_RECORD_FIXTURES"):
        FIXTURE.write_text(json.dumps(seen, indent=1, sort_keys=True) + "\n")
        pytest.skip(f"recorded {FIXTURE}")
    recorded = json.loads(FIXTURE.read_text())
    for part in sorted(set(seen) | set(recorded)):
        assert seen.get(part) == recorded.get(part), part
