"""The shipped router, keytable and K1 code objects executed on the emulated gfx950 through
mono-jit's runtime (cache, emulator backend, kernargs), against their torch references, at every
default bucket. Where a real gfx950 is present, tests/test_gpu.py runs the same checks on it."""

from __future__ import annotations

import pytest
import torch
from cache_settings import settings_at
from emulated import emulated_launcher
from k1_harness import K1Run
from k1_inputs import random_weights

from mono_jit.prebuild import prebuild
from mono_jit.spec import STANDARD_MAX_TOKENS, Spec
from mono_jit.templates import get
from mono_jit.templates.keytable.reference import key_table
from mono_jit.templates.router.reference import route

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
    rows, use_hash = max(1, bucket - 1), bucket % 2
    g = torch.Generator().manual_seed(bucket)
    x = torch.randn(bucket, 7168, generator=g).to(torch.bfloat16)
    gate = (torch.randn(384, 7168, generator=g) * 0.02).to(torch.bfloat16)
    bias = torch.randn(384, generator=g) * 0.05
    hash_ids = torch.randint(0, 384, (bucket, 6), generator=g, dtype=torch.int32)
    ids = torch.full((bucket, 6), -7, dtype=torch.int32)
    weights = torch.zeros(bucket, 6)
    launch = emulated_launcher("router", Spec(8, 4, 1024, bucket), emulator_cache)
    launch(x.flatten(), gate.flatten(), bias, hash_ids.flatten(), ids.view(-1), weights.view(-1), rows, use_hash)
    ref_ids, ref_w = route(x[:rows], gate, bias, hash_ids[:rows] if use_hash else None)
    # Logit sums run in another order than torch's: ids may swap only on near-ties.
    assert (ids[:rows] == ref_ids).float().mean() > 0.99
    torch.testing.assert_close(weights[:rows].sum(-1), torch.full((rows,), 2.5), rtol=1e-4, atol=1e-4)
    match = ids[:rows] == ref_ids
    torch.testing.assert_close(weights[:rows][match], ref_w[match], rtol=2e-3, atol=2e-4)
    assert (ids[rows:] == -7).all(), "rows past m must stay untouched"
    assert launch.backend.last_report.wave_instructions > 0


@pytest.mark.parametrize("spec", GRID, ids=lambda s: f"r{s.ratio}-s{s.max_tokens}")
def test_keytable_code_object_matches_reference(emulator_cache, spec):
    bucket, width, per_page = spec.max_tokens, spec.topk_width, 64
    rows = max(1, bucket - 1)
    g = torch.Generator().manual_seed(spec.ratio + bucket)
    swa = torch.randint(-1, 5000, (bucket, 128), generator=g, dtype=torch.int32)
    lens = torch.randint(0, 129, (bucket,), generator=g, dtype=torch.int32)
    lens[0] = 128
    limit = 3 * per_page if spec.ratio == 4 else 100000
    topk = torch.randint(-1, limit, (bucket, width), generator=g, dtype=torch.int32)
    req = torch.randint(0, 2, (bucket,), generator=g, dtype=torch.int32)
    table = torch.randint(0, 1000, (2, 3), generator=g, dtype=torch.int32)
    slots = torch.full((bucket, width + 128), -7, dtype=torch.int32)
    out_lens = torch.full((bucket,), -7, dtype=torch.int32)
    launch = emulated_launcher("keytable", spec, emulator_cache)
    launch(swa.flatten(), lens, req, topk.flatten(), table.flatten(), slots.view(-1), out_lens, rows, table.shape[1],
           per_page)
    ref_slots, ref_lens = key_table(swa[:rows], lens[:rows], topk[:rows], spec.ratio, req[:rows], table, per_page)
    assert torch.equal(out_lens[:rows], ref_lens)
    assert torch.equal(slots[:rows], ref_slots)
    assert (slots[rows:] == -7).all()


def _k1(k1_cache, bucket: int, shuffled: bool = False, row_pad: int = 256) -> K1Run:
    launch = emulated_launcher("k1", Spec(8, 4, 1024, bucket), k1_cache)
    run = K1Run(bucket, random_weights(row_pad=row_pad), row_pad=row_pad, shuffled=shuffled, device="cpu",
                launcher=launch)
    run.report = lambda: launch.backend.last_report  # type: ignore[attr-defined]
    return run


@pytest.mark.parametrize("bucket", STANDARD_MAX_TOKENS)
def test_k1_code_object_matches_reference(k1_cache, bucket):
    m = bucket if bucket < 8 else bucket - 3
    run = _k1(k1_cache, bucket, shuffled=bucket % 2 == 0)
    step = run.set_step(m, seed=m, do_fold=int(bucket != 2))
    before = run.cache.clone()
    run.launch(step)
    run.check(step, cache_before=before)
    assert run.sync[:3].tolist() == [1, 0, 0], "the epoch advances once; the exit and arrival counters reset"
    assert run.report().mfma > 0


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
    from k1_harness import scratch

    from mono_jit.templates.k1 import reference as ref

    run = _k1(k1_cache, 4, row_pad=0)
    step = run.set_step(3, seed=9, do_fold=1)
    step.residual[1, 2, 100] = float("nan")
    run.inputs[1][: step.residual.numel()].copy_(step.residual.flatten())
    want = ref.k1(step.x, step.residual, step.post_mix, step.res_mix, True, run.w, step.positions)
    run.launch(step)
    s = scratch(run)
    assert (want.x_codes[1] & 0x7F).eq(0x7F).all() and want.x_scales[1].eq(254).all()
    assert torch.equal(s["x_codes"][1] & 0x7F, want.x_codes[1] & 0x7F)
    assert torch.equal(s["x_scales"][1], want.x_scales[1])
    assert not (s["x_codes"][[0, 2]] & 0x7F).eq(0x7F).any()
