"""engines/http2.py beyond what the engine tests reach over both transports: flow control,
keepalive, GOAWAY, the engine's stream limit, resets and HTTP statuses, framing, cancel and
close. Against real grpc.aio servers where one can show the behaviour, else against a scripted
HTTP/2 server (FakeEngine) that writes the frames a test gives it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct

import grpc
import hpack
import pytest
from smg_grpc_proto.generated import vllm_engine_pb2 as vpb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as vgrpc

from switchyard.common import errors
from switchyard.common.engines import frames, http2
from switchyard.common.engines.http2 import DATA, END_HEADERS, END_STREAM, HEADERS, frame
from switchyard.common.errors import EngineError

PATH = "/vllm.grpc.engine.VllmEngine/Generate"
INSTANCE = 7
_U32 = struct.Struct(">I")


@contextlib.asynccontextmanager
async def streams_to(port: int, **options):
    streams = http2.Http2Streams("127.0.0.1", port, instance_id=INSTANCE, **options)
    try:
        yield streams
    finally:
        await streams.close()


def generate(streams, request_id: str = "r", tokens=(1, 2, 3)) -> http2.StreamCall:
    request = vpb.GenerateRequest(
        request_id=request_id, tokenized=vpb.TokenizedInput(input_ids=tokens)
    )
    return streams.call(PATH, request.SerializeToString(), vpb.GenerateResponse.FromString)


async def drain(call, within: float = 5.0) -> tuple[list[list[int]], EngineError | None]:
    """The token ids of each reply, and the EngineError the call ended with (None: it ended
    well). A call still open after `within` seconds fails the test (TimeoutError)."""
    got = []
    try:
        async with asyncio.timeout(within):
            async for reply in call:
                got.append(list(reply.chunk.token_ids))
    except EngineError as exc:
        return got, exc
    return got, None


def reply(*token_ids: int) -> vpb.GenerateResponse:
    return vpb.GenerateResponse(chunk=vpb.GenerateStreamChunk(token_ids=token_ids))


class Servicer(vgrpc.VllmEngineServicer):
    """Generate: reply [1], then (`hold`: once the request id's gate opens) reply [2]. Keeps
    the requests, and the ids of the calls it saw cancelled."""

    def __init__(self, hold: bool = False, abort: tuple | None = None) -> None:
        self.hold, self.abort = hold, abort
        self.requests: list[vpb.GenerateRequest] = []
        self.gates: dict[str, asyncio.Event] = {}
        self.cancelled: set[str] = set()
        self.saw_cancel = asyncio.Event()

    async def Generate(self, request, context):
        self.requests.append(request)
        if self.abort is not None:
            await context.abort(*self.abort)
        gate = self.gates.setdefault(request.request_id, asyncio.Event())
        try:
            yield reply(1)
            if self.hold:
                await gate.wait()
            yield reply(2)
        except asyncio.CancelledError:
            self.cancelled.add(request.request_id)
            self.saw_cancel.set()
            raise


@contextlib.asynccontextmanager
async def grpc_engine(servicer: Servicer, options=()):
    server = grpc.aio.server(options=list(options))
    vgrpc.add_VllmEngineServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield port
    finally:
        await server.stop(None)


class Peer:
    """The fake engine's end of one connection: reads the client's frames and keeps what they
    said; the script writes whatever frames it likes."""

    def __init__(self, number: int, reader, writer) -> None:
        self.number = number  # 1: the first connection the engine accepted
        self.reader, self.writer = reader, writer
        self._decoder = hpack.Decoder()
        self.heads: dict[int, dict[str, str]] = {}  # request headers by stream id
        self.bodies: dict[int, bytearray] = {}
        self.ended: set[int] = set()  # streams whose request came whole
        self.resets: dict[int, int] = {}  # RST_STREAM codes by stream id
        self.pings = 0  # the client's own PINGs
        self.answer_pings = False
        self.acks: list[bytes] = []  # payloads of PING ACKs
        self.gone = asyncio.Event()  # the client closed the connection

    async def next_frame(self) -> int:
        head = await self.reader.readexactly(9)
        kind, flags = head[3], head[4]
        stream_id = _U32.unpack(head[5:])[0] & 0x7FFFFFFF
        payload = await self.reader.readexactly(int.from_bytes(head[:3], "big"))
        if kind == HEADERS:
            self.heads[stream_id] = dict(self._decoder.decode(payload))  # type: ignore[arg-type]
        elif kind == DATA:
            self.bodies.setdefault(stream_id, bytearray()).extend(payload)
        elif kind == http2.RST_STREAM:
            self.resets[stream_id] = _U32.unpack(payload)[0]
        elif kind == http2.PING and flags & http2.ACK:
            self.acks.append(payload)
        elif kind == http2.PING:
            self.pings += 1
            if self.answer_pings:
                self.send(frame(http2.PING, http2.ACK, 0, payload))
        if kind in (HEADERS, DATA) and flags & END_STREAM:
            self.ended.add(stream_id)
        return kind

    async def until(self, done) -> None:
        while not done():
            await self.next_frame()

    async def requests(self, count: int) -> None:
        """Read on until `count` requests have come whole."""
        await self.until(lambda: len(self.ended) >= count)

    async def barrier(self) -> None:
        """A PING round trip: every frame the client wrote before its ACK has been read."""
        payload = b"barrier%d" % len(self.acks)
        self.send(frame(http2.PING, 0, 0, payload[:8]))
        await self.until(lambda: payload[:8] in self.acks)

    def send(self, *frames: bytes) -> None:
        self.writer.write(b"".join(frames))


class FakeEngine:
    """An HTTP/2 server on 127.0.0.1 that runs `script(peer)` on each connection it accepts,
    then holds the connection until the client closes it."""

    def __init__(self, script) -> None:
        self.script = script
        self.peers: list[Peer] = []
        self.accepted = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self.port = 0

    async def accept(self, reader, writer) -> None:
        peer = Peer(len(self.peers) + 1, reader, writer)
        self.peers.append(peer)
        self._tasks.add(asyncio.current_task())  # type: ignore[arg-type]
        self.accepted.set()
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await reader.readexactly(len(http2.PREFACE))
            await self.script(peer)
            while await reader.read(65536):
                pass
        peer.gone.set()
        writer.close()


@contextlib.asynccontextmanager
async def fake_engine(script):
    engine = FakeEngine(script)
    server = await asyncio.start_server(engine.accept, "127.0.0.1", 0)
    engine.port = server.sockets[0].getsockname()[1]
    try:
        yield engine
    finally:
        server.close()
        tasks = engine._tasks
        if tasks:  # the client has closed by now: each script reads to the end and returns
            await asyncio.wait(tasks, timeout=1)
        for peer in engine.peers:
            peer.writer.close()
        for task in tasks:
            task.cancel()  # a script stuck on an event of a test that failed
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()
    for outcome in outcomes:  # a script that broke fails the test (when nothing else did)
        if isinstance(outcome, Exception):
            raise outcome


def message(response: vpb.GenerateResponse) -> bytes:
    body = response.SerializeToString()
    return b"\x00" + _U32.pack(len(body)) + body


def head(stream_id: int, flags: int = END_HEADERS, status: str = "200") -> bytes:
    fields = [(":status", status), ("content-type", "application/grpc")]
    return frame(HEADERS, flags, stream_id, http2.encode_headers(fields))


def data(stream_id: int, payload: bytes, flags: int = 0) -> bytes:
    return frame(DATA, flags, stream_id, payload)


def trailers(stream_id: int) -> bytes:
    fields = [("grpc-status", "0")]
    return frame(HEADERS, END_HEADERS | END_STREAM, stream_id, http2.encode_headers(fields))


def answer(stream_id: int, *replies: vpb.GenerateResponse) -> bytes:
    """A whole successful stream: headers, one DATA frame per reply, trailers."""
    body = b"".join(data(stream_id, message(r)) for r in replies)
    return head(stream_id) + body + trailers(stream_id)


async def answered(peer: Peer, *frames: bytes) -> None:
    """A script: read the first request, then write `frames`."""
    await peer.requests(1)
    peer.send(*frames)


async def run_against(script, within: float = 5.0, **options):
    """One call to a FakeEngine running `script`: its replies, its error, the engine's peer."""
    async with fake_engine(script) as engine, streams_to(engine.port, **options) as streams:
        got, error = await drain(generate(streams), within)
        return got, error, engine.peers[0]


class TestRequestOverTheWindow:
    async def test_the_engine_gets_a_prompt_larger_than_its_window_whole(self):
        prompt = [100_000 + i % 1000 for i in range(300_000)]  # 3 bytes a token: ~900 kB
        servicer = Servicer()
        # Without BDP probing gRPC core keeps HTTP/2's 65,535-byte windows (with it, its
        # SETTINGS can open 4 MiB before the request goes, and nothing would wait).
        small_windows = [("grpc.http2.bdp_probe", 0)]
        async with grpc_engine(servicer, small_windows) as port, streams_to(port) as streams:
            got, error = await drain(generate(streams, tokens=prompt), within=10)
        assert (got, error) == ([[1], [2]], None)
        assert list(servicer.requests[0].tokenized.input_ids) == prompt

    async def test_sends_wait_for_window_updates(self):
        body = message(reply(*range(100_000, 130_000)))  # ~90 kB: over the 65,535 window
        before_update = []

        async def script(peer):
            await peer.until(lambda: len(peer.bodies.get(1, b"")) >= http2.DEFAULT_WINDOW)
            await peer.barrier()  # anything sent past the window would be read by now
            before_update.append(len(peer.bodies[1]))
            grant = _U32.pack(len(body))
            peer.send(*(frame(http2.WINDOW_UPDATE, 0, stream, grant) for stream in (0, 1)))
            await peer.requests(1)
            peer.send(answer(1, reply(1)))

        async with fake_engine(script) as engine, streams_to(engine.port) as streams:
            call = streams.call(PATH, body[5:], vpb.GenerateResponse.FromString)
            got, error = await drain(call)
        assert (got, error) == ([[1]], None)
        assert before_update == [http2.DEFAULT_WINDOW]
        assert bytes(engine.peers[0].bodies[1]) == body


class TestKeepalive:
    async def test_an_engine_that_never_answers_fails_the_call_cannot_connect(self):
        async def silent(peer):
            await peer.until(lambda: False)  # reads every frame, answers none

        got, error, peer = await run_against(
            silent, within=1.5, keepalive_time=0.2, keepalive_timeout=0.2
        )
        assert got == [] and peer.pings >= 1
        assert (error.kind, error.instance_id) == (errors.CANNOT_CONNECT, INSTANCE)
        assert "keepalive" in error.message

    async def test_acknowledged_pings_keep_the_call_open(self):
        async def script(peer):
            peer.answer_pings = True
            await peer.requests(1)
            peer.send(head(1))
            await peer.until(lambda: peer.pings >= 3)  # past three keepalive timeouts
            peer.send(data(1, message(reply(1))), trailers(1))

        got, error, _ = await run_against(script, keepalive_time=0.1, keepalive_timeout=0.1)
        assert (got, error) == ([[1]], None)

    async def test_the_engines_ping_is_acknowledged(self):
        async def script(peer):
            await peer.barrier()
            peer.send(answer(1, reply(1)))

        got, error, peer = await run_against(script)
        assert (got, error) == ([[1]], None) and peer.acks == [b"barrier0"]


class TestGoaway:
    async def test_streams_past_last_stream_id_fail_and_the_next_call_reconnects(self):
        async def script(peer):
            if peer.number > 1:
                await answered(peer, answer(1, reply(9)))
                return
            await peer.requests(1)
            peer.send(head(1), data(1, message(reply(1))))
            await peer.requests(2)
            peer.send(head(3), data(3, message(reply(1))))
            peer.send(frame(http2.GOAWAY, 0, 0, _U32.pack(1) + _U32.pack(0)))  # took stream 1 only
            peer.send(data(1, message(reply(2))), trailers(1))

        async with fake_engine(script) as engine, streams_to(engine.port) as streams:
            kept, dropped = generate(streams, "kept"), generate(streams, "dropped")
            assert list((await anext(kept)).chunk.token_ids) == [1]
            assert list((await anext(dropped)).chunk.token_ids) == [1]
            assert (kept.stream_id, dropped.stream_id) == (1, 3)
            dropped_rest, dropped_error = await drain(dropped)
            kept_rest, kept_error = await drain(kept)
            after = await drain(generate(streams, "after"))
        assert dropped_rest == [] and dropped_error.kind == errors.CANNOT_CONNECT
        assert dropped_error.instance_id == INSTANCE and "GOAWAY" in dropped_error.message
        assert (kept_rest, kept_error) == ([[2]], None)
        assert after == ([[9]], None)
        assert len(engine.peers) == 2


class TestConcurrentStreamLimit:
    async def test_a_call_past_the_engines_limit_waits_for_a_slot(self):
        go = asyncio.Event()
        seen_while_first_open = []

        async def script(peer):
            one = struct.pack(">HI", http2.SETTINGS_MAX_CONCURRENT_STREAMS, 1)
            peer.send(frame(http2.SETTINGS, 0, 0, one))
            await peer.requests(1)
            peer.send(head(1), data(1, message(reply(1))))
            await go.wait()
            await peer.barrier()  # the second call's HEADERS, if it sent them, are read
            seen_while_first_open.extend(sorted(peer.heads))
            peer.send(data(1, message(reply(2))), trailers(1))
            await peer.requests(2)
            peer.send(answer(3, reply(3)))

        async with fake_engine(script) as engine, streams_to(engine.port) as streams:
            first, second = generate(streams, "first"), generate(streams, "second")
            assert list((await anext(first)).chunk.token_ids) == [1]  # SETTINGS came before
            waiting = asyncio.create_task(drain(second))
            go.set()
            assert await drain(first) == ([[2]], None)
            assert await waiting == ([[3]], None)
        assert seen_while_first_open == [1]
        assert sorted(engine.peers[0].heads) == [1, 3] and len(engine.peers) == 1


def reset(code: int) -> bytes:
    return frame(http2.RST_STREAM, 0, 1, _U32.pack(code))


class TestEngineRefusals:
    @pytest.mark.parametrize(
        "refusal,kind",
        [
            # the engine never saw the stream, its connection is up: this call refused
            (reset(0x7), errors.REFUSED),  # REFUSED_STREAM
            (reset(0x8), errors.CANCELLED),  # CANCEL
            (reset(0xB), errors.OVERLOADED),  # ENHANCE_YOUR_CALM
            (reset(0x2), errors.ENGINE_ERROR),  # INTERNAL_ERROR
            (head(1, END_HEADERS | END_STREAM, status="503"), errors.REFUSED),
            (head(1, END_HEADERS | END_STREAM, status="429"), errors.OVERLOADED),
            # a proxy that could not reach the engine behind it
            (head(1, END_HEADERS | END_STREAM, status="502"), errors.CANNOT_CONNECT),
            (head(1, END_HEADERS | END_STREAM, status="404"), errors.BAD_REQUEST),  # UNIMPLEMENTED
        ],
        ids=[
            "refused",
            "cancel",
            "calm",
            "internal",
            "http-503",
            "http-429",
            "http-502",
            "http-404",
        ],
    )
    async def test_reset_or_http_status(self, refusal, kind):
        got, error, _ = await run_against(lambda peer: answered(peer, refusal))
        assert got == [] and (error.kind, error.instance_id) == (kind, INSTANCE)

    async def test_trailers_only_answer_of_a_real_engine_with_its_message_decoded(self):
        # gRPC core answers a call failed before its first reply with one HEADERS frame
        # (END_STREAM), its grpc-message percent-encoded: "queue full: 100%25 %E2%9C%93".
        why = "queue full: 100% ✓"
        servicer = Servicer(abort=(grpc.StatusCode.RESOURCE_EXHAUSTED, why))
        async with grpc_engine(servicer) as port, streams_to(port) as streams:
            got, error = await drain(generate(streams))
        assert got == [] and error.kind == errors.OVERLOADED
        assert (error.message, error.instance_id) == (f"RESOURCE_EXHAUSTED: {why}", INSTANCE)

    async def test_a_real_engines_unavailable_refuses_the_call_not_the_connection(self):
        """Regression (QA: one UNAVAILABLE took an engine out of rotation): the engine's own
        UNAVAILABLE on a live connection is kind refused, and the next call goes out on the
        same connection."""
        servicer = Servicer(abort=(grpc.StatusCode.UNAVAILABLE, "draining"))
        async with grpc_engine(servicer) as port, streams_to(port) as streams:
            got, error = await drain(generate(streams))
            conn = streams._conn
            servicer.abort = None
            again = await drain(generate(streams, "again"))
            assert streams._conn is conn and conn is not None
        assert got == [] and (error.kind, error.message) == (
            errors.REFUSED,
            "UNAVAILABLE: draining",
        )
        assert again == ([[1], [2]], None)

    async def test_unavailable_after_goaway_is_cannot_connect(self):
        """A server that stops sends GOAWAY, then fails its calls UNAVAILABLE: going away."""

        def unavailable(stream_id: int) -> bytes:
            fields = [("grpc-status", "14"), ("grpc-message", "Cancelling all calls")]
            return frame(HEADERS, END_HEADERS | END_STREAM, stream_id, http2.encode_headers(fields))

        goaway = frame(http2.GOAWAY, 0, 0, _U32.pack(1) + _U32.pack(0))
        got, error, _ = await run_against(
            lambda peer: answered(peer, head(1), data(1, message(reply(1))), goaway, unavailable(1))
        )
        assert got == [[1]] and error.kind == errors.CANNOT_CONNECT

    async def test_stream_ended_by_data_without_trailers(self):
        got, error, _ = await run_against(
            lambda peer: answered(peer, head(1), data(1, message(reply(1)), END_STREAM))
        )
        assert got == [[1]] and error.kind == errors.ENGINE_ERROR
        assert "without a grpc-status" in error.message


class TestFraming:
    async def test_a_message_split_across_data_frames(self):
        raw = message(reply(1, 2)) + message(reply(3))
        pieces = [raw[:3], raw[3:7], raw[7:12], raw[12:]]  # cut inside prefix and body
        got, error, _ = await run_against(
            lambda peer: answered(peer, head(1), *(data(1, p) for p in pieces), trailers(1))
        )
        assert (got, error) == ([[1, 2], [3]], None)

    async def test_padded_data_and_headers(self):
        block = http2.encode_headers([(":status", "200"), ("content-type", "application/grpc")])
        priority = _U32.pack(0) + b"\x10"
        flags = END_HEADERS | http2.PADDED | http2.PRIORITY_FLAG
        padded_head = frame(HEADERS, flags, 1, b"\x03" + priority + block + b"\0" * 3)
        padded_data = frame(DATA, http2.PADDED, 1, b"\x04" + message(reply(1)) + b"\0" * 4)
        got, error, _ = await run_against(
            lambda peer: answered(peer, padded_head, padded_data, trailers(1))
        )
        assert (got, error) == ([[1]], None)

    async def test_header_blocks_continued_in_continuation_frames(self):
        def split(flags: int, fields: list[tuple[str, str]]) -> bytes:
            block = http2.encode_headers(fields)
            third = len(block) // 3
            return (
                frame(HEADERS, flags, 1, block[:third])
                + frame(http2.CONTINUATION, 0, 1, block[third : 2 * third])
                + frame(http2.CONTINUATION, END_HEADERS, 1, block[2 * third :])
            )

        start = split(0, [(":status", "200"), ("content-type", "application/grpc")])
        end = split(END_STREAM, [("grpc-status", "9"), ("grpc-message", "in three frames")])
        got, error, _ = await run_against(
            lambda peer: answered(peer, start, data(1, message(reply(1))), end)
        )
        assert got == [[1]] and error.kind == errors.BAD_REQUEST  # FAILED_PRECONDITION
        assert error.message == "FAILED_PRECONDITION: in three frames"

    @pytest.mark.parametrize(
        "prefix,kind,why",
        [
            (b"\x01" + _U32.pack(2), errors.ENGINE_ERROR, "compressed"),
            (b"\x00" + _U32.pack(http2.MAX_MESSAGE + 1), errors.OVERLOADED, "over the limit"),
        ],
    )
    async def test_a_message_the_client_cannot_take_resets_the_stream(self, prefix, kind, why):
        async def script(peer):
            await answered(peer, head(1), data(1, prefix + b"\x08\x01"))
            await peer.until(lambda: 1 in peer.resets)

        got, error, peer = await run_against(script)
        assert got == [] and (error.kind, error.instance_id) == (kind, INSTANCE)
        assert why in error.message and peer.resets == {1: 0x2}  # INTERNAL_ERROR


    async def test_padding_as_long_as_the_frame_is_a_protocol_error(self):
        """RFC 9113 6.1 (a padded DATA frame with no room for its padding; an empty one
        raised IndexError in the read callback before the frame reader)."""

        async def script(peer):
            await answered(peer, head(1), frame(DATA, http2.PADDED, 1, b"\x05abc"))
            await peer.gone.wait()

        got, error, _ = await run_against(script)
        assert got == [] and error.kind == errors.ENGINE_ERROR and "padding" in error.message


class TestHeaderBlocks:
    """Header blocks kept decoded by their bytes (Http2Connection._decode_block) decode as
    the connection's HPACK decoder alone would, also once the table changed under them."""

    async def test_known_blocks_follow_the_hpack_table(self):
        conn = http2.Http2Connection(None)  # type: ignore[arg-type]
        alone = hpack.Decoder()

        def both(block: bytes) -> tuple[object, object]:
            got: list[object] = []
            for decode in (conn._decode_block, alone.decode):
                try:
                    got.append(list(decode(block)))
                except hpack.HPACKError as exc:
                    got.append(type(exc))
            return got[0], got[1]

        encoder = hpack.Encoder()
        trailer = [("grpc-status", "0"), ("x-engine", "a")]
        first = encoder.encode(trailer)  # inserts both headers in the table
        again = encoder.encode(trailer)  # refers to them by index
        assert first != again
        sent = [first, again, again]
        sent.append(encoder.encode([("x-other", "b")]))  # a new entry: the indexes move
        sent.append(again)  # the same bytes now name other headers
        encoder.header_table_size = 40  # a size update: the entries are evicted
        sent += [encoder.encode(trailer), again]  # now an index past the table
        for block in sent:
            kept, decoded = both(block)
            assert kept == decoded
        assert decoded is hpack.exceptions.InvalidTableIndex
        assert again not in conn._blocks


def complete(*ids: int) -> vpb.GenerateResponse:
    done = vpb.GenerateComplete(output_ids=ids, finish_reason="length", prompt_tokens=3)
    return vpb.GenerateResponse(complete=done)


class TestRelay:
    """A streamed plain request with a Relay: its plain chunks go into the batch, the rest
    (the final message; anything not a plain chunk, and all after it) to `emit`."""

    async def relayed(self, script) -> tuple[list, list, list[int], int]:
        from switchyard.common.engines.vllm import VllmClient
        from switchyard.protos import codec
        from switchyard.protos.messages import GenerateRequest, SamplingParams

        batch = frames.ReplyBatch()
        reads: list[int] = []
        firsts = []
        relay = http2.Relay(batch, reads.append, lambda: firsts.append(1))
        emitted: list = []
        sampling = SamplingParams(max_tokens=9)
        request = GenerateRequest(
            request_id="rq", instance_id=INSTANCE, token_ids=[1], sampling=sampling
        )
        async with fake_engine(script) as engine, streams_to(engine.port) as streams:
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{engine.port}")
            client = VllmClient(channel, INSTANCE, streams)
            async with asyncio.timeout(5):
                await client.stream_into(request, emitted.append, relay)
            await channel.close()
        taken = batch.take()
        relayed = [] if taken is None else codec.dispatcher_replies.decode(taken)
        return relayed, emitted, reads, len(firsts)

    async def test_plain_chunks_go_to_the_batch(self):
        from switchyard.protos.messages import TokenDelta

        relayed, emitted, reads, firsts = await self.relayed(
            lambda peer: answered(peer, answer(1, reply(1), reply(2, 3), complete(2, 3)))
        )
        assert relayed == [TokenDelta("rq", [1]), TokenDelta("rq", [2, 3])]
        [finished] = emitted
        assert (finished.completion_tokens, finished.finish_reason) == (3, "length")
        assert sum(reads) == 2 and firsts == 1

    async def test_a_reply_that_is_not_plain_takes_the_rest_of_the_stream_to_emit(self):
        from switchyard.protos.messages import TokenDelta

        odd = reply(2)
        odd.chunk.output_logprobs.token_logprobs.append(-1.0)  # not asked for: ignored
        relayed, emitted, _, firsts = await self.relayed(
            lambda peer: answered(peer, answer(1, reply(1), odd, reply(3), complete(3)))
        )
        assert relayed == [TokenDelta("rq", [1])]
        assert emitted[:2] == [TokenDelta("rq", [2]), TokenDelta("rq", [3])]
        assert emitted[2].completion_tokens == 3 and len(emitted) == 3 and firsts == 1

    async def test_a_stream_that_ends_inside_a_relayed_message_fails(self):
        """Its trailers hand the stream back with the partial message first."""
        cut = message(reply(2))[:-1]
        with pytest.raises(EngineError) as caught:
            await self.relayed(
                lambda peer: answered(
                    peer, head(1), data(1, message(reply(1)) + cut), trailers(1)
                )
            )
        assert caught.value.kind == errors.ENGINE_ERROR
        assert "inside a message" in caught.value.message


class Recording:
    """A transport that keeps every write it passes on."""

    def __init__(self, transport, writes: list[bytes]) -> None:
        self._transport, self.writes = transport, writes

    def write(self, data) -> None:
        self.writes.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name):
        return getattr(self._transport, name)


