"""DLPack export of a byte range (https://dmlc.github.io/dlpack/latest/), built with ctypes.

A capsule named "dltensor" wraps a DLManagedTensor: a 1-D tensor of `size` uint8 at `address`.
The tensor's manager_ctx is a key into _LIVE, which keeps the export's structures and its
`on_delete` callback (and through it the lease) alive until the deleter runs: the consumer calls it
when its tensor goes, or the capsule's destructor does when no consumer took the capsule.
"""
from __future__ import annotations

import ctypes
import itertools
from typing import Callable, Dict, Tuple

KDL_CPU = 1
KDL_CUDA = 2
_KDL_UINT = 1

_NAME = b"dltensor"  # the name of a capsule not consumed yet (module-lifetime storage)


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]

# key -> (the tensor, its shape, on_delete): alive until the deleter runs.
_LIVE: Dict[int, Tuple[DLManagedTensor, ctypes.Array, Callable[[], None]]] = {}
_KEYS = itertools.count(1)


@_Deleter
def _delete(managed: "ctypes._Pointer[DLManagedTensor]") -> None:
    entry = _LIVE.pop(managed.contents.manager_ctx or 0, None)
    if entry is not None:
        entry[2]()


_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CapsuleDestructor]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]


@_CapsuleDestructor
def _destroy_capsule(capsule: int) -> None:
    # A consumer renames the capsule "used_dltensor" and calls the deleter itself later; a capsule
    # still named "dltensor" was never consumed, so its tensor is deleted here.
    if _api.PyCapsule_IsValid(capsule, _NAME):
        managed = ctypes.cast(_api.PyCapsule_GetPointer(capsule, _NAME), ctypes.POINTER(DLManagedTensor))
        _delete(managed)


def export(address: int, size: int, device: Tuple[int, int], on_delete: Callable[[], None]) -> object:
    """A "dltensor" capsule for `size` bytes at `address` on `device` (device type, id).
    `on_delete` runs once, when the consumer (or the unconsumed capsule) lets go of the memory."""
    key = next(_KEYS)
    shape = (ctypes.c_int64 * 1)(size)
    managed = DLManagedTensor()
    managed.dl_tensor.data = address
    managed.dl_tensor.device = DLDevice(*device)
    managed.dl_tensor.ndim = 1
    managed.dl_tensor.dtype = DLDataType(_KDL_UINT, 8, 1)
    managed.dl_tensor.shape = shape
    managed.dl_tensor.strides = None  # compact, row-major
    managed.dl_tensor.byte_offset = 0
    managed.manager_ctx = key
    managed.deleter = _delete
    _LIVE[key] = (managed, shape, on_delete)
    try:
        return _api.PyCapsule_New(ctypes.addressof(managed), _NAME, _destroy_capsule)
    except BaseException:
        del _LIVE[key]
        raise


def live_exports() -> int:
    """How many exports have not been deleted yet (for tests)."""
    return len(_LIVE)
