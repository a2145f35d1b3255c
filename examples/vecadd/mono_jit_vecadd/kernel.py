"""FlyDSL source of `vecadd` (the package docstring is the contract).

(No `from __future__ import annotations`: @flyc.kernel reads real annotations.)

One CTA per row of the bucket; each thread adds CHUNKS 128-bit chunks (4 f32) of its row,
strided by the block so a wave's accesses are contiguous. Buffers are read through buffer
resources sized by each tensor's length argument, so an access past the end reads 0 and a
store there is dropped.
"""

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch
from flydsl.expr import range_constexpr

from mono_jit.spec import Spec
from mono_jit.templates import Build

from . import BLOCK, WIDTH

VEC = 4  # f32 per 128-bit access
CHUNKS = WIDTH // (VEC * BLOCK)  # chunks per thread and row


def _chunks(tensor):
    """The flat buffer as chunks of VEC elements, bounded by its length."""
    return fx.logical_divide(fx.rocdl.make_buffer_tensor(tensor, max_size=False), fx.make_layout(VEC, 1))


def _atom():
    return fx.make_copy_atom(fx.rocdl.BufferCopy(32 * VEC), 32)


def _load(chunks, index):
    reg = fx.make_rmem_tensor(VEC, fx.Float32)
    fx.copy(_atom(), fx.slice(chunks, (None, index)), reg)
    return fx.memref_load_vec(reg)


def _store(chunks, index, value) -> None:
    reg = fx.make_rmem_tensor(VEC, fx.Float32)
    fx.memref_store_vec(value, reg)
    fx.copy(_atom(), reg, fx.slice(chunks, (None, index)))


@flyc.kernel
def vecadd_kernel(A: fx.Tensor, B: fx.Tensor, Out: fx.Tensor, m: fx.Int32):
    row = fx.block_idx.x
    tid = fx.thread_idx.x
    if row < m:
        a, b, out = _chunks(A), _chunks(B), _chunks(Out)
        for j in range_constexpr(CHUNKS):
            index = row * (WIDTH // VEC) + j * BLOCK + tid
            _store(out, index, _load(a, index) + _load(b, index))


def build(spec: Spec) -> Build:
    """The launcher for one bucket and CPU placeholders to compile it with (nothing launches)."""
    rows = spec.max_tokens  # a Python int: the launch shape is a constant of the spec

    @flyc.jit
    def launch_vecadd(A: fx.Tensor, B: fx.Tensor, Out: fx.Tensor, m: fx.Int32, stream: fx.Stream = fx.Stream(None)):
        vecadd_kernel(A, B, Out, m).launch(grid=(rows, 1, 1), block=(BLOCK, 1, 1), stream=stream)

    placeholders = tuple(torch.empty(rows * WIDTH, dtype=torch.float32) for _ in range(3)) + (rows,)
    return Build(launch_vecadd, placeholders)
