"""This process's CUDA devices as the driver (libcuda.so.1, through ctypes) numbers them here, with
CUDA_VISIBLE_DEVICES taken into account: their UUIDs, and the device this process uses now. The
driver is loaded on first use; where it can't be (no NVIDIA driver: a simulated node), nothing is
known and the callers fall back to what they did without it."""
from __future__ import annotations

import ctypes
import sys
import threading
from typing import Optional

_lock = threading.Lock()
_driver: Optional[ctypes.CDLL] = None
_tried = False


def _cuda() -> Optional[ctypes.CDLL]:
    """libcuda.so.1, initialised (cuInit creates no context); None where it can't be loaded or has
    no device."""
    global _driver, _tried
    with _lock:
        if not _tried:
            _tried = True
            try:
                lib = ctypes.CDLL("libcuda.so.1")
                lib.cuInit.argtypes = [ctypes.c_uint]
                lib.cuDeviceGetCount.argtypes = [ctypes.POINTER(ctypes.c_int)]
                lib.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
                lib.cuDeviceGetUuid.argtypes = [ctypes.c_char_p, ctypes.c_int]
                lib.cuCtxGetDevice.argtypes = [ctypes.POINTER(ctypes.c_int)]
                if lib.cuInit(0) == 0:
                    _driver = lib
            except (OSError, AttributeError):
                _driver = None
        return _driver


def count() -> int:
    """How many devices this process sees (0 without a driver)."""
    lib = _cuda()
    n = ctypes.c_int(0)
    return n.value if lib is not None and lib.cuDeviceGetCount(ctypes.byref(n)) == 0 else 0


def uuid_of(ordinal: int) -> Optional[str]:
    """The UUID ("GPU-8f3c1a2b-...", lower case) of this process's device `ordinal`; None when
    there is no such device or no driver."""
    lib = _cuda()
    if lib is None or not 0 <= ordinal < count():
        return None
    device = ctypes.c_int(0)
    raw = ctypes.create_string_buffer(16)
    if lib.cuDeviceGet(ctypes.byref(device), ordinal) != 0 or lib.cuDeviceGetUuid(raw, device.value) != 0:
        return None
    h = raw.raw.hex()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def ordinal_of(uuid: str) -> Optional[int]:
    """This process's ordinal of the device `uuid` (any case); None when it does not see it."""
    want = uuid.lower()
    for i in range(count()):
        if uuid_of(i) == want:
            return i
    return None


def current() -> Optional[int]:
    """The device this process uses now: its current context's, else the one PyTorch made current
    (torch.cuda.set_device), else 0, CUDA's default; None without a driver or a device."""
    lib = _cuda()
    if lib is None or count() == 0:
        return None
    device = ctypes.c_int(0)
    if lib.cuCtxGetDevice(ctypes.byref(device)) == 0:
        return device.value
    torch = sys.modules.get("torch")  # only where the application imported it
    try:
        if torch is not None and torch.cuda.is_initialized():
            return int(torch.cuda.current_device())
    except Exception:  # noqa: BLE001  (a torch without CUDA: CUDA's default then)
        pass
    return 0


def is_uuid(device: object) -> bool:
    """Whether `device` is given as a GPU UUID string ("GPU-...")."""
    return isinstance(device, str) and device[:4].upper() == "GPU-"
