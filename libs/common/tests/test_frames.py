"""engines/frames.py: the frame reader and the relay of plain token chunks, in each form (the
pure-Python one and the C extension's, when built)."""

from __future__ import annotations

import struct

import pytest
from smg_grpc_proto.generated import sglang_scheduler_pb2 as spb
from smg_grpc_proto.generated import vllm_engine_pb2 as vpb

from switchyard.common.engines import frames
from switchyard.common.engines.http2 import (
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    PADDED,
    RST_STREAM,
    SETTINGS,
    frame,
)
from switchyard.protos import codec
from switchyard.protos.messages import GenerateFinished, TokenDelta

FORMS = [pytest.param((frames.PyFrameReader, frames.PyReplyBatch), id="python")]
if frames.NATIVE:
    FORMS.append(
        pytest.param((frames.FrameReader, frames.ReplyBatch), id="c"),
    )

HANDBACK, REFILL = frames.HANDBACK, frames.REFILL


@pytest.fixture(params=FORMS)
def form(request):
    return request.param


def make(form, max_message=1 << 20, refill=1 << 30):
    reader_type, batch_type = form
    return reader_type(max_message, refill), batch_type()


def message(body: bytes, compressed: int = 0) -> bytes:
    return bytes((compressed,)) + struct.pack(">I", len(body)) + body


def sglang_chunk(*ids: int, **counts) -> bytes:
    return spb.GenerateResponse(
        request_id="r", chunk=spb.GenerateStreamChunk(token_ids=ids, **counts)
    ).SerializeToString()


def vllm_chunk(*ids: int, **counts) -> bytes:
    return vpb.GenerateResponse(
        chunk=vpb.GenerateStreamChunk(token_ids=ids, **counts)
    ).SerializeToString()


def sglang_complete(*ids: int) -> bytes:
    return spb.GenerateResponse(
        request_id="r", complete=spb.GenerateComplete(output_ids=ids, finish_reason="stop")
    ).SerializeToString()


def events(reader, data: bytes) -> list:
    out = []
    event = reader.feed(data)
    while event is not None:
        out.append(event)
        event = reader.feed(b"")
    return out


def deltas(batch) -> list:
    taken = batch.take()
    return [] if taken is None else codec.dispatcher_replies.decode(taken)


class TestFrames:
    def test_frames_come_as_events_in_order_across_reads(self, form):
        reader, _ = make(form)
        wire = frame(SETTINGS, 0, 0, b"\x00\x04\x00\x00\xff\xff") + frame(HEADERS, 4, 1, b"hd")
        wire += frame(DATA, 0, 3, b"payload")
        got = []
        for i in range(len(wire)):  # byte by byte: a frame is whole or not yet
            got += events(reader, wire[i : i + 1])
        assert got == [
            (SETTINGS, 0, 0, b"\x00\x04\x00\x00\xff\xff"),
            (HEADERS, 4, 1, b"hd"),
            (DATA, 0, 3, b"payload"),
        ]

    def test_the_reserved_bit_of_the_stream_id_is_ignored(self, form):
        reader, _ = make(form)
        raw = bytearray(frame(RST_STREAM, 0, 5, b"\x00\x00\x00\x08"))
        raw[5] |= 0x80
        assert events(reader, bytes(raw)) == [(RST_STREAM, 0, 5, b"\x00\x00\x00\x08")]

    def test_connection_data_is_given_back_past_the_refill_mark(self, form):
        reader, _ = make(form, refill=10)
        got = events(reader, frame(DATA, 0, 1, b"x" * 6) + frame(DATA, 0, 3, b"y" * 6))
        assert got == [(DATA, 0, 1, b"x" * 6), (DATA, 0, 3, b"y" * 6), (REFILL, 0, 0, 12)]
        assert reader.received == 0

    def test_bad_arguments(self, form):
        reader_type, batch_type = form
        with pytest.raises(ValueError):
            reader_type(-1, 10)
        with pytest.raises(ValueError):
            reader_type(10, 0)
        reader, batch = make(form)
        with pytest.raises(ValueError):
            reader.relay(1, batch, "r", 9)
        with pytest.raises(TypeError):
            reader.relay(1, object(), "r", frames.SGLANG)


