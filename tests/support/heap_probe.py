"""Compile-worker targets that report a process's state: where the C heap hands out memory."""

from __future__ import annotations

import ctypes

_libc = ctypes.CDLL(None)
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]


def address_after_leak(leak: int) -> int:
    """Keep `leak` bytes of C heap for good (a job that leaves the heap changed, as a compile
    does), then return where the next 64-byte block lands: equal in two jobs only when both
    started from the same heap at the same addresses."""
    _libc.malloc(leak)
    return int(_libc.malloc(64))
