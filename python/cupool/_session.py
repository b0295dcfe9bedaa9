"""The state a Connection and its leases share: the C connection, a lock, and the leases not freed.

Kept apart from Connection and Lease so that finalizers can hold it without keeping those objects
alive. Every C call on the connection is made under `lock` (reentrant: a finalizer may run while
the same thread holds it), so close() never frees the C connection under another thread's call.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Optional, Set

from . import _lib
from .errors import InvalidArgument, error_for_status


class LeaseState:
    """What the session knows of one lease. `handle` is None once the lease is freed."""

    def __init__(self, handle: int) -> None:
        self.handle: Optional[int] = handle
        self.release_requested = False  # release() was called, or the connection closed
        self.shared = False             # an array interface was read: a consumer may hold the lease
        self.views = 0                  # exports counted exactly: DLPack tensors, lease.numpy() arrays

    def in_use(self) -> bool:
        """Whether an array or tensor made from the lease may still be alive."""
        return self.shared or self.views > 0


class Session:
    def __init__(self, lib: ctypes.CDLL, handle: int) -> None:
        self.lib = lib
        self.handle: Optional[int] = handle
        self.lock = threading.RLock()
        self.closed = False
        self.leases: Set[LeaseState] = set()

    def check_open(self) -> int:
        """The C connection's handle; raises InvalidArgument once close() was called. Hold `lock`."""
        if self.closed or self.handle is None:
            raise InvalidArgument("the connection is closed")
        return self.handle

    def check(self, status: int) -> None:
        """Raises the exception for a failed call's status, with the library's message. Hold `lock`."""
        if status != 0:
            raise error_for_status(status, _lib.text(self.lib.cupool_last_error(self.handle)))

    def free(self, state: LeaseState) -> None:
        """Releases the lease in the library (and the holder) unless it is freed already; the last
        lease of a closed connection disconnects it. Never raises: also called from finalizers."""
        with self.lock:
            handle, state.handle = state.handle, None
            if handle is None:
                return
            self.leases.discard(state)
            if self.handle is not None:
                # The library frees the lease here even when the holder can't be told.
                self.lib.cupool_release(self.handle, handle)
            self._disconnect_when_done()

    def close(self) -> None:
        """No new calls. Leases nothing was exported from are freed now; a lease an array or
        tensor may still use keeps the connection open until it is freed."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            states = list(self.leases)  # a finalizer may free one meanwhile (free() is idempotent)
            for state in states:
                state.release_requested = True
            if not any(state.in_use() for state in states):
                for state in states:
                    state.handle = None  # cupool_disconnect frees them
                self.leases.clear()
            elif self.handle is not None:
                # Open for a while yet: hold nothing more than the arrays use.
                self.lib.cupool_set_cache_limit(self.handle, 0)
                for state in states:
                    if not state.in_use():
                        self.free(state)
            self._disconnect_when_done()

    def _disconnect_when_done(self) -> None:
        if self.closed and not self.leases and self.handle is not None:
            handle, self.handle = self.handle, None
            self.lib.cupool_disconnect(handle)
