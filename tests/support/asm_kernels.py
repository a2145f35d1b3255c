"""Small gfx950 kernels written in assembly, assembled by LLVM (llvm-mc, ld.lld) into code
objects the emulator runs: known-answer checks of single instructions and of the machine (faults,
co-residency, deadlock reports) that need no FlyDSL and no kernel of ours."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

LLVM = Path("/usr/lib/llvm-22/bin")
TOOLS_PRESENT = (LLVM / "llvm-mc").exists() and (LLVM / "ld.lld").exists()

_TEMPLATE = """.amdgcn_target "amdgcn-amd-amdhsa--gfx950"
.text
.globl {name}
.p2align 8
.type {name},@function
{name}:
{body}
.rodata
.p2align 6
.amdhsa_kernel {name}
  .amdhsa_user_sgpr_kernarg_segment_ptr 1
  .amdhsa_system_sgpr_workgroup_id_x 1
  .amdhsa_next_free_vgpr {vgprs}
  .amdhsa_next_free_sgpr 32
  .amdhsa_accum_offset {vgprs}
  .amdhsa_group_segment_fixed_size {lds}
  .amdhsa_float_denorm_mode_32 {denorm32}
  .amdhsa_float_denorm_mode_16_64 3
  .amdhsa_enable_private_segment {private}
  .amdhsa_private_segment_fixed_size {scratch}
.end_amdhsa_kernel
"""


def assemble(body: str, *, name: str = "k", vgprs: int = 32, lds: int = 0, denorm32: int = 3, scratch: int = 0) -> bytes:
    """A HSACO holding one kernel whose code is `body` (kernarg pointer in s[0:1], workgroup id
    x in s2, work-item ids in v0). `denorm32` is the descriptor's f32 denormal mode (3: kept);
    `scratch` the bytes of private segment each work-item gets."""
    source = _TEMPLATE.format(name=name, body=body, vgprs=vgprs, lds=lds, denorm32=denorm32,
                              private=int(scratch > 0), scratch=scratch)
    with tempfile.TemporaryDirectory() as folder:
        asm, obj, hsaco = (Path(folder) / f"k.{ext}" for ext in ("s", "o", "hsaco"))
        asm.write_text(source)
        for command in ([str(LLVM / "llvm-mc"), "-triple", "amdgcn-amd-amdhsa", "-mcpu=gfx950", "-filetype=obj",
                         str(asm), "-o", str(obj)], [str(LLVM / "ld.lld"), "-shared", str(obj), "-o", str(hsaco)]):
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"{Path(command[0]).name} failed:\n{done.stderr}")
        return hsaco.read_bytes()
