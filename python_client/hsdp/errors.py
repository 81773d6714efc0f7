"""Exceptions raised by hsdp.

Every failure of the daemon or the client library arrives as an
:class:`HsdpError` subclass carrying ``code`` (the absl status code),
``code_name`` and ``message``. The mapping from status codes lives in one
place, the extension (python_client/src/errors.cc); this module re-exports it.
Several classes also derive from the matching builtin, so generic handlers
work: ``except ValueError`` catches InvalidArgument, ``except
ConnectionError`` catches Unavailable, ``except TimeoutError`` catches
DeadlineExceeded, ``except MemoryError`` catches ResourceExhausted.
"""
from hsdp._hsdp import (  # noqa: F401
    Aborted,
    AlreadyExists,
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    HsdpError,
    Internal,
    InvalidArgument,
    NotFound,
    OutOfRange,
    PermissionDenied,
    ResourceExhausted,
    Unavailable,
    Unimplemented,
)

__all__ = [
    "Aborted", "AlreadyExists", "Cancelled", "DeadlineExceeded", "FailedPrecondition",
    "HsdpError", "Internal", "InvalidArgument", "NotFound", "OutOfRange",
    "PermissionDenied", "ResourceExhausted", "Unavailable", "Unimplemented",
]
