"""An emulated MI355X (gfx950): the shipped code objects run on the CPU, through the runtime.

`CodeObject` decodes a HSACO with tinygrad's CDNA4 decoder; `Machine` holds emulated devices
whose memory is host memory (registered torch CPU tensors), runs launches with every workgroup
co-resident, and reports counters or raises `EmulatorFault` / `Deadlock`. What it proves and
what it does not: docs/emulator.md. Needs the `emulate` extra (tinygrad, numba).
"""

from .codeobj import CodeObject, CodeObjectError
from .decode import UnsupportedCode
from .machine import Deadlock, EmulatorFault, Launch, LaunchReport, Machine

__all__ = ["CodeObject", "CodeObjectError", "Deadlock", "EmulatorFault", "Launch", "LaunchReport", "Machine",
           "UnsupportedCode"]
