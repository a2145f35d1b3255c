"""Reading AMDGPU code objects: the kernel metadata note (the header check is hsaco/elf_header.py).

The metadata is the msgpack ``NT_AMDGPU_METADATA`` note (LLVM's AMDGPUUsage, "Code Object Metadata";
FlyDSL's artifact carries it unchanged):
symbol, kernarg layout, register counts, LDS, scratch, spills and wave size per kernel.
"""

from __future__ import annotations

import io

from .elf_header import check_header
from ..errors import InvalidCodeObject
from .kernel_info import KernelArg, KernelInfo

NT_AMDGPU_METADATA = 32


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
