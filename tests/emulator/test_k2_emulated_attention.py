"""K2's stages 1-3 (key table, split sparse MQA with sink, merge, inverse RoPE, MXFP8) as a
standalone launch on the emulated gfx950, against the reference, for both ratios: the test
world's records carry UE8M0 codes 127..129, so a code read sign-extended
flips the sign of its 64 dims and fails the comparison. tests/gpu/test_gpu_k2.py runs the same
check on a gfx950. The same stages also run with both caches past 4 GiB (a sparse file), the
records at byte offsets past 2^32. Skipped without the emulate extra."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from k2_harness import K2Run
from k2_inputs import COMP_BLOCK, SWA_BLOCK, TP, World, full_weights, shard, world
from sparse_memory import GiB, sparse_bytes

from mono_jit.spec import Spec
from mono_jit.templates.k2 import attention_reference as ref

pytest.importorskip("numba", reason="the emulator needs the emulate extra (numba, tinygrad)")
pytest.importorskip("tinygrad", reason="the emulator needs the emulate extra (numba, tinygrad)")

from k2_emulation import stage_launchers  # noqa: E402

BUCKET, RANK = 4, 3
# the world's pages moved this many pages up, past 4 GiB (and page x stride past 2^31 by far)
SWA_SHIFT, COMP_SHIFT = 120_000, 480_000


@pytest.fixture(scope="module")
def weights():
    return shard(full_weights(), RANK)


@pytest.fixture(scope="module")
def launchers():
    """ratio -> the S1-S3 launch, compiled once for the module."""
    compiled = {}

    def launcher(ratio: int, width: int):
        if ratio not in compiled:
            (compiled[ratio],) = stage_launchers(Spec(8, ratio, width, BUCKET), [frozenset({1, 2, 3})])
        return compiled[ratio]
    return launcher


def far_cache(cache: ref.PagedCache, shift: int, path) -> ref.PagedCache:
    """`cache`'s pages moved up `shift` pages in a cache mapped from a sparse file."""
    at = shift * cache.page_stride
    data = sparse_bytes(path, at + cache.data.numel())
    data[at:] = cache.data
    return ref.PagedCache(data, cache.page_stride, cache.block)


def far_world(ratio: int, directory) -> World:
    """world(ratio) with both caches past 4 GiB: every page moved up SWA_SHIFT / COMP_SHIFT pages,
    the SWA slots, the CSA block table's pages and the HCA global slots with them."""
    x = world(ratio).inputs
    swa = far_cache(x.swa_cache, SWA_SHIFT, directory / "swa")
    comp = far_cache(x.comp_cache, COMP_SHIFT, directory / "comp")
    assert SWA_SHIFT * swa.page_stride > 4 * GiB and COMP_SHIFT * comp.page_stride > 4 * GiB

    def moved(slots: torch.Tensor, by: int) -> torch.Tensor:
        return torch.where(slots >= 0, slots + by, slots)
    far = dataclasses.replace(x, swa_cache=swa, comp_cache=comp, swa_indices=moved(x.swa_indices, SWA_SHIFT * SWA_BLOCK))
    if ratio == 4:
        far = dataclasses.replace(far, block_table=x.block_table + COMP_SHIFT)
    else:
        far = dataclasses.replace(far, topk=moved(x.topk, COMP_SHIFT * COMP_BLOCK))
    return World(far, [], {})


@pytest.mark.parametrize("ratio", [4, 128])
def test_key_table_and_attention_on_the_emulator_match_the_reference(ratio, weights, launchers):
    run = K2Run(world(ratio), weights, RANK, BUCKET, "cpu")
    _check_attention(run, launchers(ratio, run.lay.topk_width))


@pytest.mark.parametrize("ratio", [4, 128])
def test_attention_reads_records_past_4_gib_of_caches_larger_than_4_gib(ratio, weights, launchers, tmp_path):
    """Records at byte offsets past 2^32 (pages past 2^31 / stride) of > 4 GiB caches: the keys'
    page x stride in i64 and 64-bit global loads (a buffer resource's i32 extent and offsets
    refused such a cache at packing, and its i32 page x stride wrapped)."""
    run = K2Run(far_world(ratio, tmp_path), weights, RANK, BUCKET, "cpu")
    assert run.step["swa_cache"].numel() > 4 * GiB and run.step["comp_cache"].numel() > 4 * GiB
    _check_attention(run, launchers(ratio, run.lay.topk_width))


def _check_attention(run: K2Run, launch) -> None:
    launch(run)
    want = ref.rank_attention(run.x, run.w)
    s = run.scratch()
    for row in range(run.m):
        count = int(want.keys.lens[row])
        assert int(s["counts"][row, 0]) == count and int(s["counts"][row, 1]) == int(want.keys.swa[row])
    run.check_attention(ref.finish(want, run.x, run.w, [want.partial] * TP))
    assert int(run.sync[0]) == 1, "a standalone launch still advances the epoch"
