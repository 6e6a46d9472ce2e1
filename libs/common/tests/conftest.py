"""Fixtures shared by libs/common's tests."""

import functools

import pytest

from switchyard.common.engines.connect import client_for


@pytest.fixture(params=[False, True], ids=["grpc-streams", "http2-streams"])
def both_transports(request, monkeypatch):
    """The test runs once per Generate transport (a grpc.aio call, engines/http2.py): the
    module's `client_for` makes clients of that one."""
    monkeypatch.setattr(
        request.module,
        "client_for",
        functools.partial(client_for, http2_streams=request.param),
    )
    return request.param