class TestRelay:
    def test_plain_chunks_become_token_deltas_in_the_batch(self, form):
        reader, batch = make(form)
        reader.relay(1, batch, "req-1", frames.SGLANG)
        data = message(sglang_chunk(7, prompt_tokens=3, completion_tokens=1))
        data += message(sglang_chunk(8, 9, completion_tokens=3, cached_tokens=2))
        assert events(reader, frame(DATA, 0, 1, data)) == []
        assert reader.relayed == 2
        assert deltas(batch) == [TokenDelta("req-1", [7]), TokenDelta("req-1", [8, 9])]

    def test_the_bytes_are_what_codec_encodes(self, form):
        reader, batch = make(form)
        long_id = "chatcmpl-" + "x" * 300  # a str16 header
        reader.relay(1, batch, long_id, frames.VLLM)
        ids = list(range(0, 70000, 997)) + [2**32 - 1, 127, 128, 255, 256, 65535, 65536]
        events(reader, frame(DATA, 0, 1, message(vllm_chunk(*ids))))
        finished = GenerateFinished(
            request_id="x", finish_reason="stop", prompt_tokens=1, completion_tokens=2
        )
        batch.append(codec.encode(finished))
        expected = [TokenDelta(long_id, ids), finished]
        assert batch.take() == codec.encode(expected)

    def test_many_replies_take_a_long_array_header(self, form):
        reader, batch = make(form)
        reader.relay(1, batch, "r", frames.SGLANG)
        data = b"".join(message(sglang_chunk(i)) for i in range(20))
        events(reader, frame(DATA, 0, 1, data))
        assert batch.count == 20
        assert batch.take() == codec.encode([TokenDelta("r", [i]) for i in range(20)])
        assert batch.take() is None

    def test_a_message_split_across_frames_and_reads(self, form):
        reader, batch = make(form)
        reader.relay(3, batch, "r", frames.SGLANG)
        data = message(sglang_chunk(1)) + message(sglang_chunk(2, 3))
        wire = frame(DATA, 0, 3, data[:4]) + frame(DATA, 0, 3, data[4:9])
        wire += frame(DATA, 0, 3, data[9:])
        for i in range(0, len(wire), 7):
            assert events(reader, wire[i : i + 7]) == []
        assert deltas(batch) == [TokenDelta("r", [1]), TokenDelta("r", [2, 3])]

    def test_a_chunk_without_tokens_writes_nothing(self, form):
        reader, batch = make(form)
        reader.relay(1, batch, "r", frames.SGLANG)
        assert events(reader, frame(DATA, 0, 1, message(sglang_chunk()))) == []
        assert batch.take() is None and reader.relayed == 0

    def test_the_complete_hands_the_stream_back_with_what_follows(self, form):
        reader, batch = make(form)
        reader.relay(1, batch, "r", frames.SGLANG)
        tail = message(sglang_complete(5)) + message(sglang_chunk(6))[:3]
        wire = frame(DATA, 0, 1, message(sglang_chunk(5)) + tail)
        assert events(reader, wire) == [(HANDBACK, 0, 1, (tail, len(wire) - 9, 1))]
        assert deltas(batch) == [TokenDelta("r", [5])]
        # The stream is the connection's now: its frames come as themselves.
        assert events(reader, frame(DATA, 0, 1, b"z")) == [(DATA, 0, 1, b"z")]

    def test_trailers_hand_the_stream_back_first_then_come_themselves(self, form):
        reader, batch = make(form)
        reader.relay(1, batch, "r", frames.SGLANG)
        partial = message(sglang_chunk(4))[:6]
        wire = frame(DATA, 0, 1, partial) + frame(HEADERS, END_HEADERS | END_STREAM, 1, b"t")
        assert events(reader, wire) == [
            (HANDBACK, 0, 1, (partial, 6, 0)),
            (HEADERS, END_HEADERS | END_STREAM, 1, b"t"),
        ]

    def test_response_headers_leave_the_stream_relayed(self, form):
        reader, batch = make(form)
        reader.relay(1, batch, "r", frames.SGLANG)
        wire = frame(HEADERS, END_HEADERS, 1, b"h") + frame(DATA, 0, 1, message(sglang_chunk(1)))
        assert events(reader, wire) == [(HEADERS, END_HEADERS, 1, b"h")]
        assert deltas(batch) == [TokenDelta("r", [1])]

    @pytest.mark.parametrize("flags", [END_STREAM, PADDED])
    def test_data_the_connection_must_see_hands_the_stream_back_first(self, form, flags):
        reader, batch = make(form)
        reader.relay(1, batch, "r", frames.SGLANG)
        body = b"\x00" + message(sglang_chunk(1)) if flags == PADDED else message(sglang_chunk(1))
        assert events(reader, frame(DATA, flags, 1, body)) == [
            (HANDBACK, 0, 1, (b"", 0, 0)),
            (DATA, flags, 1, body),
        ]
        assert batch.take() is None

    def test_a_stream_near_its_refill_mark_goes_back(self, form):
        reader, batch = make(form, refill=40)
        reader.relay(1, batch, "r", frames.SGLANG)
        one = frame(DATA, 0, 1, message(sglang_chunk(1)))
        assert events(reader, one) == []
        assert reader.received == len(one) - 9
        got = events(reader, one * 4)  # 2 more fit below 40 bytes, the 3rd would not
        assert got[0] == (HANDBACK, 0, 1, (b"", 3 * (len(one) - 9), 3))
        assert [e[0] for e in got[1:]] == [DATA, REFILL, DATA]

    @pytest.mark.parametrize(
        "body",
        [
            message(sglang_chunk(1), compressed=1),
            message(b"\x00" * 10)[:5],  # too large (over max_message 8), announced
            message(
                spb.GenerateResponse(
                    chunk=spb.GenerateStreamChunk(token_ids=[1], index=1, output_logprobs={})
                ).SerializeToString()
            ),
            message(b"\x08\x01"),  # a field of another type
            message(b""),  # no chunk at all
        ],
        ids=["compressed", "too-large", "logprobs", "unknown-field", "empty"],
    )
    def test_anything_but_a_plain_chunk_is_handed_back_as_it_came(self, form, body):
        reader, batch = make(form, max_message=8 if body[1:5] == b"\x00\x00\x00\x0a" else 1 << 20)
        reader.relay(1, batch, "r", frames.SGLANG)
        wire = frame(DATA, 0, 1, body)
        assert events(reader, wire) == [(HANDBACK, 0, 1, (body, len(body), 0))]

    def test_forget_stops_the_relay(self, form):
        reader, batch = make(form)
        reader.relay(1, batch, "r", frames.SGLANG)
        reader.forget(1)
        reader.forget(99)  # unknown: nothing
        data = message(sglang_chunk(1))
        assert events(reader, frame(DATA, 0, 1, data)) == [(DATA, 0, 1, data)]

    def test_first_deltas_name_their_owner_once(self, form):
        reader, batch = make(form)
        owner_a, owner_b = object(), object()
        reader.relay(1, batch, "a", frames.SGLANG, owner_a)
        reader.relay(3, batch, "b", frames.SGLANG, owner_b)
        reader.relay(5, batch, "c", frames.SGLANG)
        assert reader.take_firsts() is None
        wire = frame(DATA, 0, 3, message(sglang_chunk()))  # no tokens: not yet
        for stream in (1, 3, 5, 1):
            wire += frame(DATA, 0, stream, message(sglang_chunk(stream)))
        events(reader, wire)
        assert reader.take_firsts() == [owner_a, owner_b]
        assert reader.take_firsts() is None

    def test_many_streams(self, form):
        reader, batch = make(form)
        streams = list(range(1, 2000, 2))
        for stream in streams:
            reader.relay(stream, batch, f"r{stream}", frames.VLLM)
        for stream in streams[::3]:
            reader.forget(stream)
        wire = b"".join(frame(DATA, 0, s, message(vllm_chunk(s))) for s in streams)
        got = events(reader, wire)
        assert [e[2] for e in got] == streams[::3]
        kept = [s for i, s in enumerate(streams) if i % 3]
        assert deltas(batch) == [TokenDelta(f"r{s}", [s]) for s in kept]
