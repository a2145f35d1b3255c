"""A gfx950 code object as a launch needs it: the decoded `.text` and the kernel descriptor.

Kernel descriptor layout (AMDGPU code object v4+, one 64-byte `<kernel>.kd` record): the
group-segment (static LDS) size at byte 0, the private-segment (scratch) size at 4, the kernarg
size at 8, the entry's byte offset from the descriptor at 16 (i64), COMPUTE_PGM_RSRC3 / RSRC1 /
RSRC2 at 44 / 48 / 52 and the kernel-code properties (u16) at 56 (LLVM AMDGPUUsage,
"Kernel Descriptor"; LLVM's `llvm/Support/AMDHSAKernelDescriptor.h` offsets).
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass

from elftools.elf.elffile import ELFFile

from .decode import Program, decode
from .errors import EmulatorError

# COMPUTE_PGM_RSRC1 FLOAT_MODE (bits 12-19): round to nearest even for f32 and f16/f64, and all
# denormals kept (0xF0) is what our kernels and LLVM's default for gfx950 set; the emulator
# computes exactly that mode and refuses others.
FLOAT_MODE_KEEP_DENORMALS = 0xF0

# Kernel-code property bits (user SGPRs, in this order) and their SGPR counts.
USER_SGPRS = (("private_segment_buffer", 4), ("dispatch_ptr", 2), ("queue_ptr", 2), ("kernarg_segment_ptr", 2),
              ("dispatch_id", 2), ("flat_scratch_init", 2), ("private_segment_size", 1))


class CodeObjectError(EmulatorError):
    """A code object the emulator cannot launch (not gfx950 ELF, no kernel, unsupported mode)."""


@dataclass(frozen=True)
class KernelDescriptor:
    group_segment_size: int
    private_segment_size: int
    kernarg_size: int
    rsrc1: int
    rsrc2: int
    rsrc3: int
    properties: int

    @property
    def float_mode(self) -> int:
        return self.rsrc1 >> 12 & 0xFF

    @property
    def user_sgprs(self) -> tuple[str, ...]:
        """The user SGPRs the kernel asks for, in the order the hardware loads them."""
        return tuple(name for bit, (name, _) in enumerate(USER_SGPRS) if self.properties >> bit & 1)

    @property
    def user_sgpr_count(self) -> int:
        return self.rsrc2 >> 1 & 0x1F

    @property
    def workgroup_ids(self) -> tuple[bool, bool, bool]:
        return bool(self.rsrc2 >> 7 & 1), bool(self.rsrc2 >> 8 & 1), bool(self.rsrc2 >> 9 & 1)

    @property
    def vgprs(self) -> int:
        """Architected VGPRs a wave holds (RSRC1 GRANULATED_WORKITEM_VGPR_COUNT, granule 8 on gfx90a+)."""
        return 8 * ((self.rsrc1 & 0x3F) + 1)


class CodeObject:
    """One kernel of a gfx950 HSACO, decoded and ready to launch."""

    def __init__(self, hsaco: bytes, kernel: str | None = None) -> None:
        try:
            elf = ELFFile(io.BytesIO(hsaco))
            symbols = {s.name: s for s in elf.get_section_by_name(".symtab").iter_symbols()}
            text = elf.get_section_by_name(".text")
        except Exception as error:  # pyelftools raises several kinds on malformed input
            raise CodeObjectError(f"not a readable ELF code object: {error}") from error
        if text is None:
            raise CodeObjectError("the code object has no .text section")
        descriptors = sorted(name for name in symbols if name.endswith(".kd"))
        if kernel is None:
            if len(descriptors) != 1:
                raise CodeObjectError(f"{len(descriptors)} kernels in the code object ({descriptors}); name one")
            kernel = descriptors[0].removesuffix(".kd")
        if f"{kernel}.kd" not in symbols:
            raise CodeObjectError(f"no kernel {kernel!r} in the code object (it has {descriptors})")
        self.name = kernel
        kd_address = symbols[f"{kernel}.kd"]["st_value"]
        raw = self._read(elf, kd_address, 64)
        self.descriptor = KernelDescriptor(
            group_segment_size=struct.unpack_from("<I", raw, 0)[0],
            private_segment_size=struct.unpack_from("<I", raw, 4)[0],
            kernarg_size=struct.unpack_from("<I", raw, 8)[0],
            rsrc3=struct.unpack_from("<I", raw, 44)[0], rsrc1=struct.unpack_from("<I", raw, 48)[0],
            rsrc2=struct.unpack_from("<I", raw, 52)[0], properties=struct.unpack_from("<H", raw, 56)[0])
        if self.descriptor.float_mode != FLOAT_MODE_KEEP_DENORMALS:
            raise CodeObjectError(f"{kernel}: float mode {self.descriptor.float_mode:#x} is not emulated "
                                  f"(only {FLOAT_MODE_KEEP_DENORMALS:#x}: round to nearest even, denormals kept)")
        entry = kd_address + struct.unpack_from("<q", raw, 16)[0]
        self.program: Program = decode(text.data(), text["sh_addr"], entry)

    @staticmethod
    def _read(elf: ELFFile, address: int, size: int) -> bytes:
        for section in elf.iter_sections():
            start = section["sh_addr"]
            if section["sh_type"] != "SHT_NOBITS" and start <= address < start + section["sh_size"]:
                return section.data()[address - start:address - start + size]
        raise CodeObjectError(f"no section holds address {address:#x}")
