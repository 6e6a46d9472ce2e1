from __future__ import annotations

import orjson

from switchyard.preprocessor.errors import (
    InvalidRequestError,
    ModelNotFoundError,
    RequestError,
    ServiceUnavailableError,
    error_body,
)


class TestErrorBody:
    def test_openai_shape(self) -> None:
        body = orjson.loads(error_body("bad", "invalid_request_error", "invalid_value", "top_p"))
        assert body == {
            "error": {
                "message": "bad",
                "type": "invalid_request_error",
                "param": "top_p",
                "code": "invalid_value",
            }
        }

    def test_param_defaults_to_null(self) -> None:
        body = orjson.loads(error_body("m", "t", "c"))
        assert body["error"]["param"] is None


class TestRequestErrors:
    def test_invalid_request(self) -> None:
        exc = InvalidRequestError("nope", "missing_field", "model")
        assert isinstance(exc, RequestError)
        assert (exc.status, exc.type, exc.code, exc.param) == (
            400,
            "invalid_request_error",
            "missing_field",
            "model",
        )
        assert orjson.loads(exc.body())["error"]["message"] == "nope"
        assert str(exc) == "nope"

    def test_model_not_found(self) -> None:
        exc = ModelNotFoundError("gpt-9")
        assert (exc.status, exc.type, exc.code, exc.param) == (
            404,
            "not_found_error",
            "model_not_found",
            "model",
        )
        assert "gpt-9" in exc.message

    def test_service_unavailable(self) -> None:
        exc = ServiceUnavailableError("no engine serves this model")
        assert (exc.status, exc.type, exc.code) == (
            503,
            "service_unavailable",
            "no_engine_available",
        )
