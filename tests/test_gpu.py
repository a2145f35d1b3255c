"""Kernel launches against the torch references. They need an MI355X (gfx950) and are skipped
elsewhere; nothing here has run on hardware yet. The launch goes through FlyDSL's own JIT
call (the ctypes runner comes with the runner issue)."""

import dataclasses

import pytest
import torch

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
    build = get("router").build(Spec(8, 4, 1024, bucket))
    build.launcher(x.cuda().flatten(), gate.cuda().flatten(), bias.cuda(), hash_ids.cuda().flatten(),
                   ids.view(-1), weights.view(-1), rows, use_hash)
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
    build = get("keytable").build(Spec(8, ratio, width, bucket))
    build.launcher(swa.cuda().flatten(), lens.cuda(), req.cuda(), topk.cuda().flatten(), table.cuda().flatten(),
                   slots.view(-1), out_lens, rows, table.shape[1], per_page)
    torch.cuda.synchronize()
    ref_slots, ref_lens = key_table(swa[:rows], lens[:rows], topk[:rows], ratio, req[:rows], table, per_page)
    assert torch.equal(out_lens[:rows].cpu(), ref_lens)
    assert torch.equal(slots[:rows].cpu(), ref_slots)
    assert (slots[rows:].cpu() == -7).all()


# -- K1 ------------------------------------------------------------------------------------

K1_BLOCK, K1_PAGES = 64, 4
K1_PAGE_STRIDE = 37440  # 64 x 584 rounded up to the 576-byte stride, as vLLM allocates


