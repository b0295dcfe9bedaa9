#!/usr/bin/env python3
"""Initialises the CUDA driver out of `cupool exec`'s sight: it takes the C library's own dlsym
(dlvsym on a libc handle) and through it libcuda's cuInit, then calls it. Under `cupool exec`
(--at cuinit) nothing is applied to it, and the preload library must say so at exit."""
import ctypes

libc = ctypes.CDLL("libc.so.6")
libc.dlvsym.restype = ctypes.c_void_p
libc.dlvsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
libc_dlsym = libc.dlvsym(libc._handle, b"dlsym", b"GLIBC_2.34") or libc.dlvsym(libc._handle, b"dlsym", b"GLIBC_2.2.5")
dlsym = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(libc_dlsym)
cuda = ctypes.CDLL("libcuda.so.1")
cu_init = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint)(dlsym(cuda._handle, b"cuInit"))
print("cuInit called out of sight:", cu_init(0))
