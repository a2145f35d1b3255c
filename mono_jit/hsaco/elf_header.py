"""The ELF header check every cache load runs: is this an AMDGPU code object v6 for the arch?

Kept apart from hsaco/metadata.py (the kernel metadata note and its records) so that a cache hit imports
only this: three fixed-offset fields read with struct, no ELF parser, no records to define.
"""

from __future__ import annotations

import struct

from ..errors import InvalidCodeObject

EM_AMDGPU = 224
EF_AMDGPU_MACH_MASK = 0xFF
MACH_BY_ARCH = {"gfx942": 0x4C, "gfx950": 0x4F}
CODE_OBJECT_V6_ABI = 4  # EI_ABIVERSION for code object v6 (FlyDSL emits abi=600)

# Fixed offsets of the ELF64 little-endian header fields the load check needs. Reading three
# fields with struct keeps pyelftools (about 20 ms to import) off the load path; the metadata
# note, which needs real ELF parsing, goes through pyelftools (hsaco/metadata.py).
_ELF64_LSB = b"\x7fELF\x02\x01"
_EI_ABIVERSION = 8
_E_MACHINE = struct.Struct("<H")  # at 18
_E_FLAGS = struct.Struct("<I")  # at 48


def check_header(data: bytes, arch: str) -> None:
    """Raise unless `data` is an ELF code object v6 for the AMDGPU `arch`."""
    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise InvalidCodeObject(f"not an ELF file ({len(data)} bytes)")
    if data[:6] != _ELF64_LSB:
        raise InvalidCodeObject("not a 64-bit little-endian ELF file")
    (machine,) = _E_MACHINE.unpack_from(data, 18)
    if machine != EM_AMDGPU:
        raise InvalidCodeObject(f"e_machine {machine}: expected AMDGPU ({EM_AMDGPU})")
    (flags,) = _E_FLAGS.unpack_from(data, 48)
    mach = flags & EF_AMDGPU_MACH_MASK
    if mach != MACH_BY_ARCH[arch]:
        raise InvalidCodeObject(f"e_flags {flags:#x}: machine {mach:#x} is not {arch} ({MACH_BY_ARCH[arch]:#x})")
    abi = data[_EI_ABIVERSION]
    if abi != CODE_OBJECT_V6_ABI:
        raise InvalidCodeObject(f"EI_ABIVERSION {abi}: expected {CODE_OBJECT_V6_ABI} (code object v6)")
