"""Reading AMDGPU code objects: the ELF header check and the kernel metadata note.

The metadata is the msgpack ``NT_AMDGPU_METADATA`` note (LLVM's AMDGPUUsage, "Code Object Metadata";
FlyDSL's artifact carries it unchanged):
symbol, kernarg layout, register counts, LDS, scratch, spills and wave size per kernel.
"""

from __future__ import annotations

import io
import struct
from dataclasses import asdict, dataclass, field

from .errors import InvalidCodeObject

EM_AMDGPU = 224
EF_AMDGPU_MACH_MASK = 0xFF
MACH_BY_ARCH = {"gfx942": 0x4C, "gfx950": 0x4F}
CODE_OBJECT_V6_ABI = 4  # EI_ABIVERSION for code object v6 (FlyDSL emits abi=600)
NT_AMDGPU_METADATA = 32


@dataclass(frozen=True)
class KernelArg:
    offset: int
    size: int
    value_kind: str


@dataclass(frozen=True)
class KernelInfo:
    """One kernel's resource use and launch ABI, as the code object states it."""

    name: str
    symbol: str
    args: tuple[KernelArg, ...]
    kernarg_size: int
    vgpr: int
    agpr: int
    sgpr: int
    lds: int
    scratch: int
    vgpr_spills: int
    sgpr_spills: int
    wavefront_size: int
    max_workgroup_size: int
    reqd_workgroup_size: tuple[int, ...] = field(default=())

    def as_dict(self) -> dict:
        return asdict(self)


def _kernel_info(raw: dict) -> KernelInfo:
    return KernelInfo(
        name=raw[".name"],
        symbol=raw[".symbol"],
        args=tuple(KernelArg(a[".offset"], a[".size"], a[".value_kind"]) for a in raw.get(".args", [])),
        kernarg_size=raw[".kernarg_segment_size"],
        vgpr=raw[".vgpr_count"],
        agpr=raw.get(".agpr_count", 0),
        sgpr=raw[".sgpr_count"],
        lds=raw[".group_segment_fixed_size"],
        scratch=raw[".private_segment_fixed_size"],
        vgpr_spills=raw.get(".vgpr_spill_count", 0),
        sgpr_spills=raw.get(".sgpr_spill_count", 0),
        wavefront_size=raw[".wavefront_size"],
        max_workgroup_size=raw[".max_flat_workgroup_size"],
        reqd_workgroup_size=tuple(raw.get(".reqd_workgroup_size", ())),
    )


# Fixed offsets of the ELF64 little-endian header fields the load check needs. Every cache load
# runs this check; reading three fields with struct keeps pyelftools (about 20 ms to import) off
# that path. The metadata note, which needs real ELF parsing, still goes through pyelftools.
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


def read_metadata(data: bytes) -> tuple[str, list[KernelInfo]]:
    """(amdhsa.target, kernels) from the code object's AMDGPU metadata note."""
    import msgpack
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        elf = ELFFile(io.BytesIO(data))
        for section in elf.iter_sections():
            if section.header.sh_type != "SHT_NOTE":
                continue
            for note in section.iter_notes():
                if note["n_name"] == "AMDGPU" and note["n_type"] == NT_AMDGPU_METADATA:
                    desc = note["n_desc"]
                    blob = desc.encode("latin-1") if isinstance(desc, str) else bytes(desc)
                    meta = msgpack.unpackb(blob, raw=False)
                    return meta["amdhsa.target"], [_kernel_info(k) for k in meta["amdhsa.kernels"]]
    except (ELFError, KeyError, ValueError, msgpack.UnpackException) as exc:
        raise InvalidCodeObject(f"unreadable AMDGPU metadata note: {exc}") from None
    raise InvalidCodeObject("no AMDGPU metadata note (NT_AMDGPU_METADATA) in the code object")


def inspect_code_object(data: bytes, arch: str) -> list[KernelInfo]:
    """Check the header and the note's target, and return the kernels."""
    check_header(data, arch)
    target, kernels = read_metadata(data)
    if not target.endswith(f"-{arch}") and f"-{arch}:" not in target:
        raise InvalidCodeObject(f"amdhsa.target {target!r} is not {arch}")
    if not kernels:
        raise InvalidCodeObject("the code object defines no kernel")
    return kernels
