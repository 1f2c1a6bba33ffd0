"""Typed errors, mapped once from gRPC status codes.

Every error the runtime returns is a `PhronyRuntimeError` (the 0.1.0 class, so `except
PhronyRuntimeError` keeps working); its subclass names the status code, so callers can catch
exactly what they handle:

| gRPC status | exception |
|---|---|
| INVALID_ARGUMENT | `InvalidArgumentError` |
| NOT_FOUND | `NotFoundError` |
| ALREADY_EXISTS | `AlreadyExistsError` |
| FAILED_PRECONDITION | `FailedPreconditionError` |
| PERMISSION_DENIED | `PermissionDeniedError` |
| UNAUTHENTICATED | `UnauthenticatedError` |
| RESOURCE_EXHAUSTED | `ResourceExhaustedError` |
| UNAVAILABLE | `UnavailableError` |
| DEADLINE_EXCEEDED | `DeadlineExceededError` |
| OUT_OF_RANGE | `OutOfRangeError` |
| ABORTED | `AbortedError` |
| CANCELLED | `RpcCancelledError` |
| UNIMPLEMENTED | `UnimplementedError` |
| INTERNAL, DATA_LOSS, UNKNOWN | `InternalError` |
"""

from __future__ import annotations

import grpc

# The status code's name, e.g. "NOT_FOUND" (as in 0.1.0); `PhronyRuntimeError.status` is the enum.
GrpcStatusCode = str


class PhronyError(Exception):
    """Base of every error this SDK raises on purpose."""


class PhronyRuntimeError(PhronyError):
    """The runtime answered an RPC with an error status.

    `action` is what the SDK was doing (e.g. `"list approvals"`), `grpc_code` the status
    code's name (`"NOT_FOUND"`), `status` the `grpc.StatusCode`, `code` its number, `details`
    the runtime's message, `rpc_message` the text shown.
    """

    def __init__(self, action: str, *, code: int, grpc_code: GrpcStatusCode, details: str, rpc_message: str) -> None:
        super().__init__(rpc_message)
        self.name = "PhronyRuntimeError"
        self.action = action
        self.code = code
        self.grpc_code = grpc_code
        self.status = grpc.StatusCode[grpc_code] if grpc_code in grpc.StatusCode.__members__ else grpc.StatusCode.UNKNOWN
        self.details = details
        self.rpc_message = rpc_message

    def __str__(self) -> str:
        return self.rpc_message


class InvalidArgumentError(PhronyRuntimeError):
    """The request is malformed (INVALID_ARGUMENT)."""


class NotFoundError(PhronyRuntimeError):
    """No such agent, version, session or approval (NOT_FOUND)."""


class AlreadyExistsError(PhronyRuntimeError):
    """Conflicting immutable data (ALREADY_EXISTS)."""


class FailedPreconditionError(PhronyRuntimeError):
    """Valid, but not allowed in the current state (FAILED_PRECONDITION), e.g. deciding an
    approval that is no longer pending."""


class PermissionDeniedError(PhronyRuntimeError):
    """The credential lacks the permission the RPC needs (PERMISSION_DENIED)."""


class UnauthenticatedError(PhronyRuntimeError):
    """No credential, or a bad, expired or revoked one (UNAUTHENTICATED)."""


class ResourceExhaustedError(PhronyRuntimeError):
    """A documented bound was reached (RESOURCE_EXHAUSTED)."""


class UnavailableError(PhronyRuntimeError):
    """The runtime cannot be reached or is stopping (UNAVAILABLE)."""


class DeadlineExceededError(PhronyRuntimeError):
    """The call's deadline passed (DEADLINE_EXCEEDED)."""


class OutOfRangeError(PhronyRuntimeError):
    """A size or range bound was exceeded (OUT_OF_RANGE)."""


class AbortedError(PhronyRuntimeError):
    """The operation was aborted, e.g. a concurrent change (ABORTED)."""


class RpcCancelledError(PhronyRuntimeError):
    """The RPC was cancelled (CANCELLED)."""


class UnimplementedError(PhronyRuntimeError):
    """The runtime does not implement the RPC (UNIMPLEMENTED), e.g. an older daemon."""


class InternalError(PhronyRuntimeError):
    """The runtime failed (INTERNAL, DATA_LOSS or UNKNOWN)."""


ERROR_BY_CODE: dict[grpc.StatusCode, type[PhronyRuntimeError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRangeError,
    grpc.StatusCode.ABORTED: AbortedError,
    grpc.StatusCode.CANCELLED: RpcCancelledError,
    grpc.StatusCode.UNIMPLEMENTED: UnimplementedError,
    grpc.StatusCode.INTERNAL: InternalError,
    grpc.StatusCode.DATA_LOSS: InternalError,
    grpc.StatusCode.UNKNOWN: InternalError,
}


def wrap_rpc_error(action: str, err: object) -> PhronyRuntimeError:
    """The typed error for a failed RPC (`err` is normally a `grpc.aio.AioRpcError`; anything
    else becomes an `InternalError` carrying its text)."""
    code_fn = getattr(err, "code", None)
    details_fn = getattr(err, "details", None)
    status = code_fn() if callable(code_fn) else None
    if not isinstance(status, grpc.StatusCode):
        status = grpc.StatusCode.UNKNOWN
    details = details_fn() if callable(details_fn) else None
    if not details:
        details = str(err) or status.name
    cls = ERROR_BY_CODE.get(status, PhronyRuntimeError)
    return cls(
        action,
        code=status.value[0],
        grpc_code=status.name,
        details=details,
        rpc_message=f"{action}: {details} ({status.name})",
    )
