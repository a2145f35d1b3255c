"""Failure paths keep serving: the whole layer's runner (K1 and K2) on 8 gloo ranks, one of them
faulty, declines on every rank with the same reason naming that rank, one warning line a rank,
then sends every step down vLLM's path without running anything; nothing hangs, nothing raises.

Faults: a kernel missing from an empty cache in offline mode; a rank whose kernels cannot load
(a corrupt code object as HIP reports it); a full /dev/shm when the peer buffers are made; a
deployment the kernels cannot run (an HCA width no K2 build takes)."""

from __future__ import annotations

import errno
import logging

import pytest
from hook_inputs import Dims, hook_step, layer_weights, random_weights
from test_agree import _run_ranks

from mono_jit.runtime.backends import ReferenceBackend

FAULTY = 5


class _CacheBackend(ReferenceBackend):
    """The reference backend resolving every build from the cache first, as HIP's does."""

    needs_cache = True


class _CorruptBackend(ReferenceBackend):
    def load(self, template, spec, meta, hsaco):
        raise RuntimeError("hipModuleLoadData failed: HIP error 200 (invalid kernel image): a corrupt code object")


def _faulty_runner(rank, world, group, fault, tmp):
    from mono_jit.config import Settings
    from mono_jit.runtime import host_memory
    from mono_jit.runtime.runner import MonoRunner

    backend, settings, width = ReferenceBackend(), None, 8192
    if rank == FAULTY and fault == "offline miss":
        backend = _CacheBackend()
        settings = Settings({"MONO_JIT_OFFLINE": "1", "MONO_JIT_CACHE_DIR": f"{tmp}/cache{rank}"})
    if rank == FAULTY and fault == "corrupt":
        backend = _CorruptBackend()
    if rank == FAULTY and fault == "full shm":
        def full(self, size):
            raise OSError(errno.ENOSPC, "No space left on device", "/dev/shm")
        host_memory.HostSharedMemory.malloc_uncached = full
    if fault == "unsupported width":
        width = 8000  # max_model_len 1,024,000: roundup(8000, 128) is what vLLM would pass, not 8000
    seen: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = seen.append
    logging.getLogger("mono_jit.runtime").addHandler(handler)
    runner = MonoRunner(8, rank, group, "cpu", width, backend=backend, settings=settings)
    w = layer_weights(random_weights(row_pad=256, positions=64))
    w.attn.check(Dims())
    w.check(Dims())
    step = hook_step(w, 2, False)
    out = runner.forward(*step.args, **step.kwargs)
    warnings = [r.getMessage() for r in seen if r.levelno >= logging.WARNING]
    return runner.declined, out[:4], step.selected, warnings, bool(runner.kernels)


@pytest.mark.slow
@pytest.mark.parametrize("fault, reason", [
    ("offline miss", f"rank {FAULTY}: "),
    ("corrupt", f"rank {FAULTY}: RuntimeError: hipModuleLoadData failed: HIP error 200 (invalid kernel image)"),
    ("full shm", f"rank {FAULTY}: peer memory: [Errno 28] No space left on device"),
    ("unsupported width", "rank 0: SpecError: topk_width=8000"),
])
def test_one_faulty_rank_sends_every_rank_down_vllms_path(fault, reason, tmp_path):
    results = _run_ranks(_faulty_runner, 8, fault, str(tmp_path))
    assert all(not isinstance(r, str) for r in results), results  # no rank raised
    declined = {r[0] for r in results}
    assert len(declined) == 1, declined
    (why,) = declined
    assert why is not None and why.startswith(reason), why
    for _, out, selected, warnings, has_kernels in results:
        assert out is None and selected == [] and not has_kernels
        assert warnings == [f"mono-jit: every rank keeps vLLM's original path ({why})"]
