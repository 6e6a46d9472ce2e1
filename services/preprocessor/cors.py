"""CORS at the edge, off unless `--cors-allow-origin` names an origin (or `*`).

Starlette's CORSMiddleware (what FastAPI apps and vLLM's server use) in front of the edge:
a preflight (OPTIONS with Origin and Access-Control-Request-Method) is answered there,
before the key check (a browser sends no credentials on a preflight): 200 with the allowed
methods and headers, or 400 naming what is not allowed. Every other response to an allowed
origin carries Access-Control-Allow-Origin (and -Credentials), so a browser app can read
the answer, errors included; X-Request-Id and Retry-After are exposed to it. With CORS off
nothing wraps the edge (a response's messages pass one more function each when on).
"""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import urlsplit

from starlette.middleware.cors import CORSMiddleware

from switchyard.common.argtypes import whole_number

DEFAULT_METHODS = ["GET", "POST", "DELETE"]
EXPOSED = ["x-request-id", "request-id", "retry-after"]


def origin(text: str) -> str:
    """argparse type: `*`, or scheme://host[:port] with nothing after it (what a browser
    sends in Origin)."""
    if text == "*":
        return text
    parts = urlsplit(text)
    if (
        parts.scheme not in ("http", "https")
        or not parts.netloc
        or text.rstrip("/") != (f"{parts.scheme}://{parts.netloc}")
    ):
        raise argparse.ArgumentTypeError(
            f"not an origin: {text!r} (scheme://host[:port], e.g. https://app.example.com, or *)"
        )
    return text.rstrip("/")


def add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--cors-allow-origin",
        action="append",
        type=origin,
        default=[],
        metavar="ORIGIN",
        help="turn CORS on for this browser origin, e.g. https://app.example.com (repeat; * "
        "for any); default: CORS off",
    )
    group.add_argument(
        "--cors-allow-method",
        action="append",
        default=[],
        metavar="METHOD",
        help=f"a method cross-origin requests may use (repeat; * for any; default "
        f"{', '.join(DEFAULT_METHODS)})",
    )
    group.add_argument(
        "--cors-allow-header",
        action="append",
        default=[],
        metavar="HEADER",
        help="a request header cross-origin requests may send (repeat; default *: any)",
    )
    group.add_argument(
        "--cors-allow-credentials",
        action="store_true",
        help="let browsers send cookies and HTTP authentication cross-origin "
        "(Access-Control-Allow-Credentials)",
    )
    group.add_argument(
        "--cors-max-age",
        type=whole_number(0),
        default=600,
        metavar="SECONDS",
        help="how long a browser may cache a preflight's answer (default 600)",
    )


def wrap(app: Any, args: argparse.Namespace) -> Any:
    """`app` behind CORS when an origin is allowed, else `app` itself."""
    if not args.cors_allow_origin:
        for flag in ("cors_allow_method", "cors_allow_header"):
            if getattr(args, flag):
                raise ValueError(f"--{flag.replace('_', '-')} needs --cors-allow-origin")
        return app
    return CORSMiddleware(
        app,
        allow_origins=args.cors_allow_origin,
        allow_methods=[m.upper() for m in args.cors_allow_method] or DEFAULT_METHODS,
        allow_headers=args.cors_allow_header or ["*"],
        allow_credentials=args.cors_allow_credentials,
        expose_headers=EXPOSED,
        max_age=args.cors_max_age,
    )


def argv(args: argparse.Namespace) -> list[str]:
    """The same flags for a child process (`switchyard up`)."""
    out: list[str] = []
    for value in args.cors_allow_origin:
        out += ["--cors-allow-origin", value]
    for value in args.cors_allow_method:
        out += ["--cors-allow-method", value]
    for value in args.cors_allow_header:
        out += ["--cors-allow-header", value]
    if args.cors_allow_credentials:
        out.append("--cors-allow-credentials")
    if args.cors_allow_origin:
        out += ["--cors-max-age", str(args.cors_max_age)]
    return out
