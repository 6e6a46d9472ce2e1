import grpc
import pytest

from switchyard.common import errors
from switchyard.common.errors import EngineError, kind_of_exception, kind_of_status

EXPECTED = {
    grpc.StatusCode.OK: errors.ENGINE_ERROR,  # never raised; not a fault kind of its own
    grpc.StatusCode.CANCELLED: errors.CANCELLED,
    grpc.StatusCode.UNKNOWN: errors.ENGINE_ERROR,
    grpc.StatusCode.INVALID_ARGUMENT: errors.BAD_REQUEST,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.TIMEOUT,
    grpc.StatusCode.NOT_FOUND: errors.BAD_REQUEST,
    grpc.StatusCode.ALREADY_EXISTS: errors.BAD_REQUEST,
    grpc.StatusCode.PERMISSION_DENIED: errors.ENGINE_ERROR,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.OVERLOADED,
    grpc.StatusCode.FAILED_PRECONDITION: errors.BAD_REQUEST,
    grpc.StatusCode.ABORTED: errors.DISCONNECTED,
    grpc.StatusCode.OUT_OF_RANGE: errors.BAD_REQUEST,
    grpc.StatusCode.UNIMPLEMENTED: errors.BAD_REQUEST,
    grpc.StatusCode.INTERNAL: errors.ENGINE_ERROR,
    grpc.StatusCode.UNAVAILABLE: errors.CANNOT_CONNECT,  # made up by the transport
    grpc.StatusCode.DATA_LOSS: errors.ENGINE_ERROR,
    grpc.StatusCode.UNAUTHENTICATED: errors.ENGINE_ERROR,
}


def rpc_error(code: grpc.StatusCode, details: str = "boom") -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


class TestRemapTable:
    def test_every_status_code_has_a_kind(self):
        assert set(EXPECTED) == set(grpc.StatusCode)

    @pytest.mark.parametrize("code", list(grpc.StatusCode), ids=lambda c: c.name)
    def test_status_code(self, code):
        assert kind_of_status(code) == EXPECTED[code]
        assert kind_of_exception(rpc_error(code)) == EXPECTED[code]

    @pytest.mark.parametrize(
        "exc,kind",
        [
            (ConnectionRefusedError(), errors.CANNOT_CONNECT),
            (ConnectionResetError(), errors.CANNOT_CONNECT),
            (TimeoutError(), errors.TIMEOUT),
            (RuntimeError("?"), errors.ENGINE_ERROR),
        ],
    )
    def test_transport_exceptions(self, exc, kind):
        assert kind_of_exception(exc) == kind


class TestRefusedOnALiveConnection:
    """Regression (QA: one UNAVAILABLE answer took a whole engine out of rotation): an
    UNAVAILABLE the engine answered over a live connection refuses that call only."""

    def test_unavailable_from_the_engine_is_refused(self):
        assert kind_of_status(grpc.StatusCode.UNAVAILABLE, connected=True) == errors.REFUSED
        exc = rpc_error(grpc.StatusCode.UNAVAILABLE)
        assert kind_of_exception(exc, connected=True) == errors.REFUSED

    def test_unavailable_made_by_the_transport_is_cannot_connect(self):
        assert kind_of_status(grpc.StatusCode.UNAVAILABLE) == errors.CANNOT_CONNECT

    @pytest.mark.parametrize(
        "code", [c for c in grpc.StatusCode if c != grpc.StatusCode.UNAVAILABLE], ids=str
    )
    def test_other_codes_do_not_depend_on_the_connection(self, code):
        assert kind_of_status(code, connected=True) == kind_of_status(code) == EXPECTED[code]

    def test_refused_migrates_without_marking_down(self):
        assert errors.REFUSED in errors.MIGRATABLE
        assert errors.REFUSED not in errors.INSTANCE_DOWN

    def test_from_exception(self):
        exc = rpc_error(grpc.StatusCode.UNAVAILABLE, "draining")
        error = EngineError.from_exception(exc, 3, connected=True)
        assert (error.kind, error.instance_id, error.message) == (
            errors.REFUSED,
            3,
            "UNAVAILABLE: draining",
        )


class TestWhatKindsMean:
    def test_instance_down_kinds_migrate(self):
        assert errors.INSTANCE_DOWN <= errors.MIGRATABLE

    def test_client_faults_never_migrate(self):
        for kind in (errors.BAD_REQUEST, errors.CANCELLED, errors.ENGINE_ERROR):
            assert kind not in errors.MIGRATABLE

    def test_a_stream_without_its_final_message_migrates_without_marking_down(self):
        assert errors.DISCONNECTED in errors.MIGRATABLE
        assert errors.DISCONNECTED not in errors.INSTANCE_DOWN

    def test_overload_migrates_without_marking_down(self):
        assert errors.OVERLOADED in errors.MIGRATABLE
        assert errors.OVERLOADED not in errors.INSTANCE_DOWN


class TestEngineError:
    def test_from_rpc_error_keeps_code_and_details(self):
        exc = EngineError.from_exception(rpc_error(grpc.StatusCode.UNAVAILABLE, "refused"), 7)
        assert (exc.kind, exc.instance_id, exc.message) == (
            errors.CANNOT_CONNECT,
            7,
            "UNAVAILABLE: refused",
        )
