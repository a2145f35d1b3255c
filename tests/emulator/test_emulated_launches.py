"""The shipped router, keytable and K1 code objects executed on the emulated gfx950 through
mono-jit's runtime (cache, emulator backend, kernargs), against their torch references, at every
default bucket: the cases `mono-jit selftest --emulate` runs, and K1's launches in a row, its
trap and its NaN handling. These are tests/gpu/test_gpu.py's launch tests for a machine with no
gfx950 (which runs them on the device, through FlyDSL's launcher, where there is one)."""

from __future__ import annotations

import pytest
import torch
from cache_settings import settings_at
from sparse_memory import GiB, sparse_bytes

from mono_jit.pipeline.prebuild import prebuild
from mono_jit.selfcheck.cases import k1_case, keytable_case, router_case
from mono_jit.selfcheck.emulated import emulated_launcher
from mono_jit.selfcheck.k1_world import BLOCK, PAGE_STRIDE, PAGES, K1Run, random_weights, scratch
from mono_jit.spec import STANDARD_MAX_TOKENS, Spec
from mono_jit.templates import get

pytest.importorskip("numba", reason="the emulator needs the emulate extra (numba, tinygrad)")
pytest.importorskip("tinygrad", reason="the emulator needs the emulate extra (numba, tinygrad)")

from mono_jit.emulator import EmulatorFault  # noqa: E402

GRID = [Spec(8, ratio, 1024 if ratio == 4 else 8192, bucket) for ratio in (4, 128) for bucket in STANDARD_MAX_TOKENS]


@pytest.fixture(scope="session")
def emulator_cache(tmp_path_factory):
    """Router and keytable over the default grid, compiled once for the session (K1's code
    objects come from conftest's k1_cache, which the ISA gates share)."""
    root = tmp_path_factory.mktemp("emulated") / "cache"
    summary, _ = prebuild([get("router"), get("keytable")], GRID, settings_at(root), jobs=2, timeout=1200)
    assert not summary.failed, summary.failed
    return root


@pytest.mark.parametrize("bucket", STANDARD_MAX_TOKENS)
def test_router_code_object_matches_reference(emulator_cache, bucket):
    """m = bucket - 1 rows, hash routing on odd buckets (selfcheck.cases.router_case)."""
    launch = emulated_launcher("router", Spec(8, 4, 1024, bucket), settings_at(emulator_cache))
    router_case(Spec(8, 4, 1024, bucket), launch, seed=0)
    assert launch.backend.last_report.wave_instructions > 0


@pytest.mark.parametrize("spec", GRID, ids=lambda s: f"r{s.ratio}-s{s.max_tokens}")
def test_keytable_code_object_matches_reference(emulator_cache, spec):
    keytable_case(spec, emulated_launcher("keytable", spec, settings_at(emulator_cache)), seed=0)


@pytest.mark.slow
@pytest.mark.parametrize("bucket", STANDARD_MAX_TOKENS)
def test_k1_code_object_matches_reference(k1_cache, bucket):
    """m = bucket - 3 rows (all below 8), weights shuffled on even buckets, every output and
    the KV cache (selfcheck.cases.k1_case)."""
    launch = emulated_launcher("k1", Spec(8, 4, 1024, bucket), settings_at(k1_cache))
    k1_case(Spec(8, 4, 1024, bucket), launch, seed=0)
    assert launch.backend.last_report.mfma > 0


def _k1(k1_cache, bucket: int, shuffled: bool = False, row_pad: int = 256) -> K1Run:
    launch = emulated_launcher("k1", Spec(8, 4, 1024, bucket), settings_at(k1_cache))
    run = K1Run(bucket, random_weights(row_pad=row_pad), row_pad=row_pad, shuffled=shuffled, device="cpu",
                launcher=launch)
    run.report = lambda: launch.backend.last_report  # type: ignore[attr-defined]
    return run


@pytest.mark.slow
def test_k1_code_object_with_other_row_counts_on_one_sync_area(k1_cache):
    """Consecutive launches of one bucket with m = 6, 2, 8, 1 on the same sync area and scratch:
    each matches the reference, with no flag of the launch before read."""
    run = _k1(k1_cache, 8)
    for launch, m in enumerate((6, 2, 8, 1), start=1):
        step = run.set_step(m, seed=40 + m, do_fold=1)
        before = run.cache.clone()
        run.launch(step)
        run.check(step, cache_before=before)
        assert run.sync[:3].tolist() == [launch, 0, 0]


def test_k1_code_object_inserts_records_past_4_gib_of_a_larger_cache(k1_cache, tmp_path):
    """The SWA cache past 4 GiB (a sparse file) and the step's slots in its last pages, past 2^32
    bytes (pages past 2^31 / stride): K1 writes each record through a 64-bit address
    (page x stride in i64), as the reference places it, and no other byte of those pages; a
    buffer resource's i32 extent refused such a cache at packing."""
    run = _k1(k1_cache, 8)
    first = 4 * GiB // PAGE_STRIDE + 1000
    run.cache = sparse_bytes(tmp_path / "swa", (first + PAGES) * PAGE_STRIDE)
    step = run.set_step(7, seed=5, do_fold=1)
    step.slots += (step.slots >= 0) * first * BLOCK
    run.slots[: step.m].copy_(step.slots)
    at = first * PAGE_STRIDE
    assert at > 4 * GiB and int(step.slots.max()) * (PAGE_STRIDE // BLOCK) > 4 * GiB
    before = run.cache[at:].clone()
    run.launch(step)
    run.check(step, cache_before=before, cache_at=at)


def test_k1_code_object_traps_on_a_dirty_sync_area(k1_cache):
    """An arrival counter left by a launch cut short makes K1 execute s_trap 2, which fails the
    launch as HIP would, naming the trap and where it was raised."""
    run = _k1(k1_cache, 4, row_pad=0)
    step = run.set_step(3, seed=1, do_fold=1)
    run.sync[2] = 5
    with pytest.raises(EmulatorFault, match=r"s_trap 2 .*k1_kernel_0 on device 0, workgroup"):
        run.launch(step)


def test_k1_code_object_nan_in_the_seam_makes_that_rows_codes_nan(k1_cache):
    """One NaN in a row's residual: that row's MXFP8 activation bytes are all e4m3 NaN with code
    254 (as the reference gives), its outputs NaN, and the other rows still match."""
    from mono_jit.templates.k1 import reference as ref

    run = _k1(k1_cache, 4, row_pad=0)
    step = run.set_step(3, seed=9, do_fold=1)
    step.residual[1, 2, 100] = float("nan")
    run.inputs["residual"][: step.residual.numel()].copy_(step.residual.flatten())
    want = ref.k1(step.x, step.residual, step.post_mix, step.res_mix, True, run.w, step.positions)
    run.launch(step)
    s = scratch(run)
    assert (want.x_codes[1] & 0x7F).eq(0x7F).all() and want.x_scales[1].eq(254).all()
    assert torch.equal(s["x_codes"][1] & 0x7F, want.x_codes[1] & 0x7F)
    assert torch.equal(s["x_scales"][1], want.x_scales[1])
    assert not (s["x_codes"][[0, 2]] & 0x7F).eq(0x7F).any()
