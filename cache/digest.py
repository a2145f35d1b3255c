"""sha256 for the cache-hit path without importing hashlib unless something already did.

``import hashlib`` loads OpenSSL's libcrypto (about 3 ms in a fresh process, more than a whole
kernel load); CPython's own sha256 module loads in about 0.3 ms and hashes a deployment grid's
code objects (under 1 MB) in about 1 ms. Once anything in the process has imported hashlib (torch
does), its faster OpenSSL sha256 is used instead. Both compute the same digest.
"""

from __future__ import annotations

import sys
from typing import Any


def _builtin() -> Any:
    try:
        from _sha2 import sha256  # CPython >= 3.12
    except ImportError:
        try:
            from _sha256 import sha256  # CPython <= 3.11
        except ImportError:  # not CPython, or built without it
            from hashlib import sha256
    return sha256


_BUILTIN = None


def sha256(data: bytes = b"") -> Any:
    """A sha256 hash object (``.update``, ``.digest``, ``.hexdigest``) over `data`."""
    global _BUILTIN
    hashlib = sys.modules.get("hashlib")
    if hashlib is not None:
        return hashlib.sha256(data)
    if _BUILTIN is None:
        _BUILTIN = _builtin()
    return _BUILTIN(data)
