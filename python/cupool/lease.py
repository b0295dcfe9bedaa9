"""A lease: an allocation from a pool, or an opened named buffer, and what wraps it without a copy."""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Tuple

from . import dlpack
from ._session import LeaseState, Session
from .errors import InvalidArgument

if TYPE_CHECKING:
    from .connection import Connection


class Lease:
    """Memory served by the holder, mapped in this process.

    On a CUDA node the memory is device memory, ready on return of ``alloc`` / ``open_buffer``
    (the library waited for the holder's allocation), and the lease offers
    ``__cuda_array_interface__`` and DLPack (kDLCUDA): ``torch.as_tensor(lease, device="cuda")``,
    ``torch.from_dlpack(lease)``, ``cupy.asarray(lease)``, ``jax.dlpack.from_dlpack(lease)``.
    On a simulated node it is host memory: ``__array_interface__`` and DLPack (kDLCPU), so
    ``numpy.asarray(lease)`` and ``numpy.from_dlpack(lease)``. Either way the view is 1-D uint8
    of ``size`` bytes; reinterpret it in the framework (``.view(torch.float16)``).

    Lifetime: the memory stays mapped while any array or tensor made from the lease is alive.
    ``release()`` (or leaving a ``with`` block) frees it at once when nothing made from it is
    alive, and otherwise when the last of those goes. DLPack tensors and ``lease.numpy()`` arrays
    are counted. An array interface hands the consumer the lease object itself (numpy, torch and
    cupy keep a reference to it), which the lease can't count: once one was read, the lease is
    freed when the last reference to it goes, yours included. Once released, it exports nothing.
    """

    def __init__(self, conn: "Connection", session: Session, handle: int,
                 pool: Optional[str] = None, name: Optional[str] = None) -> None:
        lib = session.lib
        self._conn = conn  # a lease keeps its connection open
        self._session = session
        self._state = LeaseState(handle)
        #: The size in bytes.
        self.size: int = lib.cupool_lease_size(handle)
        #: The lease's id in the holder (as in `cupool status`).
        self.id: int = lib.cupool_lease_id(handle)
        #: The CUDA ordinal in this process of the device the memory is on.
        self.device: int = lib.cupool_lease_device(handle)
        #: The pool it was allocated from (None for a buffer).
        self.pool: Optional[str] = pool
        #: The buffer's name (None for an allocation).
        self.name: Optional[str] = name
        #: "cuda" or "simulated" (host memory).
        self.backend: str = conn.backend
        self._address: int = lib.cupool_lease_address(handle)
        session.leases.add(self._state)
        weakref.finalize(self, session.free, self._state).atexit = False

    # ---- the memory ----

    @property
    def address(self) -> int:
        """The address in this process: a CUdeviceptr on a CUDA node, a host address on a simulated
        one. Raises InvalidArgument once the lease is released or its connection closed."""
        with self._session.lock:
            state = self._state
            if state.release_requested or state.handle is None:
                raise InvalidArgument(f"{self._what()} was released"
                                      + (": its connection is closed" if self._session.closed else ""))
            return self._address

    @property
    def released(self) -> bool:
        """Whether release() was called or the connection closed (the memory may still be mapped
        for arrays made before)."""
        return self._state.release_requested or self._state.handle is None

    def release(self) -> None:
        """Frees the lease now if nothing made from it is alive; otherwise when the last array or
        tensor made from it goes (see the class). A second call does nothing, also after the
        connection closed."""
        with self._session.lock:
            state = self._state
            state.release_requested = True
            if not state.in_use():
                self._session.free(state)

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # ---- array interfaces (the consumer keeps a reference to the lease) ----

    def _interface(self, backend: str, protocol: str) -> Dict[str, Any]:
        if self.backend != backend:
            raise AttributeError(f"{protocol}: the lease is {self.backend} memory")
        with self._session.lock:
            address = self.address
            self._state.shared = True
        return {"version": 3, "shape": (self.size,), "typestr": "|u1", "data": (address, False), "strides": None}

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        """CUDA Array Interface v3 (CUDA nodes). `stream` is None: the memory is ready."""
        return dict(self._interface("cuda", "__cuda_array_interface__"), stream=None)

    @property
    def __array_interface__(self) -> Dict[str, Any]:
        """NumPy array interface v3 (simulated nodes: the memory is host memory)."""
        return self._interface("simulated", "__array_interface__")

    # ---- DLPack ----

    def __dlpack_device__(self) -> Tuple[int, int]:
        """(kDLCUDA, device) on a CUDA node, (kDLCPU, 0) on a simulated node."""
        return (dlpack.KDL_CUDA, self.device) if self.backend == "cuda" else (dlpack.KDL_CPU, 0)

    def __dlpack__(self, *, stream: Any = None, max_version: Optional[Tuple[int, int]] = None,
                   dl_device: Optional[Tuple[int, int]] = None, copy: Optional[bool] = None) -> object:
        """A "dltensor" capsule (an unversioned DLManagedTensor, which every consumer accepts).
        `stream` needs no synchronisation (the memory is ready); a copy or another device is refused."""
        device = self.__dlpack_device__()
        if copy:
            raise BufferError("a lease is exported without a copy; copy in the consumer")
        if dl_device is not None and tuple(dl_device) != device:
            raise BufferError(f"the lease is on DLPack device {device}, not {tuple(dl_device)}")
        address = self._add_view()
        try:
            return dlpack.export(address, self.size, device, self._view_gone)
        except BaseException:
            self._view_gone()
            raise

    def _add_view(self) -> int:
        """Counts an export whose end the lease will be told of (_view_gone); returns the address."""
        with self._session.lock:
            address = self.address
            self._state.views += 1
            return address

    def _view_gone(self) -> None:
        with self._session.lock:
            state = self._state
            state.views -= 1
            if state.release_requested and not state.in_use():
                self._session.free(state)

    # ---- conveniences ----

    def numpy(self, dtype: Any = "uint8") -> Any:
        """A numpy array over the lease (simulated nodes, host memory), viewed as `dtype`. Unlike
        numpy.asarray(lease), the lease counts these arrays: release() frees it once they are gone,
        even while the lease object itself is still referenced."""
        if self.backend != "simulated":
            raise InvalidArgument("lease.numpy() needs host memory (a simulated node); on a CUDA node "
                                  "use torch.as_tensor(lease, device='cuda') or cupy.asarray(lease)")
        import numpy

        address = self._add_view()
        try:
            base = _HostView(address, self.size, self._view_gone)
        except BaseException:
            self._view_gone()
            raise
        return numpy.asarray(base).view(dtype)

    def _what(self) -> str:
        return f"buffer {self.name}" if self.name is not None else f"lease {self.id} of pool {self.pool}"

    def __repr__(self) -> str:
        state = "released" if self.released else f"address=0x{self._address:x}"
        return f"<cupool.Lease {self._what()} size={self.size} device={self.device} {self.backend} {state}>"


class _HostView:
    """The base of the arrays lease.numpy() makes: numpy keeps it while any of them (or a view of
    them) is alive, and its finalizer tells the lease when the last one goes."""

    def __init__(self, address: int, size: int, gone: Callable[[], None]) -> None:
        self.__array_interface__ = {"version": 3, "shape": (size,), "typestr": "|u1", "data": (address, False),
                                    "strides": None}
        weakref.finalize(self, gone)
