"""Python client of the cupool holder (`cupool hold`): CUDA memory pools served to other processes.

    import cupool, torch
    with cupool.connect(name="my-server") as conn:   # $CUPOOL_SOCKET or /run/cupool/cupool.sock
        lease = conn.alloc("weights", 64 << 20)      # ready on return
        kv = torch.from_dlpack(lease)                # no copy; the lease lives while kv does
    weights = cupool.tensors("llama")                # `cupool buffer load llama model.safetensors`

Pure Python over libcupool-client.so.1 (ctypes): the one installed with the package, else set
CUPOOL_CLIENT_LIB to its path when it is not on the system's library path. docs/python.md in the
cupool repository has the whole guide.
"""
from .connection import Connection, connect
from .errors import (
    STATUS_NAMES, Busy, CudaError, CupoolError, Exists, FrameworkMissing, InternalError, InvalidArgument, LibraryError,
    NotFound, OutOfMemory, ProtocolError, QuotaExceeded, Refused, Unreachable,
)
from .lease import Lease
from .tensors import RawDtypeWarning, tensors

__version__ = "0.1.0"

__all__ = [
    "connect", "Connection", "Lease", "tensors",
    "CupoolError", "Unreachable", "Refused", "NotFound", "QuotaExceeded", "OutOfMemory", "InvalidArgument",
    "ProtocolError", "CudaError", "Busy", "Exists", "InternalError", "LibraryError", "FrameworkMissing",
    "STATUS_NAMES", "RawDtypeWarning",
]
