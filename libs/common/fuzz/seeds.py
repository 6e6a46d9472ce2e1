"""Seed inputs for the fuzz harnesses (`make fuzz`): what engines really send, so the fuzzer
starts from inputs that reach the deep paths (relayed chunks, handbacks, bigram cells).

    python libs/common/fuzz/seeds.py OUT_DIR     # OUT_DIR/{frames,blockhash,pretokens}/*
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import hpack
import msgspec
from smg_grpc_proto.generated import sglang_scheduler_pb2 as spb
from smg_grpc_proto.generated import vllm_engine_pb2 as vpb

DATA, HEADERS, SETTINGS, PING, RST_STREAM = 0, 1, 4, 6, 3


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    size = len(payload)
    head = bytes((size >> 16, size >> 8 & 0xFF, size & 0xFF, kind, flags))
    return head + struct.pack(">I", stream) + payload


def grpc(message: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(message)) + message


def engine_stream(family: str, streams: list[int], tokens: int) -> bytes:
    encoder = hpack.Encoder()
    out = frame(SETTINGS, 0, 0, b"\x00\x04\x00\x01\x00\x00")
    for stream in streams:
        block = encoder.encode([(":status", "200"), ("content-type", "application/grpc")])
        out += frame(HEADERS, 4, stream, block)
    for t in range(tokens):
        for stream in streams:
            if family == "sglang":
                chunk = spb.GenerateStreamChunk(
                    token_ids=[t * 300 + stream], prompt_tokens=9, completion_tokens=t + 1
                )
                message = spb.GenerateResponse(request_id=f"r{stream}", chunk=chunk)
            else:
                chunk = vpb.GenerateStreamChunk(token_ids=[t * 70000, 5], completion_tokens=2)
                message = vpb.GenerateResponse(chunk=chunk)
            out += frame(DATA, 0, stream, grpc(message.SerializeToString()))
    for stream in streams:
        if family == "sglang":
            done = spb.GenerateComplete(output_ids=[1], finish_reason="stop", prompt_tokens=9)
            message = spb.GenerateResponse(request_id=f"r{stream}", complete=done)
        else:
            message = vpb.GenerateResponse(complete=vpb.GenerateComplete(finish_reason="length"))
        data = grpc(message.SerializeToString())
        out += frame(DATA, 0, stream, data[:4]) + frame(DATA, 0, stream, data[4:])
        out += frame(HEADERS, 5, stream, encoder.encode([("grpc-status", "0")]))
    out += frame(PING, 0, 0, b"12345678") + frame(RST_STREAM, 0, 9, b"\x00\x00\x00\x08")
    return out


def frames_input(limits: int, relays: int, wire: bytes, read: int) -> bytes:
    """The frames harness's format: 2 bytes of settings, then reads of up to 48 bytes, each
    after a byte that says its length."""
    out = bytearray((limits, relays))
    for start in range(0, len(wire), read):
        piece = wire[start : start + read]
        out.append(len(piece) - 1)
        out += piece
    return bytes(out)


def main(out_dir: Path) -> None:
    frames_dir, blockhash_dir = out_dir / "frames", out_dir / "blockhash"
    frames_dir.mkdir(parents=True, exist_ok=True)
    blockhash_dir.mkdir(parents=True, exist_ok=True)
    seeds = {
        "sglang-c1": frames_input(0x0F, 0xFF, engine_stream("sglang", [1], 6), 40),
        "sglang-c4": frames_input(0x0F, 0xFF, engine_stream("sglang", [1, 3, 5, 7], 3), 48),
        "vllm-c2": frames_input(0x0F, 0x0F, engine_stream("vllm", [1, 3], 4), 17),
        "small-limits": frames_input(0x05, 0xF5, engine_stream("sglang", [1, 3], 3), 30),
    }
    for name, data in seeds.items():
        (frames_dir / name).write_bytes(data)
    encode = msgspec.msgpack.encode
    arrays = {
        "small": (4, encode(list(range(16)))),
        "widths": (3, encode([0, 200, 70000, 2**32 - 1, 2**40, -1, 5, 6, 7])),
        "bigrams": (2, encode([[1, 2], [3, [4, 5]], 6, [7, {"a": b"x"}], 8, [9, 1.5]])),
        "long": (16, encode(list(range(0, 2**20, 997)))),
    }
    for name, (block_size, raw) in arrays.items():
        (blockhash_dir / name).write_bytes(bytes((block_size - 1,)) + raw)
    pretokens_dir = out_dir / "pretokens"  # a byte ('<' plain when odd), then the text
    pretokens_dir.mkdir(parents=True, exist_ok=True)
    texts = {
        "chat": b"\x00You are a helpful assistant.\n\nWhat's 2+2? Answer in 12345 words:",
        "code": b"\x01def f(x):\r\n\tif x <= 10:\n\t\treturn x  # ok\n\n\n    pass\x0b\x0c",
        "runs": b"\x00" + b" " * 70 + b"a" * 80 + b"\n \n  1234567 !!!...\n --flag",
        "other": b"\x00<think> caf\xe9 \x00\x1f\x7f",
    }
    for name, data in texts.items():
        (pretokens_dir / name).write_bytes(data)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(Path(sys.argv[1]))
