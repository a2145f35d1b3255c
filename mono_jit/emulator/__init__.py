"""An emulated MI355X (gfx950): the shipped code objects run on the CPU, through the runtime.

`CodeObject` decodes a HSACO with tinygrad's CDNA4 decoder; `Machine` holds emulated devices
whose memory is host memory (registered torch CPU tensors), runs launches with every workgroup
co-resident, and reports counters or raises `EmulatorFault` / `Deadlock`. What it proves and
what it does not: docs/emulator.md. Needs the `emulate` extra (tinygrad, numba); the hardware
tables alone (`mfma_layout`) need only numpy, so the package imports its machine lazily.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_HOMES = {"CodeObject": "codeobj", "CodeObjectError": "codeobj", "UnsupportedCode": "decode", "Deadlock": "machine",
          "EmulatorError": "errors", "EmulatorFault": "machine", "Launch": "machine", "LaunchReport": "machine",
          "Machine": "machine"}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{_HOMES[name]}", __name__), name)
