"""Errors raised by the libpegaflow binding.

libpegaflow returns 0 or -errno and records the gRPC status of the failed call in
thread-local storage (pf_last_error_code / pf_last_error_message). The binding reads both
on the calling thread right after the call and raises one of the classes below, chosen by
the gRPC code (or, for failures that never reached the wire, by the errno).
"""

from __future__ import annotations

import errno as _errno

# gRPC status codes (grpc_status_code).
OK = 0
CANCELLED = 1
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
NOT_FOUND = 5
ALREADY_EXISTS = 6
PERMISSION_DENIED = 7
RESOURCE_EXHAUSTED = 8
FAILED_PRECONDITION = 9
ABORTED = 10
OUT_OF_RANGE = 11
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14
DATA_LOSS = 15
UNAUTHENTICATED = 16

CODE_NAMES = {
    OK: "OK",
    CANCELLED: "CANCELLED",
    UNKNOWN: "UNKNOWN",
    INVALID_ARGUMENT: "INVALID_ARGUMENT",
    DEADLINE_EXCEEDED: "DEADLINE_EXCEEDED",
    NOT_FOUND: "NOT_FOUND",
    ALREADY_EXISTS: "ALREADY_EXISTS",
    PERMISSION_DENIED: "PERMISSION_DENIED",
    RESOURCE_EXHAUSTED: "RESOURCE_EXHAUSTED",
    FAILED_PRECONDITION: "FAILED_PRECONDITION",
    ABORTED: "ABORTED",
    OUT_OF_RANGE: "OUT_OF_RANGE",
    UNIMPLEMENTED: "UNIMPLEMENTED",
    INTERNAL: "INTERNAL",
    UNAVAILABLE: "UNAVAILABLE",
    DATA_LOSS: "DATA_LOSS",
    UNAUTHENTICATED: "UNAUTHENTICATED",
}

# pegaflow.h: -ECONNREFUSED unreachable, -ETIMEDOUT deadline, -EINVAL invalid argument,
# -EPERM failed precondition, -EIO internal; rpc.h adds -EOPNOTSUPP unimplemented,
# -ENOENT not found, -ENOBUFS resource exhausted, -ECANCELED cancelled.
_ERRNO_TO_CODE = {
    _errno.ECONNREFUSED: UNAVAILABLE,
    _errno.ETIMEDOUT: DEADLINE_EXCEEDED,
    _errno.EINVAL: INVALID_ARGUMENT,
    _errno.EPERM: FAILED_PRECONDITION,
    _errno.EIO: INTERNAL,
    _errno.EOPNOTSUPP: UNIMPLEMENTED,
    _errno.ENOENT: NOT_FOUND,
    _errno.ENOBUFS: RESOURCE_EXHAUSTED,
    _errno.ECANCELED: CANCELLED,
}


# rpc.h pf_errno_from_grpc_code: the -errno a call returns for each recorded status.
_CODE_TO_ERRNO = {
    INVALID_ARGUMENT: _errno.EINVAL,
    FAILED_PRECONDITION: _errno.EPERM,
    DEADLINE_EXCEEDED: _errno.ETIMEDOUT,
    UNAVAILABLE: _errno.ECONNREFUSED,
    UNIMPLEMENTED: _errno.EOPNOTSUPP,
    INTERNAL: _errno.EIO,
    NOT_FOUND: _errno.ENOENT,
    RESOURCE_EXHAUSTED: _errno.ENOBUFS,
    CANCELLED: _errno.ECANCELED,
}


class PegaflowError(RuntimeError):
    """A libpegaflow call failed.

    Attributes: ``method`` (the C function), ``rc`` (its -errno return value), ``code``
    (gRPC status code, 0 when the failure happened before the wire), ``message``.
    """

    code_default = UNKNOWN

    def __init__(self, method: str, rc: int, code: int, message: str):
        self.method = method
        self.rc = rc
        self.code = code
        self.message = message
        name = CODE_NAMES.get(code, f"code {code}")
        err = _errno.errorcode.get(-rc, str(rc)) if rc < 0 else str(rc)
        super().__init__(f"{method} failed: {name} ({err}): {message}")


class Unavailable(PegaflowError):
    """The server is unreachable (UNAVAILABLE)."""


class DeadlineExceeded(PegaflowError):
    """The call's deadline passed (DEADLINE_EXCEEDED)."""


class InvalidArgument(PegaflowError, ValueError):
    """The server rejected an argument (INVALID_ARGUMENT)."""


class FailedPrecondition(PegaflowError):
    """Unknown instance, unsealed topology, unknown lease, ... (FAILED_PRECONDITION)."""


class VersionMismatch(FailedPrecondition):
    """RegisterContextBatch: client_version differs from the server's version."""


class Internal(PegaflowError):
    """Server-side internal error (INTERNAL), e.g. pinned pool exhausted."""


class Unimplemented(PegaflowError):
    """The server does not implement the RPC (UNIMPLEMENTED)."""


class LibraryError(RuntimeError):
    """The library cannot be used: not found, or it lacks a function this binding needs."""


_CODE_TO_CLASS = {
    UNAVAILABLE: Unavailable,
    DEADLINE_EXCEEDED: DeadlineExceeded,
    INVALID_ARGUMENT: InvalidArgument,
    FAILED_PRECONDITION: FailedPrecondition,
    INTERNAL: Internal,
    UNIMPLEMENTED: Unimplemented,
}


def code_from_errno(rc: int) -> int:
    """gRPC code implied by a -errno return value (UNKNOWN when it implies none)."""
    return _ERRNO_TO_CODE.get(-rc, UNKNOWN)


def status_belongs_to(rc: int, code: int) -> bool:
    """Whether the thread's recorded status (code) can be the one of a call that returned
    rc. A failure decided before the wire (e.g. -ENOMEM) may leave an older call's status
    in place; that stale status must not be reported as this call's."""
    if code == OK:
        return False
    return -rc == _CODE_TO_ERRNO.get(code, _errno.EPROTO)


def error_for(method: str, rc: int, code: int, message: str) -> PegaflowError:
    """Exception for a failed call: the recorded gRPC status when it belongs to this call
    (status_belongs_to), else the status implied by the errno alone."""
    if not status_belongs_to(rc, code):
        code = code_from_errno(rc)
        message = f"{_errno.errorcode.get(-rc, rc)}: {__import__('os').strerror(-rc)}" \
            if rc < 0 else f"return code {rc}"
    cls = _CODE_TO_CLASS.get(code, PegaflowError)
    if cls is FailedPrecondition and "version mismatch" in message.lower():
        cls = VersionMismatch
    return cls(method, rc, code, message)


def is_unreachable(exc: BaseException) -> bool:
    """True for the failures the reference client treats as "server not there"."""
    return isinstance(exc, (Unavailable, DeadlineExceeded))