def frame_kinds(raw: bytes) -> list[int]:
    kinds, pos = [], 0
    while pos < len(raw):
        kinds.append(raw[pos + 3])
        pos += 9 + int.from_bytes(raw[pos : pos + 3], "big")
    return kinds


class TestWrites:
    async def test_streams_started_together_go_to_the_engine_in_one_write(self, monkeypatch):
        writes: list[bytes] = []
        made = http2.Http2Connection.connection_made
        monkeypatch.setattr(
            http2.Http2Connection,
            "connection_made",
            lambda conn, transport: made(conn, Recording(transport, writes)),
        )

        async def script(peer):
            await peer.requests(3)
            peer.send(*(answer(stream_id, reply(stream_id)) for stream_id in (1, 3, 5)))

        async with fake_engine(script) as engine, streams_to(engine.port) as streams:
            got = await asyncio.gather(*(drain(generate(streams, f"r{i}")) for i in range(3)))
        assert got == [([[1]], None), ([[3]], None), ([[5]], None)]
        # The preface and settings when connected, then the three requests in one write.
        assert len(writes) == 2
        assert frame_kinds(writes[1]) == [HEADERS, DATA] * 3


class TestCancel:
    async def test_the_engine_sees_the_call_cancelled_and_other_streams_go_on(self):
        servicer = Servicer(hold=True)
        async with grpc_engine(servicer) as port, streams_to(port) as streams:
            dropped, kept = generate(streams, "dropped"), generate(streams, "kept")
            assert list((await anext(dropped)).chunk.token_ids) == [1]
            assert list((await anext(kept)).chunk.token_ids) == [1]
            assert dropped.conn is kept.conn
            dropped.cancel()
            async with asyncio.timeout(5):
                await servicer.saw_cancel.wait()
            servicer.gates["kept"].set()
            assert await drain(kept) == ([[2]], None)
            assert await drain(dropped) == ([], None)
        assert servicer.cancelled == {"dropped"}