class K1Run:
    """K1's device buffers for one bucket; launch() runs one step on them."""

    def __init__(self, bucket: int, w, row_pad: int, shuffled: bool = False):
        from mono_jit.templates.k1.layout import K1Layout

        self.lay = K1Layout(8, bucket)
        from mono_jit.templates.k1 import reference as ref

        if shuffled:  # what vLLM's ROCm attention may do to fused_wqa_wkv (prepare_attn_preshuffle)
            w = dataclasses.replace(w, w_qkv=ref.preshuffle_16x16(w.w_qkv[:, :7168].contiguous()),
                                    qkv_shuffled=True)
            row_pad = 0
        self.bucket, self.w = bucket, w
        self.build = get("k1").build(Spec(8, 4, 1024, bucket))
        dev = "cuda"
        self.weights = [t.to(dev).flatten() for t in (
            w.hc_fn, w.hc_base, w.hc_scale, w.attn_norm, w.w_qkv, w.s_qkv, w.q_norm, w.kv_norm, w.w_qb, w.s_qb,
            w.rope)]
        self.layouts = (7168 + row_pad, int(w.qkv_shuffled), 1536 + row_pad, int(w.qb_shuffled))
        self.x = torch.zeros(bucket * 7168, dtype=torch.bfloat16, device=dev)
        self.residual = torch.zeros(bucket * 4 * 7168, dtype=torch.bfloat16, device=dev)
        self.post_mix = torch.zeros(bucket * 4, device=dev)
        self.res_mix = torch.zeros(bucket * 16, device=dev)
        self.positions = torch.zeros(bucket, dtype=torch.int64, device=dev)
        self.slots = torch.full((bucket,), -1, dtype=torch.int64, device=dev)
        self.cache = torch.randint(0, 256, (K1_PAGES * K1_PAGE_STRIDE,), dtype=torch.uint8, device=dev)
        sentinel = lambda n, dtype: torch.full((n,), -3.0, dtype=dtype, device=dev)  # noqa: E731
        self.r = sentinel(bucket * 4 * 7168, torch.bfloat16)
        self.post, self.comb = sentinel(bucket * 4, torch.float32), sentinel(bucket * 16, torch.float32)
        self.x_norm, self.qr = sentinel(bucket * 7168, torch.bfloat16), sentinel(bucket * 1536, torch.bfloat16)
        self.q = sentinel(bucket * self.lay.q_width, torch.bfloat16)
        self.sync = torch.zeros(self.lay.sync_words, dtype=torch.int32, device=dev)
        self.work_f32 = torch.zeros(self.lay.f32_words, device=dev)
        self.work_u8 = torch.zeros(self.lay.bytes, dtype=torch.uint8, device=dev)

    def set_inputs(self, x, residual, post_mix, res_mix, positions, slots):
        m = x.shape[0]
        for dst, src in ((self.x, x), (self.residual, residual), (self.post_mix, post_mix), (self.res_mix, res_mix),
                         (self.positions, positions), (self.slots, slots)):
            dst[: src.numel()].copy_(src.flatten())
        return m

    def launch(self, m: int, do_fold: int):
        hc_fn, hc_base, hc_scale, attn_norm, w_qkv, s_qkv, q_norm, kv_norm, w_qb, s_qb, rope = self.weights
        self.build.launcher(
            self.x, self.residual, self.post_mix, self.res_mix, hc_fn, hc_base, hc_scale, attn_norm, w_qkv, s_qkv,
            q_norm, kv_norm, w_qb, s_qb, rope, self.positions, self.slots, self.cache,
            self.r, self.post, self.comb, self.x_norm, self.qr, self.q, self.sync, self.work_f32, self.work_u8,
            m, do_fold, *self.layouts, K1_PAGE_STRIDE, K1_BLOCK)

    def check(self, m, x, residual, post_mix, res_mix, positions, slots, do_fold, cache_before):
        from mono_jit.templates.k1 import reference as ref

        want = ref.k1(x, residual, post_mix, res_mix, bool(do_fold), self.w, positions)
        heads = self.lay.heads
        close = torch.testing.assert_close
        # Tolerances: f32 sums run in another order (fold, mixes, norms); the GEMVs' fp8 inputs may
        # flip by one code where a bf16 input differs by one ulp.
        close(self.r[: m * 4 * 7168].cpu().view(m, 4, 7168), want.r, rtol=1e-2, atol=1e-2)
        close(self.post[: m * 4].cpu().view(m, 4), want.post, rtol=1e-4, atol=1e-5)
        close(self.comb[: m * 16].cpu().view(m, 4, 4), want.comb, rtol=1e-3, atol=1e-4)
        close(self.x_norm[: m * 7168].cpu().view(m, 7168), want.x_norm, rtol=2e-2, atol=2e-2)
        close(self.qr[: m * 1536].cpu().view(m, 1536), want.qr, rtol=5e-2, atol=5e-2)
        close(self.q[: m * heads * 512].cpu().view(m, heads, 512), want.q, rtol=5e-2, atol=5e-2)
        for name, out in (("r", self.r), ("post", self.post), ("x_norm", self.x_norm), ("q", self.q)):
            rest = out[m * out.numel() // self.bucket:]
            assert rest.eq(-3.0).all(), f"{name}: rows past m were written"
        cache = self.cache.cpu()
        touched = torch.zeros_like(cache, dtype=torch.bool)
        for row, slot in enumerate(slots.tolist()):
            if slot < 0:
                continue
            record = ref.kv_read(cache, slot, K1_PAGE_STRIDE, K1_BLOCK)
            close(ref.kv_dequantize(record.unsqueeze(0))[0], want.kv[row], rtol=0.07, atol=0.05)
            assert record[583] == ref.kv_read(cache_before, slot, K1_PAGE_STRIDE, K1_BLOCK)[583], "pad byte written"
            page, r = divmod(slot, K1_BLOCK)
            base = page * K1_PAGE_STRIDE
            touched[base + r * 576: base + (r + 1) * 576] = True
            touched[base + K1_BLOCK * 576 + r * 8: base + K1_BLOCK * 576 + r * 8 + 7] = True
        assert torch.equal(cache[~touched], cache_before[~touched]), "K1 wrote cache bytes outside its records"


def _k1_step(run: K1Run, m: int, seed: int, do_fold: int):
    from k1_inputs import random_activations

    x, residual, post_mix, res_mix = random_activations(m, seed)
    positions = torch.randint(0, 64, (m,), generator=torch.Generator().manual_seed(seed))
    # Distinct slots across all pages for even rows, -1 (no insert) for odd rows.
    slots = torch.tensor([(5 + 7 * i) % (K1_PAGES * K1_BLOCK) if i % 2 == 0 else -1 for i in range(m)])
    run.set_inputs(x, residual, post_mix, res_mix, positions, slots)
    return (m, x, residual, post_mix, res_mix, positions, slots, do_fold)


@pytest.mark.parametrize("m, bucket, do_fold, shuffled",
                         [(1, 1, 1, False), (3, 4, 1, True), (17, 32, 0, False), (64, 64, 1, True)])
def test_k1_matches_reference(m, bucket, do_fold, shuffled):
    from k1_inputs import random_weights

    run = K1Run(bucket, random_weights(row_pad=256), row_pad=256, shuffled=shuffled)
    step = _k1_step(run, m, seed=m, do_fold=do_fold)
    before = run.cache.cpu().clone()
    run.launch(m, do_fold)
    torch.cuda.synchronize()
    run.check(*step, cache_before=before)
    assert int(run.sync[0]) == 1 and int(run.sync[1]) == 0, "the epoch advances once and the exit counter resets"


def test_k1_replays_under_a_hip_graph():
    from k1_inputs import random_weights

    run = K1Run(8, random_weights(), row_pad=0)
    m = 5
    _k1_step(run, m, seed=100, do_fold=1)
    run.launch(m, 1)  # eager warm-up (FlyDSL loads the module outside the capture)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run.launch(m, 1)
    for seed in (101, 102, 103):  # new inputs in the same buffers, then replay
        step = _k1_step(run, m, seed=seed, do_fold=1)
        before = run.cache.cpu().clone()
        graph.replay()
        torch.cuda.synchronize()
        run.check(*step, cache_before=before)
    assert int(run.sync[0]) == 4, "one epoch per launch: the warm-up and three replays"
