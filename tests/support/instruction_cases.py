"""Known-answer cases of single operations, run as one assembled kernel a family (asm_kernels.py).

A `Case` is a few lines of gfx950 assembly around one operation that leave a dword a lane in v6,
and the answer the ISA's definition gives for that lane. `run_cases` puts a family's cases in one
kernel of one wave behind a prologue that loads five inputs a lane:

    v4 = x, v5 = y  random dwords        v7 = n  0..31 (shift counts, widths)
    v8 = f, v9 = g  random f32 in +-(0.25 .. 4) (bits in f_bits, g_bits)

s[4:5] points at the inputs (read-only: x, y, n, f bits, g bits, 64 dwords each, so dword k of
that table is `TABLE[k]`), s[24:25] at a zeroed writable buffer of MEMORY_BYTES, v1 = 4 x lane.
Each case's v6 is stored to its own row of the output. Cases may use v6, v10-v31, s8-s23 and VCC,
and must leave EXEC, s[4:7], s[24:25], v1 and the inputs as they found them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable

import numpy as np
from asm_kernels import assemble

LANES = 64
MEMORY_BYTES = 4096


@dataclass(frozen=True)
class Lane:
    """The inputs of one lane."""

    lane: int
    x: int
    y: int
    n: int
    f: float
    g: float

    @property
    def f_bits(self) -> int:
        return f32_bits(self.f)

    @property
    def g_bits(self) -> int:
        return f32_bits(self.g)


@dataclass(frozen=True)
class Case:
    """`op` (a name of ops.NAMES) computed by `asm` into v6; `want` is the ISA's dword for a lane."""

    op: str
    asm: str
    want: Callable[[Lane], int]


def f32_bits(value: float) -> int:
    return int(np.float32(value).view(np.uint32))


def f32(bits: int) -> float:
    return float(np.uint32(bits & 0xFFFFFFFF).view(np.float32))


def s32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >> 31 else value


PROLOGUE = """  s_load_dwordx4 s[4:7], s[0:1], 0x0
  s_load_dwordx2 s[24:25], s[0:1], 0x10
  v_lshlrev_b32 v1, 2, v0
  s_waitcnt lgkmcnt(0)
  global_load_dword v4, v1, s[4:5]
  global_load_dword v5, v1, s[4:5] offset:256
  global_load_dword v7, v1, s[4:5] offset:512
  global_load_dword v8, v1, s[4:5] offset:768
  global_load_dword v9, v1, s[4:5] offset:1024
  s_waitcnt vmcnt(0)
"""
STORE = """  global_store_dword v1, v6, s[6:7]
  s_add_u32 s6, s6, 0x100
  s_addc_u32 s7, s7, 0
"""


def lanes(seed: int) -> list[Lane]:
    """Seeded inputs; x and y include the edge values 0, 1, -1, 2^31 and 2^31 - 1 in lanes 0-4."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 1 << 32, LANES, dtype=np.uint64)
    y = rng.integers(0, 1 << 32, LANES, dtype=np.uint64)
    x[:5] = [0, 1, 0xFFFFFFFF, 0x80000000, 0x7FFFFFFF]
    y[:5] = [0x7FFFFFFF, 0xFFFFFFFF, 1, 0x80000000, 0]
    n = rng.integers(0, 32, LANES)
    magnitude = lambda: rng.uniform(0.25, 4.0, LANES) * rng.choice([-1.0, 1.0], LANES)  # noqa: E731
    f, g = np.float32(magnitude()), np.float32(magnitude())
    return [Lane(k, int(x[k]), int(y[k]), int(n[k]), float(f[k]), float(g[k])) for k in range(LANES)]


def table(inputs: list[Lane]) -> list[int]:
    """The input buffer's dwords: x, y, n, f bits and g bits of every lane, in that order."""
    return [getattr(lane, name) for name in ("x", "y", "n", "f_bits", "g_bits") for lane in inputs]


def kernel(cases: list[Case], lds: int = 0, scratch: int = 0) -> bytes:
    """The HSACO running `cases` one after another, each stored to its row of the output."""
    body = PROLOGUE + "".join(case.asm.rstrip("\n") + "\n" + STORE for case in cases) + "  s_endpgm\n"
    return assemble(body, lds=lds, scratch=scratch)


def run_cases(cases: list[Case], seed: int = 1, lds: int = 0, scratch: int = 0) -> list[str]:
    """Run the cases on one wave of the emulator; the list of wrong lanes (empty if all agree)."""
    import torch

    from mono_jit.emulator import CodeObject, Machine

    inputs = lanes(seed)
    source = torch.from_numpy(np.array(table(inputs), np.uint64).astype(np.uint32).view(np.int32))
    out = torch.zeros((len(cases), LANES), dtype=torch.int32)
    memory = torch.zeros(MEMORY_BYTES // 4, dtype=torch.int32)
    machine = Machine()
    machine.register(source, "inputs", writable=False)
    machine.register(out, "out")
    machine.register(memory, "memory")
    machine.launch(CodeObject(kernel(cases, lds, scratch)), (1, 1, 1), (LANES, 1, 1),
                   struct.pack("<QQQ", source.data_ptr(), out.data_ptr(), memory.data_ptr()))
    got = out.numpy().view(np.uint32)
    wrong = []
    for k, case in enumerate(cases):
        for lane in inputs:
            want = case.want(lane) & 0xFFFFFFFF
            if int(got[k, lane.lane]) != want:
                wrong.append(f"{case.op} lane {lane.lane} (x {lane.x:#x}, y {lane.y:#x}, n {lane.n}, f {lane.f!r}, "
                             f"g {lane.g!r}): {int(got[k, lane.lane]):#010x}, the ISA gives {want:#010x}")
                break
    return wrong


def decoded_operations(cases: list[Case], lds: int = 0, scratch: int = 0) -> set[str]:
    """The operations (ops.NAMES) the decoder finds in the family's kernel."""
    from mono_jit.emulator import CodeObject
    from mono_jit.emulator.ops import NAMES, op_id

    return {NAMES[op_id(name)] for name in CodeObject(kernel(cases, lds, scratch)).program.names}
