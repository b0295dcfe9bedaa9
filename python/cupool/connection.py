"""A connection to the holder (`cupool hold`) through libcupool-client.so.1."""
from __future__ import annotations

import ctypes
import json
import os
import weakref
from typing import Any, Dict, Mapping, Optional, Union

from . import _devices, _lib
from ._session import Session
from .errors import InvalidArgument, NotFound, error_for_reply, error_for_status
from .lease import Lease

PathLike = Union[str, "os.PathLike[str]"]
_UINT64_MAX = (1 << 64) - 1
_INT_MAX = (1 << 31) - 1


class Connection:
    """A connection to the holder; use ``cupool.connect()``.

    A context manager: leaving the ``with`` block closes it. Closing frees the leases nothing was
    exported from; a lease an array or tensor still uses keeps the connection open until that
    array or tensor goes (the holder frees everything once the process exits). The methods may be
    called from several threads (the library serialises them). Failures raise the CupoolError
    subclass of their status, with the holder's message.
    """

    def __init__(self, socket: Optional[PathLike] = None, name: Optional[str] = None) -> None:
        lib = _lib.library()
        handle = ctypes.c_void_p()
        path = _c_string("socket", os.fsencode(socket)) if socket is not None else None
        status = lib.cupool_connect(path, _c_string("name", name) if name is not None else None,
                                    ctypes.byref(handle))
        if status != 0:
            raise error_for_status(status, _lib.text(lib.cupool_last_error(None)))
        self._session = Session(lib, handle.value)
        #: "cuda" or "simulated": what the holder runs on.
        self.backend: str = _lib.text(lib.cupool_backend(handle))
        # The library reads CUPOOL_CLIENT_CACHE at connect: "0" turns the cache off.
        self._cache_limit: Optional[int] = 0 if os.environ.get("CUPOOL_CLIENT_CACHE") == "0" else None
        self._devices_of: Dict[str, Dict[str, int]] = {}  # pool -> {UUID: the holder's ordinal}
        self._finalizer = weakref.finalize(self, self._session.close)

    # ---- memory ----

    def alloc(self, pool: str, size: int, device: Union[int, str, None] = None) -> Lease:
        """Allocates `size` bytes from `pool` on the holder's device `device`: its ordinal as the
        holder numbers it, or its UUID ("GPU-..."). None: the device this process uses now (its
        current CUDA context's, CUDA_VISIBLE_DEVICES taken into account) where the pool is on it,
        else the pool's first device. The memory is ready on return."""
        _require_int("size", size, 0, _UINT64_MAX)
        if _devices.is_uuid(device):
            return self._alloc(pool, size, self._holder_device(pool, str(device)))
        if device is not None:
            _require_int("device", device, 0, _INT_MAX)
            return self._alloc(pool, size, device)
        current = _devices.current()
        here = _devices.uuid_of(current) if current is not None else None
        if here is None:
            return self._alloc(pool, size, None)
        try:
            return self._alloc(pool, size, self._pool_devices(pool).get(here.lower()))
        except NotFound:
            self._devices_of.pop(pool, None)  # the pool may have moved since it was asked: ask again, once
            return self._alloc(pool, size, self._pool_devices(pool).get(here.lower()))

    def _alloc(self, pool: str, size: int, device: Optional[int]) -> Lease:
        out = ctypes.c_void_p()
        session = self._session
        with session.lock:
            handle = session.check_open()
            session.check(session.lib.cupool_alloc(handle, _c_string("pool", pool), -1 if device is None else device,
                                                   size, ctypes.byref(out)))
            return Lease(self, session, out.value, pool=pool)

    def _pool_devices(self, pool: str) -> Dict[str, int]:
        """The holder's devices of `pool` by UUID (lower case), asked once per connection."""
        if pool not in self._devices_of:
            listed = self.request({"op": "list"}).get("pools") or []
            self._devices_of[pool] = {str(p.get("uuid", "")).lower(): p["device"] for p in listed
                                      if p.get("name") == pool and isinstance(p.get("device"), int)}
        return self._devices_of[pool]

    def _holder_device(self, pool: str, uuid: str) -> int:
        """The holder's ordinal of the device `uuid` that holds `pool`; NotFound when none does."""
        devices = self._pool_devices(pool)
        found = devices.get(uuid.lower())
        if found is None:
            self._devices_of.pop(pool, None)
            found = self._pool_devices(pool).get(uuid.lower())
        if found is None:
            held = ", ".join("GPU-" + u[4:] for u in sorted(self._devices_of.get(pool, {}))) or "none"
            raise NotFound(f"pool {pool} is not held on device {uuid} (it is on: {held})")
        return found

    def open_buffer(self, name: str, part: int = 0, device: Union[int, str, None] = None) -> Lease:
        """Opens the named buffer (the config's `buffers:` or `cupool buffer create`), or part
        ``part`` of a buffer held in parts (a tensor set from `cupool buffer load`: see
        ``tensor_index``). ``device``: this process's CUDA device to use it from, its ordinal or its
        UUID ("GPU-...") (default: the one that holds it); another device maps it over peer access
        where the pool's ``access`` allows (Refused otherwise). Raises NotFound when there is no
        such buffer or part, or no such device in this process."""
        if not 0 <= part < 2**32:
            raise InvalidArgument(f"part must be 0 or more, not {part}")
        if _devices.is_uuid(device):
            device = self._process_device(str(device))
        elif device is not None and (not isinstance(device, int) or not 0 <= device < 2**31):
            raise InvalidArgument(f"device must be a CUDA ordinal of this process or a GPU UUID, not {device!r}")
        out = ctypes.c_void_p()
        session = self._session
        with session.lock:
            handle = session.check_open()
            session.check(session.lib.cupool_open_buffer_on(handle, _c_string("name", name), part,
                                                            -1 if device is None else device, ctypes.byref(out)))
            return Lease(self, session, out.value, name=name)

    def _process_device(self, uuid: str) -> int:
        """This process's ordinal of the device `uuid`: as CUDA numbers it here, or on a simulated
        node as the holder does (its "devices" are the holder's); NotFound when it sees none."""
        if self.backend == "simulated":
            listed = self.request({"op": "list"})
            for entry in (listed.get("pools") or []) + (listed.get("buffers") or []):
                if str(entry.get("uuid", "")).lower() == uuid.lower() and isinstance(entry.get("device"), int):
                    return entry["device"]
        else:
            found = _devices.ordinal_of(uuid)
            if found is not None:
                return found
        raise NotFound(f"device {uuid} is not visible in this process; check CUDA_VISIBLE_DEVICES")

    def tensor_index(self, name: str) -> Dict[str, Any]:
        """The tensor index of buffer `name` (`cupool buffer load`): {"name", "size_bytes", "indexed",
        "parts": [{"part", "size_bytes"}, ...], "tensors": [{"name", "dtype", "shape", "part",
        "offset_bytes", "size_bytes"}], "metadata": {}}; a tensor's offset counts bytes from the
        start of its part (open a part with ``open_buffer(name, part)``). ``cupool.tensors(name)``
        turns it into tensors. A buffer made without an index (the config's ``buffers:``,
        ``buffer_create``) has "indexed": False and no tensors."""
        reply = self.request({"op": "buffer_tensors", "name": name})
        return {key: value for key, value in reply.items() if key not in ("id", "ok")}

    # ---- the cache (protocol 2) ----

    @property
    def cache_limit(self) -> Optional[int]:
        """At most this many bytes of released allocations stay cached on this connection (None:
        no limit, the library's default; 0: no cache). Setting it frees what is cached beyond."""
        return self._cache_limit

    @cache_limit.setter
    def cache_limit(self, limit: Optional[int]) -> None:
        if limit is not None:
            _require_int("cache_limit", limit, 0, _UINT64_MAX)
        session = self._session
        with session.lock:
            handle = session.check_open()
            session.check(session.lib.cupool_set_cache_limit(handle, _UINT64_MAX if limit is None else limit))
            self._cache_limit = limit

    @property
    def cached_bytes(self) -> int:
        """Bytes of released allocations this connection keeps cached now."""
        session = self._session
        with session.lock:
            return session.lib.cupool_cached_bytes(session.check_open())

    # ---- requests ----

    def request(self, message: Mapping[str, Any], *, check: bool = True) -> Dict[str, Any]:
        """Sends one protocol request (docs/protocol.md; without "id") and returns the holder's reply.
        A reply with "ok": false raises its exception, unless `check` is False."""
        session = self._session
        out = ctypes.c_void_p()
        with session.lock:
            handle = session.check_open()
            session.check(session.lib.cupool_request(handle, json.dumps(dict(message)).encode(), ctypes.byref(out)))
        try:
            reply: Dict[str, Any] = json.loads(ctypes.string_at(out.value))
        finally:
            session.lib.cupool_free_string(out.value)
        if check and not reply.get("ok", False):
            raise error_for_reply(reply)
        return reply

    def status(self) -> Dict[str, Any]:
        """The holder's status: holder, pools, buffers, clients (docs/protocol.md, `status`)."""
        return self.request({"op": "status"})

    def stats(self, reset_peaks: bool = False) -> Dict[str, Any]:
        """Pool and graph memory figures (docs/protocol.md, `stats`); `reset_peaks` needs an admin."""
        return self.request({"op": "stats", "reset_peaks": reset_peaks})

    # ---- lifetime ----

    @property
    def closed(self) -> bool:
        """Whether close() was called."""
        return self._session.closed

    def close(self) -> None:
        """Closes the connection (see the class). A second call does nothing."""
        self._finalizer()

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<cupool.Connection {self.backend}{' closed' if self.closed else ''}>"


def connect(socket: Optional[PathLike] = None, name: Optional[str] = None) -> Connection:
    """Connects to the holder at `socket` (None: $CUPOOL_SOCKET, else /run/cupool/cupool.sock).
    `name` (at most 64 characters are kept) shows in `cupool status`. Raises Unreachable when no
    holder listens there, Refused when this user may not open the socket."""
    return Connection(socket, name)


def _c_string(what: str, value: Union[str, bytes]) -> bytes:
    """`value` as the C library takes it: UTF-8 without NUL. A NUL would end the string there, so
    "kv\\x00evil" would name the pool "kv"; it is refused instead."""
    if isinstance(value, str):
        value = value.encode()
    elif not isinstance(value, bytes):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if b"\0" in value:
        raise InvalidArgument(f"{what} may not hold a NUL character")
    return value


def _require_int(what: str, value: Any, minimum: int, maximum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if not minimum <= value <= maximum:
        raise InvalidArgument(f"{what} must be in {minimum}..{maximum}, not {value}")
