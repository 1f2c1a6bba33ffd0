"""Every gRPC status code maps to one typed exception, all of them `PhronyRuntimeError`s that
keep 0.1.0's attributes (`grpc_code` is the status name)."""

from __future__ import annotations

import grpc
import pytest

import phrony
from phrony.client.errors import ERROR_BY_CODE, PhronyRuntimeError, wrap_rpc_error


class FakeRpcError:
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@pytest.mark.parametrize("status", [s for s in grpc.StatusCode if s is not grpc.StatusCode.OK], ids=lambda s: s.name)
def test_each_status_code_has_its_typed_error(status):
    error = wrap_rpc_error("list approvals", FakeRpcError(status, "something is wrong"))
    assert type(error) is ERROR_BY_CODE[status]
    assert isinstance(error, PhronyRuntimeError) and isinstance(error, phrony.PhronyError)
    assert (error.grpc_code, error.status, error.code) == (status.name, status, status.value[0])
    assert error.details == "something is wrong" and error.action == "list approvals"
    assert str(error) == f"list approvals: something is wrong ({status.name})"
    # Exported from the package root, so callers can catch it by name.
    assert getattr(phrony, type(error).__name__) is type(error)


def test_anything_else_is_an_internal_error():
    error = wrap_rpc_error("work stream", RuntimeError("socket closed"))
    assert isinstance(error, phrony.InternalError)
    assert error.details == "socket closed"
