"""--log-format: text lines with fields, JSON objects with service, instance and fields."""

from __future__ import annotations

import logging
import sys

import orjson
import pytest

from switchyard.common.logs import JsonFormatter, LogContext, TextFormatter, setup_logging


def record(msg: str, *args: object, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("switchyard.x", logging.WARNING, __file__, 1, msg, args, None)
    for key, value in extra.items():
        setattr(rec, key, value)
    context = LogContext("router")
    context.instance = "tcp://127.0.0.1:7200"
    context.filter(rec)
    return rec


def test_text_puts_fields_after_the_message():
    line = TextFormatter().format(record("took %d ms", 5, fields={"a": 1, "b": "x y", "c": None}))
    assert line.endswith('router WARNING switchyard.x: took 5 ms a=1 b="x y" c=-')


def test_text_does_not_repeat_a_request_id_the_message_has():
    line = TextFormatter().format(record("failed request_id=%s", "r1", request_id="r1"))
    assert line.endswith("failed request_id=r1")
    line = TextFormatter().format(record("failed", request_id="r1"))
    assert line.endswith("failed request_id=r1")


def test_json_has_the_process_fields_and_the_record_fields():
    rec = record("hi %s", "there", request_id="r2", fields={"n": 3})
    out = orjson.loads(JsonFormatter().format(rec))
    assert out["msg"] == "hi there" and out["level"] == "WARNING"
    assert (out["service"], out["instance"]) == ("router", "tcp://127.0.0.1:7200")
    assert (out["request_id"], out["n"], out["logger"]) == ("r2", 3, "switchyard.x")
    assert out["ts"].endswith("Z")


def test_json_carries_tracebacks():
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        rec = record("oops")
        rec.exc_info = sys.exc_info()
    out = orjson.loads(JsonFormatter().format(rec))
    assert "RuntimeError: boom" in out["exc"]


def test_setup_rejects_an_unknown_format():
    with pytest.raises(ValueError, match="text, json"):
        setup_logging("x", "INFO", "xml")
