"""Health of fleet, router and dispatcher: one request their event loop must answer.

    python -m switchyard.common.healthcheck fleet tcp://127.0.0.1:7100
    python -m switchyard.common.healthcheck router tcp://127.0.0.1:7200
    python -m switchyard.common.healthcheck dispatcher tcp://127.0.0.1:7300

Exit 0 when the answer comes within --timeout seconds, 1 otherwise (a message on stderr). A
TCP connect would only show that libzmq's I/O thread accepts; these ask the service itself:
fleet a snapshot, the router a dry-run route for a model nobody serves (any answer will do),
the dispatcher a generation for instance 0, which it refuses at once without touching an
engine. Nothing is booked or logged. For container healthchecks and Kubernetes exec probes.
"""

from __future__ import annotations

import argparse
import sys
import uuid

import zmq

from switchyard.protos import codec
from switchyard.protos.messages import (
    GenerateRequest,
    RouteRequest,
    SamplingParams,
    SnapshotRequest,
)

PROBE_MODEL = "switchyard-healthcheck"  # a model id no engine serves


def _request(kind: str) -> bytes:
    probe_id = f"healthcheck-{uuid.uuid4().hex[:12]}"
    if kind == "fleet":
        return codec.encode(SnapshotRequest())
    if kind == "router":
        return codec.encode(
            RouteRequest(request_id=probe_id, model=PROBE_MODEL, token_ids=[], dry_run=True)
        )
    return codec.encode(
        GenerateRequest(
            request_id=probe_id,
            instance_id=0,
            token_ids=[],
            sampling=SamplingParams(max_tokens=1),
        )
    )


def _answered(kind: str, payload: bytes) -> bool:
    if kind == "fleet":
        codec.fleet_control_reply.decode(payload)
    elif kind == "router":
        codec.route_response.decode(payload)
    else:
        codec.dispatcher_replies.decode(payload)
    return True


def check(kind: str, endpoint: str, timeout: float) -> str | None:
    """None when healthy, else what went wrong."""
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send(_request(kind))
        if not sock.poll(int(timeout * 1000)):
            return f"{kind} at {endpoint}: no answer within {timeout} s"
        frames = sock.recv_multipart()
        try:
            _answered(kind, frames[-1])
        except ValueError as exc:  # msgspec.DecodeError is a ValueError
            return f"{kind} at {endpoint}: undecodable answer: {exc}"
        return None
    except zmq.ZMQError as exc:
        return f"{kind} at {endpoint}: {exc}"
    finally:
        sock.close(linger=0)
        context.term()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m switchyard.common.healthcheck", description=__doc__.split("\n")[0]
    )
    parser.add_argument("kind", choices=["fleet", "router", "dispatcher"])
    parser.add_argument("endpoint", help="the service's ZMQ endpoint, e.g. tcp://127.0.0.1:7100")
    parser.add_argument("--timeout", type=float, default=3.0)
    args = parser.parse_args(argv)
    problem = check(args.kind, args.endpoint, args.timeout)
    if problem is not None:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
