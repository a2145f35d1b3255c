"""Kernel launches against the torch references. They need an MI355X (gfx950) and are skipped
elsewhere; nothing here has run on hardware yet. These launch through FlyDSL's own JIT call;
tests/gpu/test_gpu_runtime.py launches through the runner's ctypes HIP backend."""

import pytest
import torch
from k1_harness import K1Run, check_stage, prepare_stage
from mono_jit.selfcheck.cases import positional
from mono_jit.selfcheck.k1_world import random_weights

from mono_jit.spec import Spec
from mono_jit.templates import get
from mono_jit.templates.keytable.reference import key_table
from mono_jit.templates.router.reference import route


def _on_gfx950() -> bool:
    if not torch.cuda.is_available() or getattr(torch.version, "hip", None) is None:
        return False
    return "gfx950" in torch.cuda.get_device_properties(0).gcnArchName


pytestmark = [
    pytest.mark.gfx950,
    pytest.mark.skipif(not _on_gfx950(), reason="needs an AMD MI355X (gfx950) GPU with ROCm; none on this machine"),
]


@pytest.mark.parametrize("rows, bucket, use_hash", [(1, 1, 0), (3, 4, 0), (5, 8, 1)])
def test_router_matches_reference(rows, bucket, use_hash):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(bucket, 7168, generator=g).to(torch.bfloat16)
    gate = (torch.randn(384, 7168, generator=g) * 0.02).to(torch.bfloat16)
    bias = torch.randn(384, generator=g) * 0.05
    hash_ids = torch.randint(0, 384, (bucket, 6), generator=g, dtype=torch.int32)
    ids = torch.full((bucket, 6), -7, dtype=torch.int32, device="cuda")
    weights = torch.zeros(bucket, 6, device="cuda")
    spec = Spec(8, 4, 1024, bucket)
    get("router").build(spec).launcher(*positional("router", spec, {
        "x": x.cuda().flatten(), "gate": gate.cuda().flatten(), "bias": bias.cuda(),
        "hash_ids": hash_ids.cuda().flatten(), "ids": ids.view(-1), "weights": weights.view(-1), "m": rows,
        "use_hash": use_hash}))
    torch.cuda.synchronize()
    ref_ids, ref_w = route(x[:rows], gate, bias, hash_ids[:rows] if use_hash else None)
    # Logit sums run in another order than torch's: ids may swap only on near-ties.
    assert (ids[:rows].cpu() == ref_ids).float().mean() > 0.99
    torch.testing.assert_close(weights[:rows].cpu().sum(-1), torch.full((rows,), 2.5), rtol=1e-4, atol=1e-4)
    match = ids[:rows].cpu() == ref_ids
    torch.testing.assert_close(weights[:rows].cpu()[match], ref_w[match], rtol=2e-3, atol=2e-4)
    assert (ids[rows:].cpu() == -7).all(), "rows past m must stay untouched"


@pytest.mark.parametrize("ratio, width", [(4, 1024), (128, 256)])
def test_keytable_matches_reference(ratio, width):
    rows, bucket, per_page = 3, 4, 64
    g = torch.Generator().manual_seed(ratio)
    swa = torch.randint(-1, 5000, (bucket, 128), generator=g, dtype=torch.int32)
    lens = torch.tensor([128, 7, 1, 0], dtype=torch.int32)
    limit = 3 * per_page if ratio == 4 else 100000
    topk = torch.randint(-1, limit, (bucket, width), generator=g, dtype=torch.int32)
    req = torch.tensor([0, 1, 0, 1], dtype=torch.int32)
    table = torch.randint(0, 1000, (2, 3), generator=g, dtype=torch.int32)
    slots = torch.full((bucket, width + 128), -7, dtype=torch.int32, device="cuda")
    out_lens = torch.full((bucket,), -7, dtype=torch.int32, device="cuda")
    spec = Spec(8, ratio, width, bucket)
    get("keytable").build(spec).launcher(*positional("keytable", spec, {
        "swa_indices": swa.cuda().flatten(), "swa_lens": lens.cuda(), "token_req": req.cuda(),
        "topk": topk.cuda().flatten(), "block_table": table.cuda().flatten(), "slots": slots.view(-1),
        "lens": out_lens, "m": rows, "block_table_stride": table.shape[1], "entries_per_page": per_page}))
    torch.cuda.synchronize()
    ref_slots, ref_lens = key_table(swa[:rows], lens[:rows], topk[:rows], ratio, req[:rows], table, per_page)
    assert torch.equal(out_lens[:rows].cpu(), ref_lens)
    assert torch.equal(slots[:rows].cpu(), ref_slots)
    assert (slots[rows:].cpu() == -7).all()


# -- K1 ------------------------------------------------------------------------------------

def _k1_run(bucket: int, shuffled: bool, row_pad: int) -> K1Run:
    w = random_weights(row_pad=row_pad)
    return K1Run(bucket, w, row_pad=row_pad, shuffled=shuffled, device="cuda",
                 launcher=get("k1").build(Spec(8, 4, 1024, bucket)).launcher)


@pytest.mark.parametrize("m, bucket, do_fold, shuffled",
                         [(1, 1, 1, False), (3, 4, 1, True), (17, 32, 0, False), (64, 64, 1, True)])
