"""The C frame reader (_frames.c) against the pure-Python one (frames.py), and the relay's
reading of messages against protobuf's.

Parity: any sequence of reads, relays and forgets, over frames that are well made or not
(engine-like streams with random fields, cut anywhere, with random bytes mixed in), gives the
same events, the same batch bytes at every step and the same counters in both forms.
Soundness: a message the relay reads as a plain chunk is one for protobuf too, with the same
token ids; the rest it leaves to protobuf.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from smg_grpc_proto.generated import sglang_scheduler_pb2 as spb
from smg_grpc_proto.generated import vllm_engine_pb2 as vpb

from switchyard.common.engines import frames

STREAMS = (1, 3, 5)
U32 = 2**32 - 1

ids = st.lists(
    st.one_of(st.integers(0, 127), st.integers(0, 70000), st.integers(0, U32)), max_size=6
)
counts = st.integers(0, U32)


@st.composite
def sglang_message(draw) -> bytes:
    chunk = spb.GenerateStreamChunk(
        token_ids=draw(ids),
        prompt_tokens=draw(counts),
        completion_tokens=draw(counts),
        cached_tokens=draw(st.sampled_from([0, draw(counts)])),
        index=draw(st.sampled_from([0, 0, 1])),
        reasoning_tokens=draw(st.sampled_from([0, 3])),
    )
    if draw(st.integers(0, 9)) == 0:
        chunk.output_logprobs.token_logprobs.append(-0.5)
    rid = draw(st.sampled_from(["r", "chatcmpl-1", "", "r", "é"]))
    if draw(st.integers(0, 5)) == 0:
        done = spb.GenerateComplete(output_ids=draw(ids), finish_reason="stop")
        return spb.GenerateResponse(request_id=rid, complete=done).SerializeToString()
    return spb.GenerateResponse(request_id=rid, chunk=chunk).SerializeToString()


@st.composite
def vllm_message(draw) -> bytes:
    chunk = vpb.GenerateStreamChunk(
        token_ids=draw(ids),
        prompt_tokens=draw(counts),
        completion_tokens=draw(counts),
        index=draw(st.sampled_from([0, 0, 2])),
    )
    if draw(st.integers(0, 9)) == 0:
        chunk.input_logprobs.token_logprobs.add()
    if draw(st.integers(0, 5)) == 0:
        done = vpb.GenerateComplete(output_ids=draw(ids), finish_reason="length")
        return vpb.GenerateResponse(complete=done).SerializeToString()
    return vpb.GenerateResponse(chunk=chunk).SerializeToString()


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@st.composite
def handmade_message(draw) -> bytes:
    """Fields protobuf encoders do not write but parsers must read: unpacked and overlong
    varints, repeated fields, unknown fields, odd wire types, truncations."""
    layout = draw(st.sampled_from([frames.SGLANG, frames.VLLM]))
    inner = bytearray()
    for _ in range(draw(st.integers(0, 4))):
        field = draw(st.sampled_from([1, 1, 2, 3, 4, 5, 7, 8, 9, 15]))
        wire = draw(st.sampled_from([0, 0, 2, 1, 5]))
        inner += _varint(field << 3 | wire)
        if wire == 0:
            value = draw(st.one_of(st.integers(0, U32), st.integers(0, 2**64 - 1)))
            encoded = _varint(value)
            if draw(st.booleans()):
                encoded = encoded[:-1] + bytes((encoded[-1] | 0x80, 0))  # overlong
            inner += encoded
        elif wire == 2:
            body = b"".join(_varint(v) for v in draw(ids))
            inner += _varint(len(body)) + body
        else:
            inner += draw(st.binary(min_size=0, max_size=8))
    outer = bytearray()
    if layout == frames.SGLANG and draw(st.booleans()):
        rid = draw(st.sampled_from([b"r", b"\xc3\xa9", b"\xff", b""]))
        outer += b"\x0a" + _varint(len(rid)) + rid
    for _ in range(draw(st.integers(1, 2))):
        field = draw(st.sampled_from([layout, layout, layout, 3, 6]))
        outer += _varint(field << 3 | 2) + _varint(len(inner)) + inner
    if draw(st.integers(0, 4)) == 0:
        outer = outer[: draw(st.integers(0, len(outer)))]
    return bytes(outer)


any_message = st.one_of(
    sglang_message(), vllm_message(), handmade_message(), st.binary(max_size=24)
)


def grpc(body: bytes, compressed: bool = False) -> bytes:
    return bytes((1 if compressed else 0,)) + struct.pack(">I", len(body)) + body


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    size = len(payload)
    return (
        bytes((size >> 16, size >> 8 & 0xFF, size & 0xFF, kind, flags))
        + struct.pack(">I", stream)
        + payload
    )


def family_message(layout: int) -> st.SearchStrategy[bytes]:
    """Mostly what an engine of the family sends, sometimes anything."""
    own = sglang_message() if layout == frames.SGLANG else vllm_message()
    return st.one_of(own, own, own, any_message)


@st.composite
def wire(draw, layouts: dict[int, int]) -> bytes:
    """A connection's bytes: DATA frames carrying gRPC messages (cut anywhere across frames),
    headers, control frames and noise."""
    out = bytearray()
    for _ in range(draw(st.integers(1, 12))):
        stream = draw(st.sampled_from(STREAMS))
        choice = draw(st.integers(0, 9))
        if choice < 6:
            messages = family_message(layouts[stream])
            data = b"".join(
                grpc(m, draw(st.integers(0, 30)) == 0)
                for m in draw(st.lists(messages, min_size=1, max_size=4))
            )
            cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=2)))
            for start, end in zip([0, *cuts], [*cuts, len(data)], strict=True):
                flags = draw(st.sampled_from([0] * 12 + [1, 8, 9]))
                payload = data[start:end]
                if flags & 8:
                    pad = draw(st.integers(0, 3))
                    payload = bytes((pad,)) + payload + b"\x00" * pad
                out += frame(0, flags, stream, payload)
        elif choice < 8:
            out += frame(1, draw(st.sampled_from([4, 5, 0, 1])), stream, b"hdrs")
        elif choice == 8:
            kind = draw(st.integers(2, 12))
            out += frame(kind, draw(st.integers(0, 255)), stream, draw(st.binary(max_size=12)))
        else:
            out += draw(st.binary(max_size=12))
    return bytes(out)


@st.composite
def script(draw) -> list[tuple]:
    layouts = {s: draw(st.sampled_from([frames.SGLANG, frames.VLLM])) for s in STREAMS}
    rids = st.sampled_from(["req", "chatcmpl-" + "a" * 40, "é"])
    steps: list[tuple] = [
        ("relay", stream, layouts[stream], draw(rids), draw(st.booleans()))
        for stream in STREAMS
        if draw(st.integers(0, 4))
    ]
    data = draw(wire(layouts))
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=6)))
    for start, end in zip([0, *cuts], [*cuts, len(data)], strict=True):
        for _ in range(draw(st.integers(0, 2))):
            stream = draw(st.sampled_from(STREAMS))
            action = draw(st.sampled_from(["relay", "forget", "take", "take"]))
            if action == "relay":
                layout = draw(st.sampled_from([layouts[stream], frames.SGLANG, frames.VLLM]))
                steps.append(("relay", stream, layout, draw(rids), draw(st.booleans())))
            else:
                steps.append((action, stream))
        steps.append(("feed", data[start:end]))
    return steps


class Side:
    def __init__(self, reader_type, batch_type, max_message: int, refill: int) -> None:
        self.reader = reader_type(max_message, refill)
        self.batches = {stream: batch_type() for stream in STREAMS}
        self.log: list = []

    def run(self, steps: list[tuple]) -> list:
        for step in steps:
            if step[0] == "relay":
                _, stream, layout, rid, owned = step
                owner = f"owner-{stream}-{rid}" if owned else None
                self.reader.relay(stream, self.batches[stream], rid, layout, owner)
            elif step[0] == "forget":
                self.reader.forget(step[1])
            elif step[0] == "take":
                self.log.append(("take", self.batches[step[1]].take()))
            else:
                event = self.reader.feed(step[1])
                while event is not None:
                    counts = tuple(self.batches[s].count for s in STREAMS)
                    self.log.append((event, counts, self.reader.relayed))
                    event = self.reader.feed(b"")
                self.log.append(("firsts", self.reader.take_firsts(), self.reader.received))
        self.log.append([self.batches[s].take() for s in STREAMS])
        return self.log


needs_c = pytest.mark.skipif(not frames.NATIVE, reason="the C extension is not built")


@needs_c
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script(), st.sampled_from([(1 << 20, 1 << 30), (12, 50), (0, 7)]))
def test_both_forms_agree_on_any_input(steps, limits):
    python = Side(frames.PyFrameReader, frames.PyReplyBatch, *limits).run(steps)
    c = Side(frames.FrameReader, frames.ReplyBatch, *limits).run(steps)
    assert c == python


@needs_c
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.integers(0, 400))
def test_both_forms_agree_on_noise(data, cut):
    steps = [("relay", 1, frames.SGLANG, "r", True), ("relay", 3, frames.VLLM, "s", False)]
    steps += [("feed", data[:cut]), ("feed", data[cut:])]
    python = Side(frames.PyFrameReader, frames.PyReplyBatch, 1 << 20, 1 << 30).run(steps)
    assert Side(frames.FrameReader, frames.ReplyBatch, 1 << 20, 1 << 30).run(steps) == python


@settings(max_examples=1500, deadline=None)
@given(any_message, st.sampled_from([frames.SGLANG, frames.VLLM]))
def test_a_plain_chunk_is_read_as_protobuf_reads_it(data, layout):
    read = frames.plain_chunk(data, layout)
    if read is None:
        return
    proto = spb if layout == frames.SGLANG else vpb
    reply = proto.GenerateResponse.FromString(data)  # parses, or the relay was wrong
    assert reply.WhichOneof("response") == "chunk"
    assert list(reply.chunk.token_ids) == read
    assert not reply.chunk.HasField("output_logprobs")
    assert not reply.chunk.HasField("input_logprobs")


def test_the_strategies_reach_plain_chunks_and_handbacks():
    """The generators above are not all noise: engine-made chunks relay."""
    chunk = spb.GenerateResponse(
        request_id="r", chunk=spb.GenerateStreamChunk(token_ids=[1, 2], prompt_tokens=5)
    ).SerializeToString()
    assert frames.plain_chunk(chunk, frames.SGLANG) == [1, 2]
    assert frames.plain_chunk(chunk, frames.VLLM) is None
