"""Held tensor sets: the tensors of a buffer made with `cupool buffer load`, as framework tensors
that are views into the buffer (no copy)."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Dict, Optional

from .errors import FrameworkMissing, InvalidArgument

if TYPE_CHECKING:
    from .connection import Connection, PathLike

FRAMEWORKS = ("torch", "cupy", "numpy")

# safetensors dtype -> the attribute naming it in torch (some are newer than others).
_TORCH = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "I32": "int32", "U32": "uint32",
    "I64": "int64", "U64": "uint64", "F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
}
# ... and in numpy and cupy; the others (BF16, F8_*) come from ml_dtypes for numpy when it is there.
_NUMPY = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "I32": "int32", "U32": "uint32",
    "I64": "int64", "U64": "uint64", "F16": "float16", "F32": "float32", "F64": "float64",
}
_ML_DTYPES = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
# A dtype the framework lacks (numpy and cupy have no bfloat16) comes back as its raw bits, an
# unsigned integer of the same width, so the rest of the set is usable; a warning names them.
_RAW = {"BF16": "uint16", "F8_E4M3": "uint8", "F8_E5M2": "uint8"}


class RawDtypeWarning(UserWarning):
    """cupool.tensors gave tensors of a dtype the framework lacks as their raw bits (BF16 as uint16)."""


def tensors(name: str, framework: str = "torch", socket: Optional["PathLike"] = None,
            conn: Optional["Connection"] = None, device: Optional[int] = None, copy: bool = False,
            writable: bool = False) -> Dict[str, Any]:
    """The tensors of buffer `name` (loaded with `cupool buffer load`) as a dict of views into it.

    ``framework``: "torch" (torch.Tensor on the buffer's CUDA device), "cupy" (cupy.ndarray) or
    "numpy" (simulated nodes only: the buffer is host memory there). Nothing is copied: the
    tensors share the holder's memory with every other process that maps the buffer, so writing
    to one changes them all. numpy views are read-only unless ``writable=True``; torch and cupy
    have no read-only arrays, so treat their views as read-only. The buffer stays mapped while any
    returned tensor (or a view of one) is alive, and is unmapped when the last one goes; the
    holder keeps the memory for the next process either way. ``conn`` (default: a new connection
    to ``socket``, else $CUPOOL_SOCKET) is closed once the tensors are gone when this function
    made it.

    ``device``: this process's CUDA device to use the tensors on (default: the one that holds the
    set). A set held on another device is mapped there over peer access (NVLink or PCIe) when the
    pool's ``access`` lists that device: the views are on ``device``, the memory stays where it is
    held. ``copy=True`` returns private tensors instead: the set copied once into memory of
    ``device`` (a replica over NVLink), nothing shared with other processes (writable).

    The views stay valid when the holder restarts (held sets outlive it); the next call opens a
    new connection.

    ``device`` may also be a GPU UUID ("GPU-...").

    A tensor of a dtype the framework lacks (BF16 and the F8 types in numpy without ml_dtypes, and
    in cupy) comes back as its raw bits, of the unsigned integer type of its width (BF16 as uint16:
    ``(x.astype(numpy.uint32) << 16).view(numpy.float32)`` reads it as float32), with a
    RawDtypeWarning naming those tensors; the others are as usual.

    Raises FrameworkMissing (the framework can't be imported; raised before any buffer is opened),
    NotFound (no such buffer), Busy (it is still being loaded), Refused (this user may not open it),
    InvalidArgument (an unknown framework, or a buffer made without a tensor index).
    """
    if framework not in FRAMEWORKS:
        raise InvalidArgument(f"framework must be one of {', '.join(FRAMEWORKS)}, not {framework!r}"
                              + (f"; {_JAX}" if framework == "jax" else ""))
    if framework != "cupy":
        _require(framework)  # before connecting
    from .connection import connect

    own = conn is None
    if conn is None:
        conn = connect(socket, name=f"tensors {name}")
    try:
        if framework == "cupy":
            if conn.backend != "cuda":
                raise InvalidArgument("framework='cupy' needs a CUDA node; on a simulated node use 'numpy'")
            _require(framework)
        index = conn.tensor_index(name)
        if not index.get("indexed", False):
            raise InvalidArgument(
                f"buffer {name} has no tensor index: it was made without one (the config's buffers: or "
                f"buffer_create), so it has no tensors. A tensor set is made with `cupool buffer load {name} "
                f"FILE.safetensors --pool POOL`; open a plain buffer with conn.open_buffer({name!r})")
        out = {}
        raw: Dict[str, str] = {}  # tensor -> its dtype, given as raw bits
        # A set is held in parts (one allocation each); a tensor lies within one part.
        for part in [p["part"] for p in index.get("parts") or [{"part": 0}]]:
            entries = [t for t in index["tensors"] if t.get("part", 0) == part]
            if not entries:
                continue
            lease = conn.open_buffer(name, part, device)
            try:
                base = _base(lease, framework)
                if copy:
                    base = base.clone() if framework == "torch" else base.copy()  # on the lease's device
                    _wait_for_copy(base, framework)  # the lease is unmapped below: the copy must be done
                elif framework == "numpy" and not writable:
                    base.flags.writeable = False  # and so every view of it
                out.update({t["name"]: _view(base, t, framework, raw) for t in entries})
                del base  # the views hold the memory now
            finally:
                lease.release()  # unmapped once the last view of this part goes
    finally:
        if own:
            conn.close()  # stays open while a view holds a lease of it
    if raw:
        import warnings

        listed = ", ".join(f"{t} ({d} as {_RAW[d]})" for t, d in sorted(raw.items()))
        hint = "install ml_dtypes, or use framework='torch'" if framework == "numpy" else "use framework='torch'"
        warnings.warn(f"cupool.tensors({name!r}): {framework} has no dtype for {len(raw)} tensor"
                      f"{'' if len(raw) == 1 else 's'}, given as raw bits: {listed}; for the real dtype, {hint}",
                      RawDtypeWarning, stacklevel=2)
    return out


# What the message of each framework that is not installed suggests.
_INSTALL = {"torch": "PyTorch (pip install torch)", "cupy": "CuPy (pip install cupy-cuda12x)",
            "numpy": "numpy (pip install numpy, or Debian's python3-numpy)"}
_OTHERS = {
    "torch": "framework='cupy' (CUDA nodes) or framework='numpy' (simulated nodes)",
    "cupy": "framework='torch', or framework='numpy' (simulated nodes)",
    "numpy": "framework='torch' or framework='cupy' (CUDA nodes)",
}
_DLPACK = ("or, with no framework of these, conn.tensor_index(name) and conn.open_buffer(name, part): "
           "a lease is a DLPack tensor any consumer takes (docs/python.md, \"Tensors\")")
_JAX = ("for JAX, jax.dlpack.from_dlpack(conn.open_buffer(name, part)) maps a part as one uint8 array "
        "(conn.tensor_index(name) has the offsets; slicing a JAX array copies)")


def _require(framework: str) -> None:
    """Imports `framework` or raises FrameworkMissing saying what to install and what else works."""
    try:
        importlib.import_module(framework)
    except ImportError as e:
        raise FrameworkMissing(
            f"cupool.tensors(framework={framework!r}) needs {_INSTALL[framework]}, which this Python can't "
            f"import ({e}). Install it, or use {_OTHERS[framework]}; {_DLPACK}", name=framework) from e


def _base(lease: Any, framework: str) -> Any:
    """The whole buffer as one 1-D uint8 array or tensor, counted by the lease (DLPack)."""
    if framework == "torch":
        import torch

        return torch.from_dlpack(lease)
    if framework == "cupy":
        import cupy

        return cupy.from_dlpack(lease)
    return lease.numpy()


def _wait_for_copy(base: Any, framework: str) -> None:
    """Waits for the stream that made the copy `base` (nothing to wait for with numpy)."""
    if framework == "torch" and base.is_cuda:
        import torch

        torch.cuda.current_stream(base.device).synchronize()
    elif framework == "cupy":
        import cupy

        cupy.cuda.get_current_stream().synchronize()


def _view(base: Any, entry: Dict[str, Any], framework: str, raw: Dict[str, str]) -> Any:
    begin = entry["offset_bytes"]
    data = base[begin:begin + entry["size_bytes"]]
    shape = tuple(entry["shape"])
    dtype = _dtype(entry["dtype"], framework, entry["name"], raw)
    return data.view(dtype).reshape(shape)


def _dtype(name: str, framework: str, tensor: str, raw: Dict[str, str]) -> Any:
    """The framework's dtype for safetensors dtype `name`; one it lacks but _RAW has: the raw bits'
    (recorded in `raw`)."""
    if framework == "torch":
        import torch

        found = getattr(torch, _TORCH.get(name, ""), None)
        if found is None and name in _RAW:
            found = getattr(torch, _RAW[name], None) or torch.int16  # torch before 2.3 has no uint16
            raw[tensor] = name
        if found is None:
            raise InvalidArgument(f"tensor {tensor}: this torch has no dtype for {name}")
        return found
    if name in _NUMPY:
        import numpy

        return numpy.dtype(_NUMPY[name])
    if name in _ML_DTYPES:
        try:
            import ml_dtypes

            if framework == "numpy":
                return getattr(ml_dtypes, _ML_DTYPES[name])
        except ImportError:
            pass
    if name in _RAW:
        import numpy

        raw[tensor] = name
        return numpy.dtype(_RAW[name])
    raise InvalidArgument(f"tensor {tensor}: {framework} has no {name} dtype; use framework='torch'")
