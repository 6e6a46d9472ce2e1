"""Logging shared by every service's main: `--log-level`, `--log-format text|json`.

Text: one line per record, `time service LEVEL logger: message`, then the record's fields as
key=value. JSON: one object per line with `ts`, `level`, `service`, `instance` (the URL or
endpoint this process serves, once bound), `logger`, `msg` and the record's fields. Fields
are structured data passed as `extra={"fields": {...}}` (the access log, `request_id` on the
request path); `request_id` may also be passed as `extra={"request_id": ...}`.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any

import orjson

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
FORMATS = ("text", "json")


def add_logging_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-level", default="INFO", choices=LEVELS, type=str.upper, help="lowest level logged"
    )
    parser.add_argument(
        "--log-format",
        default="text",
        choices=FORMATS,
        help="text: one readable line per record; json: one JSON object per line, with "
        "request_id and instance as fields",
    )


class LogContext(logging.Filter):
    """Puts the process's service name and instance (its URL, set once bound) on every
    record; one per process, made by setup_logging."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service
        self.instance = ""

    def filter(self, record: logging.LogRecord) -> bool:
        record.service = self.service
        record.instance = self.instance
        return True


def _fields(record: logging.LogRecord) -> Mapping[str, Any]:
    fields = getattr(record, "fields", None)
    request_id = getattr(record, "request_id", None)
    if request_id is None:
        return fields or {}
    return {"request_id": request_id, **(fields or {})}


def _text_value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value)
    return text if text and " " not in text and '"' not in text else orjson.dumps(text).decode()


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(service)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = _fields(record)
        rid = fields.get("request_id")
        if rid is not None and len(fields) == 1 and f"request_id={rid}" in line:
            return line  # the message says it already
        if fields:
            line += " " + " ".join(f"{k}={_text_value(v)}" for k, v in fields.items())
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _timestamp(record.created),
            "level": record.levelname,
            "service": getattr(record, "service", ""),
            "instance": getattr(record, "instance", ""),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update(_fields(record))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def _timestamp(created: float) -> str:
    millis = int(created * 1000) % 1000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{millis:03d}Z"


def setup_logging(service: str, level: str = "INFO", fmt: str = "text") -> LogContext:
    """Configure the root logger for this process; set `.instance` on the result once the
    process knows its URL."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    context = LogContext(service)
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(context)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("grpc").setLevel(logging.WARNING)
    return context
