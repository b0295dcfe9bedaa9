"""Exceptions: one class per cupool_status of include/cupool/client.h, and the holder's error codes
(docs/protocol.md, "Error codes") mapped onto them."""
from __future__ import annotations

import re
from typing import Any, Dict, Mapping, Optional, Type

__all__ = [
    "CupoolError", "Unreachable", "Refused", "NotFound", "QuotaExceeded", "OutOfMemory",
    "InvalidArgument", "ProtocolError", "CudaError", "Busy", "Exists", "InternalError",
    "LibraryError", "FrameworkMissing", "STATUS_NAMES",
]

#: The C library's name of each status (cupool_status_name).
STATUS_NAMES: Dict[int, str] = {
    -1: "CUPOOL_E_UNREACHABLE",
    -2: "CUPOOL_E_REFUSED",
    -3: "CUPOOL_E_NOT_FOUND",
    -4: "CUPOOL_E_QUOTA",
    -5: "CUPOOL_E_OUT_OF_MEMORY",
    -6: "CUPOOL_E_INVALID",
    -7: "CUPOOL_E_PROTOCOL",
    -8: "CUPOOL_E_CUDA",
    -9: "CUPOOL_E_BUSY",
    -10: "CUPOOL_E_EXISTS",
    -11: "CUPOOL_E_INTERNAL",
}


class CupoolError(Exception):
    """A call failed. ``str(error)`` is the message (the holder's own, when the holder refused).

    Attributes: ``status`` (the negative cupool_status), ``status_name`` ("CUPOOL_E_QUOTA"),
    ``code`` (the holder's error code, "quota_exceeded", when the failure came from a reply;
    None when the C library failed the call itself).
    """

    status: int = -11

    def __init__(self, message: str, status: Optional[int] = None, code: Optional[str] = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status
        self.message = message
        self.code = code

    @property
    def status_name(self) -> str:
        """The C library's name of the status, e.g. "CUPOOL_E_NOT_FOUND"."""
        return STATUS_NAMES.get(self.status, f"CUPOOL_STATUS_{self.status}")


class Unreachable(CupoolError):
    """No holder listens at the socket, or the connection was lost."""
    status = -1


class Refused(CupoolError):
    """The holder refused: this user is not in the pool's share list, or the request needs an admin."""
    status = -2


class NotFound(CupoolError):
    """No such pool, device, buffer or lease."""
    status = -3


class QuotaExceeded(CupoolError):
    """The pool's quota_per_client would be exceeded."""
    status = -4


class OutOfMemory(CupoolError):
    """The pool (its max_size) or the device has no room."""
    status = -5


class InvalidArgument(CupoolError, ValueError):
    """A bad argument (the message says which), or a closed connection or released lease used."""
    status = -6


class ProtocolError(CupoolError):
    """The holder and this client do not understand each other (unknown op, bad frame, version)."""
    status = -7


class CudaError(CupoolError):
    """A CUDA driver call failed (in this process, or in the holder)."""
    status = -8


class Busy(CupoolError):
    """The holder is draining, a limit is reached, or the object is in use."""
    status = -9


class Exists(CupoolError):
    """A buffer of that name exists."""
    status = -10


class InternalError(CupoolError):
    """A bug in the holder or the library."""
    status = -11


class LibraryError(OSError):
    """libcupool-client.so.1 could not be loaded, or it is not of ABI version 1."""


class FrameworkMissing(ModuleNotFoundError):
    """``cupool.tensors(framework=...)`` names a framework this Python can't import; the message
    says which package to install and what works without it. ``name`` is the module ("torch")."""


_BY_STATUS: Dict[int, Type[CupoolError]] = {
    cls.status: cls for cls in (Unreachable, Refused, NotFound, QuotaExceeded, OutOfMemory, InvalidArgument,
                                ProtocolError, CudaError, Busy, Exists, InternalError)
}

#: The holder's error codes (docs/protocol.md) and the exception each raises.
CODE_TO_ERROR: Mapping[str, Type[CupoolError]] = {
    "bad_frame": ProtocolError,
    "bad_request": InvalidArgument,
    "unknown_op": ProtocolError,
    "unsupported_protocol": ProtocolError,
    "hello_required": ProtocolError,
    "not_permitted": Refused,
    "not_found": NotFound,
    "exists": Exists,
    "quota_exceeded": QuotaExceeded,
    "out_of_memory": OutOfMemory,
    "limit_exceeded": Busy,
    "busy": Busy,
    "draining": Busy,
    "invalid_config": InvalidArgument,
    "does_not_fit": InvalidArgument,
    "cuda_error": CudaError,
    "internal": InternalError,
}


# The C library's hint names the command line's option; a Python caller passes socket= instead.
_CLI_SOCKET_HINT = re.compile(r"Set --socket or CUPOOL_SOCKET for another path")
_PYTHON_SOCKET_HINT = ("For another path pass socket= to cupool.connect() (or cupool.tensors()), "
                       "or set CUPOOL_SOCKET")


def error_for_status(status: int, message: str) -> CupoolError:
    """The exception for a status the C library returned (an unknown one gives a CupoolError)."""
    message = _CLI_SOCKET_HINT.sub(_PYTHON_SOCKET_HINT, message).replace("--socket", "socket=")
    cls = _BY_STATUS.get(status)
    if cls is None:
        return CupoolError(message or f"cupool status {status}", status=status)
    return cls(message or STATUS_NAMES[status])


def error_for_reply(reply: Mapping[str, Any]) -> CupoolError:
    """The exception for a holder reply with "ok": false. An unknown code is a ProtocolError, as in
    the C library."""
    error = reply.get("error") or {}
    code = str(error.get("code", ""))
    message = str(error.get("message", "")) or f"the holder answered {code or 'an error'}"
    return CODE_TO_ERROR.get(code, ProtocolError)(message, code=code)
