"""FlyDSL micro-kernels of the memory model: buffer loads and stores past a resource's
num_records, global atomics from many lanes and workgroups, one workgroup waiting on a flag
another publishes (templates/sync_device.py's publish / wait), and a kernel that reads past its
tensor through a plain global pointer (a stride bug the emulator must catch).

(No `from __future__ import annotations`: FlyDSL reads the kernels' real annotations.)
"""

import flydsl.expr as fx

from mono_jit.templates._dsl import flat_view, load, load_global, load_scalar, store, store_scalar
from mono_jit.templates.base import LaunchShape
from mono_jit.templates.geometry import WAVE
from mono_jit.templates.sync_device import publish, step_tag, wait
from mono_jit.templates.sync_words import FIRST_FLAG

from .catalogue import MicroKernel, tensors

ATOMIC_GRID, ATOMIC_BLOCK, COUNTERS = 8, 256, 4
SMALL_BASE = 1000  # buffer_bounds stores lane + SMALL_BASE


def buffer_bounds_kernel(X: fx.Tensor, Scalars: fx.Tensor, Chunks: fx.Tensor, Small: fx.Tensor):
    lane = fx.thread_idx.x
    store_scalar(flat_view(Scalars), lane, load_scalar(flat_view(X), lane, fx.Float32), fx.Float32)
    store(flat_view(Chunks, 4), lane, load(flat_view(X, 4), lane, fx.Float32, 4), fx.Float32, 4)
    store_scalar(flat_view(Small), lane, lane + SMALL_BASE, fx.Int32)


def atomics_kernel(Counters: fx.Tensor, Old: fx.Tensor):
    tid = fx.thread_idx.x
    before = fx.atomic_add(fx.get_iter(Counters) + tid % COUNTERS, fx.Int32(1), syncscope="agent")
    store_scalar(flat_view(Old), fx.block_idx.x * ATOMIC_BLOCK + tid, before, fx.Int32)


def flag_kernel(Sync: fx.Tensor, Data: fx.Tensor, Out: fx.Tensor):
    tid = fx.thread_idx.x
    tag = step_tag(Sync)
    if fx.block_idx.x == 1:
        store_scalar(flat_view(Data), tid, tid * 7 + tag, fx.Int32)
        publish(Sync, FIRST_FLAG, tag, tid)
    else:
        wait(Sync, FIRST_FLAG, 1, tag, tid)
        store_scalar(flat_view(Out), tid, load_scalar(flat_view(Data), tid, fx.Int32), fx.Int32)


def misaddressed_kernel(X: fx.Tensor, Out: fx.Tensor):
    lane = fx.thread_idx.x
    store_scalar(flat_view(Out), lane, load_global(X, lane * 2), fx.Float32)  # stride 2 over 64 elements


KERNELS = (
    MicroKernel("buffer_bounds", tensors("x:float32", "scalars:float32", "chunks:float32", "small:int32"),
                buffer_bounds_kernel),
    MicroKernel("atomics", tensors("counters:int32", "old:int32"), atomics_kernel,
                LaunchShape((ATOMIC_GRID, 1, 1), (ATOMIC_BLOCK, 1, 1))),
    MicroKernel("flag", tensors("sync:int32", "data:int32", "out:int32"), flag_kernel,
                LaunchShape((2, 1, 1), (WAVE, 1, 1))),
    MicroKernel("misaddressed", tensors("x:float32", "out:float32"), misaddressed_kernel),
)
