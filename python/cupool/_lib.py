"""The C client library (include/cupool/client.h) through ctypes, loaded on first use."""
from __future__ import annotations

import ctypes
import os
import threading
from typing import Optional

from .errors import LibraryError

ABI_VERSION = 1
LIBRARY_NAME = "libcupool-client.so.1"

_c_void_pp = ctypes.POINTER(ctypes.c_void_p)
_c_char_pp = ctypes.POINTER(ctypes.c_char_p)

# name: (restype, argtypes). Handles (cupool_conn*, cupool_lease*) are void pointers.
_PROTOTYPES = {
    "cupool_abi_version": (ctypes.c_int, []),
    "cupool_status_name": (ctypes.c_char_p, [ctypes.c_int]),
    "cupool_connect": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p, _c_void_pp]),
    "cupool_disconnect": (None, [ctypes.c_void_p]),
    "cupool_last_error": (ctypes.c_char_p, [ctypes.c_void_p]),
    "cupool_backend": (ctypes.c_char_p, [ctypes.c_void_p]),
    "cupool_alloc": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint64, _c_void_pp]),
    "cupool_open_buffer": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, _c_void_pp]),
    "cupool_open_buffer_part": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint32, _c_void_pp]),
    "cupool_open_buffer_on": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_int,
                                             _c_void_pp]),
    "cupool_release": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p]),
    "cupool_set_cache_limit": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint64]),
    "cupool_cached_bytes": (ctypes.c_uint64, [ctypes.c_void_p]),
    "cupool_lease_address": (ctypes.c_uint64, [ctypes.c_void_p]),
    "cupool_lease_size": (ctypes.c_uint64, [ctypes.c_void_p]),
    "cupool_lease_id": (ctypes.c_uint64, [ctypes.c_void_p]),
    "cupool_lease_device": (ctypes.c_int, [ctypes.c_void_p]),
    # The reply is a char* the caller frees: a void pointer, so ctypes does not copy and drop it.
    "cupool_request": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, _c_void_pp]),
    "cupool_free_string": (None, [ctypes.c_void_p]),
}

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None


def library() -> ctypes.CDLL:
    """The loaded library: $CUPOOL_CLIENT_LIB (a path) if set, else the one installed with this
    package (``cmake --install`` and the .deb write where, in _installed.py), else
    libcupool-client.so.1 from the system's search path. Raises LibraryError when it is missing or
    not of ABI version 1."""
    global _lib
    with _lock:
        if _lib is None:
            _lib = _load()
        return _lib


def installed_library() -> Optional[str]:
    """The path of the library installed with this package, if it was installed with the library
    (not from pip) and the file is there; None otherwise."""
    try:
        from ._installed import LIBRARY_FROM_PACKAGE  # written by cmake --install
    except ImportError:
        return None
    path = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY_FROM_PACKAGE))
    return path if os.path.exists(path) else None


def _load() -> ctypes.CDLL:
    from_env = os.environ.get("CUPOOL_CLIENT_LIB")
    installed = None if from_env else installed_library()
    path = from_env or installed or LIBRARY_NAME
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        if from_env:
            raise LibraryError(f"cannot load the cupool client library at CUPOOL_CLIENT_LIB={path}: {e}") from None
        if installed:
            raise LibraryError(f"cannot load the cupool client library installed with this package, {path}: {e}; "
                               f"set CUPOOL_CLIENT_LIB to another copy's path") from None
        raise LibraryError(
            f"cannot load the cupool client library ({e}). Install cupool (it provides {LIBRARY_NAME}; "
            f"run ldconfig after installing into a prefix of your own), or set CUPOOL_CLIENT_LIB to the "
            f"library's path, e.g. build/{LIBRARY_NAME}") from None
    for name, (restype, argtypes) in _PROTOTYPES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise LibraryError(f"{path} has no {name}: it is not the cupool client library") from None
        fn.restype = restype
        fn.argtypes = argtypes
    version = lib.cupool_abi_version()
    if version != ABI_VERSION:
        raise LibraryError(f"{path} is of ABI version {version}; this package needs version {ABI_VERSION}")
    return lib


def text(value: Optional[bytes]) -> str:
    """A C string from the library as str ("" for NULL)."""
    return value.decode("utf-8", "replace") if value else ""