def test_k1_matches_reference(m, bucket, do_fold, shuffled):
    run = _k1_run(bucket, shuffled, row_pad=256)
    step = run.set_step(m, seed=m, do_fold=do_fold)
    before = run.cache.cpu().clone()
    run.launch(step)
    torch.cuda.synchronize()
    run.check(step, cache_before=before)
    assert run.sync[:3].tolist() == [1, 0, 0], "the epoch advances once; the exit and arrival counters reset"


def test_k1_launches_with_other_row_counts_on_one_sync_area():
    """Consecutive launches of one bucket with m = 6, 2, 8, 1 on the same sync area and scratch:
    each matches the reference, with no flag of the launch before read."""
    run = _k1_run(8, shuffled=False, row_pad=256)
    for launch, m in enumerate((6, 2, 8, 1), start=1):
        step = run.set_step(m, seed=40 + m, do_fold=1)
        before = run.cache.cpu().clone()
        run.launch(step)
        torch.cuda.synchronize()
        run.check(step, cache_before=before)
        assert run.sync[:3].tolist() == [launch, 0, 0]


DIRTY_AREA_LAUNCH = """
import sys, torch
sys.path[:0] = [{tests!r}, {tests!r} + "/support"]
from test_gpu import _k1_run
run = _k1_run(4, shuffled=False, row_pad=0)
step = run.set_step(3, seed=1, do_fold=1)
run.sync[2] = 5  # an arrival count left by a launch that was cut short
run.launch(step)
torch.cuda.synchronize()
print("NO TRAP")
"""


def test_k1_traps_on_a_dirty_sync_area():
    """A sync area left dirty (arrival counter not 0) makes the launch fail loudly: s_trap 2 puts
    the queue into its error state, which takes the process down, so it runs in a child."""
    import subprocess
    import sys
    from pathlib import Path

    child = subprocess.run([sys.executable, "-c", DIRTY_AREA_LAUNCH.format(tests=str(Path(__file__).resolve().parents[1]))],
                           capture_output=True, text=True, timeout=300)
    assert child.returncode != 0 and "NO TRAP" not in child.stdout, child.stdout + child.stderr


def test_k1_replays_under_a_hip_graph():
    run = _k1_run(8, shuffled=False, row_pad=0)
    step = run.set_step(5, seed=100, do_fold=1)
    run.launch(step)  # eager warm-up (FlyDSL loads the module outside the capture)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run.launch(step)
    for seed in (101, 102, 103):  # new inputs in the same buffers, then replay
        step = run.set_step(5, seed=seed, do_fold=1)
        before = run.cache.cpu().clone()
        graph.replay()
        torch.cuda.synchronize()
        run.check(step, cache_before=before)
    assert int(run.sync[0]) == 4, "one epoch per launch: the warm-up and three replays"


@pytest.mark.parametrize("stage", range(1, 7))
def test_k1_stage_alone_matches_reference(stage):
    """Each stage as a standalone launch (kernel.build(spec, {stage})), fed the reference's
    hand-off from the stage before and compared with the reference's hand-off to the next."""
    from mono_jit.templates.k1 import reference as ref
    from mono_jit.templates.k1.kernel import build

    bucket, m = 8, 5
    run = K1Run(bucket, random_weights(row_pad=256), row_pad=256, shuffled=False, device="cuda",
                launcher=build(Spec(8, 4, 1024, bucket), frozenset({stage})).launcher)
    step = run.set_step(m, seed=stage, do_fold=1)
    want = ref.k1(step.x, step.residual, step.post_mix, step.res_mix, True, run.w, step.positions)
    prepare_stage(run, stage, step, want)
    before = run.cache.cpu().clone()
    run.launch(step)
    torch.cuda.synchronize()
    check_stage(run, stage, step, want, before)
    assert int(run.sync[0]) == 1, "a standalone stage still advances the epoch"


def test_k1_nan_in_the_seam_gives_the_references_fp8_bytes():
    """S2 alone with one NaN in R: its row's x_norm is NaN throughout (the RMS sums it), so every
    MXFP8 byte of that row is an e4m3 NaN and every code 254, as the reference gives; the other
    rows are unaffected. Checks the NaN-propagating clamp and amax on the hardware."""
    from k1_harness import scratch

    from mono_jit.templates.k1 import reference as ref
    from mono_jit.templates.k1.kernel import build

    bucket, m = 4, 3
    run = K1Run(bucket, random_weights(), row_pad=0, shuffled=False, device="cuda",
                launcher=build(Spec(8, 4, 1024, bucket), frozenset({2})).launcher)
    step = run.set_step(m, seed=9, do_fold=1)
    step.residual[1, 2, 100] = float("nan")
    want = ref.k1(step.x, step.residual, step.post_mix, step.res_mix, True, run.w, step.positions)
    prepare_stage(run, 2, step, want)
    run.launch(step)
    torch.cuda.synchronize()
    s = {name: view.cpu() for name, view in scratch(run).items()}
    assert (want.x_codes[1] & 0x7F).eq(0x7F).all() and want.x_scales[1].eq(254).all()
    assert torch.equal(s["x_codes"][1] & 0x7F, want.x_codes[1] & 0x7F)
    assert torch.equal(s["x_scales"][1], want.x_scales[1])
    assert not (s["x_codes"][[0, 2]] & 0x7F).eq(0x7F).any()