class TestClose:
    async def test_close_fails_the_open_call_and_later_ones_disconnected(self):
        replied = head(1) + data(1, message(reply(1)))
        async with fake_engine(lambda peer: answered(peer, replied)) as engine:
            streams = http2.Http2Streams("127.0.0.1", engine.port, instance_id=INSTANCE)
            call = generate(streams)
            assert list((await anext(call)).chunk.token_ids) == [1]
            waiting = asyncio.create_task(drain(call))
            await asyncio.sleep(0)  # it waits for the next reply
            await streams.close()
            closed_under = await waiting
            later = await drain(generate(streams))
            async with asyncio.timeout(1):
                await engine.peers[0].gone.wait()  # the client hung up
        assert len(engine.peers) == 1
        for got, error in (closed_under, later):
            assert got == [] and error.kind == errors.DISCONNECTED
            assert error.instance_id == INSTANCE

    async def test_close_fails_a_call_still_connecting_disconnected(self):
        """Regression: close() cancelled the connect under the call, which then raised a
        bare CancelledError (as if its caller were cancelled), not EngineError."""

        async def silent(peer):
            await peer.reader.read()  # the TLS handshake is never answered

        tls = ssl.create_default_context()
        async with fake_engine(silent) as engine:
            streams = http2.Http2Streams(
                "127.0.0.1", engine.port, ssl_context=tls, server_hostname="engine.test"
            )
            streams.instance_id = INSTANCE
            waiting = asyncio.create_task(drain(generate(streams)))
            await engine.accepted.wait()
            await streams.close()
            got, error = await waiting
        assert got == [] and (error.kind, error.instance_id) == (errors.DISCONNECTED, INSTANCE)


class TestConnectionRefused:
    async def test_refused_is_cannot_connect_with_the_instance_id(self):
        with socket.socket() as hole:  # bound, never listening: connections are refused
            hole.bind(("127.0.0.1", 0))
            async with streams_to(hole.getsockname()[1]) as streams:
                got, error = await drain(generate(streams))
        assert got == [] and (error.kind, error.instance_id) == (errors.CANNOT_CONNECT, INSTANCE)
        assert "failed to connect" in error.message
