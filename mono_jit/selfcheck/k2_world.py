"""K2's world for checks of its code object (CPU): real widths (16 heads x 512 a rank, 2 groups x 1024, hidden
7168, 8 ranks), few rows and keys; records in the real fp8_ds_mla encoding (K1's kv_record /
kv_insert) in a paged SWA cache and a paged compressed cache; weights in vLLM's per-rank layouts
(wo_a rows padded by 256 bytes of e4m3 NaN, wo_b AITER-preshuffled, E8M0 block scales) cut from
unsharded ones, and a sparse MoE layer's per-rank weights. `mono-jit selftest --emulate` and the
test suite (the reference's tests, the emulated and the gfx950 launches) share it.

The KV values are KV_GAIN times a normed kv's and q is 1 / KV_GAIN times a normed q: every score
q . k, and so the softmax, is the normed world's exactly (powers of two), while the records'
UE8M0 codes sit at 127..129, on both sides of a byte's sign bit (a code read sign-extended
flips its 64 dims). o is KV_GAIN larger; wo_a's codes are KV_GAIN_BITS lower, so z
and everything after it keep their normed magnitudes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..deepseek_v4 import EPS, HEAD_DIM, HEADS, HIDDEN as H, NOPE, OUTPUT_GROUPS, ROUTED_EXPERTS, per_rank
from ..templates.geometry import KV_RECORD
from ..templates.reference_math import kv_insert, kv_record, preshuffle_16x16, sinkhorn
from ..templates.k2 import attention_reference as ref
from ..templates.k2.attention_addressing import GROUP_K
from ..templates.k2.attention_layout import O_LORA
from ..templates.k2.moe_reference import MoeWeights
from .k1_world import rope_table

TP = 8  # the emulated world's ranks
LOCAL = per_rank(TP).heads
SWA_BLOCK, SWA_PAGES, COMP_BLOCK, COMP_PAGES = 64, 5, 16, 16
SWA_STRIDE, COMP_STRIDE = SWA_BLOCK * KV_RECORD + 128, COMP_BLOCK * KV_RECORD + 64  # page strides past the records
POISON_SWA = range(4 * SWA_BLOCK, 5 * SWA_BLOCK)  # NaN records: only ever masked keys point here
POISON_COMP = range(15 * COMP_BLOCK, 16 * COMP_BLOCK)
KV_GAIN_BITS = 8
KV_GAIN = 2 ** KV_GAIN_BITS
INTER = per_rank(TP).inter  # a rank's routed and shared intermediate share
LIVE = tuple(range(0, ROUTED_EXPERTS, 48))  # a sparse layer's reachable experts: every row's six among them
POSITIONS = [37, 300, 400]  # row 1 is graph padding
PAD = 1


# -- the world ------------------------------------------------------------------------------

@dataclass
class FullWeights:
    """Unsharded weights in checkpoint layout (fp8 as bytes, E8M0 block codes)."""

    sink: torch.Tensor  # [128]
    wo_a: torch.Tensor  # [16 x 1024, 4096]
    s_woa: torch.Tensor  # [128, 32]
    wo_b: torch.Tensor  # [7168, 16384]
    s_wob: torch.Tensor  # [56, 128]
    rope: torch.Tensor
    hc_fn: torch.Tensor
    hc_base: torch.Tensor
    hc_scale: torch.Tensor
    ffn_norm: torch.Tensor


def random_fp8(n: int, k: int, g: torch.Generator) -> torch.Tensor:
    """e4m3 bytes with exponent field 0..7 (|v| < 2, no NaN): bit 6 cleared."""
    return torch.randint(0, 256, (n, k), generator=g, dtype=torch.uint8) & 0xBF


def scale_codes(n: int, k: int, g: torch.Generator) -> torch.Tensor:
    """E8M0 codes 121..123 (2^-6..2^-4): with |w| < 2 and o ~ 0.2, z and y come out O(1)."""
    return torch.randint(121, 124, (n, k), generator=g, dtype=torch.uint8)


def full_weights(seed: int = 0) -> FullWeights:
    g = torch.Generator().manual_seed(seed)
    return FullWeights(
        sink=torch.randn(HEADS, generator=g) + 2.0,
        wo_a=random_fp8(OUTPUT_GROUPS * O_LORA, GROUP_K, g), s_woa=scale_codes(128, 32, g) - KV_GAIN_BITS,
        wo_b=random_fp8(H, OUTPUT_GROUPS * O_LORA, g), s_wob=scale_codes(56, 128, g),
        rope=rope_table(512, g), hc_fn=torch.randn(24, 4 * H, generator=g) * 0.01,
        hc_base=torch.randn(24, generator=g) * 0.1, hc_scale=torch.rand(3, generator=g) + 0.5,
        ffn_norm=(1 + 0.1 * torch.randn(H, generator=g)).to(torch.bfloat16))


def shard(w: FullWeights, rank: int) -> ref.K2Weights:
    """Rank `rank`'s weights as vLLM holds them: wo_a (column-parallel) its 2 groups' rows, padded
    by 256 bytes of NaN (VLLM_ROCM_FP8_PADDING); wo_b (row-parallel) its 2048 columns, preshuffled."""
    rows, cols = slice(2 * O_LORA * rank, 2 * O_LORA * (rank + 1)), slice(2048 * rank, 2048 * (rank + 1))
    wo_a = torch.cat([w.wo_a[rows], torch.full((2 * O_LORA, 256), 0x7F, dtype=torch.uint8)], dim=1)
    return ref.K2Weights(
        attn_sink=w.sink[LOCAL * rank: LOCAL * (rank + 1)], wo_a=wo_a, s_woa=w.s_woa[16 * rank: 16 * (rank + 1)],
        wo_b=preshuffle_16x16(w.wo_b[:, cols].contiguous()), s_wob=w.s_wob[:, 16 * rank: 16 * (rank + 1)],
        rope=w.rope, hc_ffn_fn=w.hc_fn, hc_ffn_base=w.hc_base, hc_ffn_scale=w.hc_scale, ffn_norm=w.ffn_norm)


@dataclass
class World:
    inputs: ref.K2Inputs  # with the full q [M, 128, 512]
    keys: list[list[tuple[str, int]]]  # per row: (cache, slot) of its keys, as built
    records: dict[str, dict[int, torch.Tensor]]  # cache -> slot -> record bytes

    def rank(self, r: int) -> ref.K2Inputs:
        return dataclasses.replace(self.inputs, q=self.inputs.q[:, LOCAL * r: LOCAL * (r + 1)])


def paged_cache(block: int, pages: int, stride: int, poison: range, g: torch.Generator
                ) -> tuple[ref.PagedCache, dict[int, torch.Tensor]]:
    """A cache of kv records of KV_GAIN x random bf16 values, and NaN records at the poison slots."""
    cache = ref.PagedCache(torch.zeros(pages * stride, dtype=torch.uint8), stride, block)
    slots = torch.arange(block * pages)
    records = kv_record(torch.randn(len(slots), HEAD_DIM, generator=g).to(torch.bfloat16).float() * KV_GAIN)
    records[list(poison), :NOPE] = 0x7F
    kv_insert(cache.data, records, slots, stride, block)
    return cache, {int(s): rec for s, rec in zip(slots, records)}


def world(ratio: int, seed: int = 1, rows: int = len(POSITIONS), width: int | None = None) -> World:
    """The step's first `rows` rows (at most 3; row PAD is graph padding) with `width` top-k
    entries a row (default 1024 for CSA, 256 for HCA; an HCA row's active keys stay 30 or 200)."""
    g = torch.Generator().manual_seed(seed)
    positions = POSITIONS[:rows]
    m = len(positions)
    swa_cache, swa_records = paged_cache(SWA_BLOCK, SWA_PAGES, SWA_STRIDE, POISON_SWA, g)
    comp_cache, comp_records = paged_cache(COMP_BLOCK, COMP_PAGES, COMP_STRIDE, POISON_COMP, g)
    width = width or (1024 if ratio == 4 else 256)
    swa_indices = torch.full((m, 128), -1, dtype=torch.int32)
    swa_lens = torch.tensor([min(p + 1, 128) for p in positions], dtype=torch.int32)
    topk = torch.full((m, width), -1, dtype=torch.int32)
    block_table = torch.stack([torch.randperm(15, generator=g)[:8] for _ in range(2)]).int()
    token_req = torch.tensor([0, 99, 1][:m], dtype=torch.int32)  # the pad row's request does not exist
    keys: list[list[tuple[str, int]]] = []
    for r, p in enumerate(positions):
        if r == PAD:  # garbage that would fail any read: slots past both caches
            swa_indices[r], topk[r] = 10 ** 6, 10 ** 6
            keys.append([])
            continue
        n = int(swa_lens[r])
        window = torch.randperm(POISON_SWA.start, generator=g)[:n].int()
        if r == 0:
            window[5] = -1  # a hole inside the window: masked
        swa_indices[r, :n] = window
        swa_indices[r, n:] = torch.tensor(POISON_SWA).repeat(2)[: 128 - n]  # past the window: masked
        row = [("swa", int(s)) for s in window if s >= 0]
        if ratio == 4:
            live = (p + 1) // 4
            local = torch.randperm(live, generator=g)[: min(live, 48)].int()
            local[len(local) // 2] = -1  # a -1 between live entries
            topk[r, : len(local)] = local
            pages = block_table[int(token_req[r])]
            row += [("comp", int(pages[i // COMP_BLOCK]) * COMP_BLOCK + int(i) % COMP_BLOCK) for i in local if i >= 0]
        else:
            count = 30 if r == 0 else 200
            slots = torch.randperm(POISON_COMP.start, generator=g)[:count].int()
            topk[r, :count] = slots
            row += [("comp", int(s)) for s in slots]
        keys.append(row)
    q = torch.randn(m, HEADS, HEAD_DIM, generator=g)
    q = (q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + EPS) / KV_GAIN).to(torch.bfloat16)
    inputs = ref.K2Inputs(
        q=q, positions=torch.tensor(positions), slot_mapping=torch.tensor([5, -1, 9][:m]), swa_indices=swa_indices,
        swa_lens=swa_lens, topk=topk, ratio=ratio, swa_cache=swa_cache, comp_cache=comp_cache,
        residual=torch.randn(m, 4, H, generator=g).to(torch.bfloat16), post=torch.rand(m, 4, generator=g) * 2,
        comb=sinkhorn(torch.randn(m, 4, 4, generator=g)),
        token_req=token_req if ratio == 4 else None, block_table=block_table if ratio == 4 else None,
        entries_per_page=COMP_BLOCK if ratio == 4 else None)
    return World(inputs, keys, {"swa": swa_records, "comp": comp_records})


# -- a sparse MoE layer -------------------------------------------------------------------------

def sparse_moe_ranks(seed: int = 3, live: tuple[int, ...] = LIVE, hash_layer: bool = False) -> list[MoeWeights]:
    """Each rank's MoE weights (vLLM's loaded layouts, as uint8 bytes) of a 384-expert layer whose
    `live` experts alone hold weights and win every top-6 (bias +50 on them; on a hash layer no
    bias). Random bytes in a shuffled layout are random bytes in the plain one, so each shard is
    drawn in its shuffled layout directly; the scale codes keep gate / up past the SwiGLU clamp
    and a rank's partial O(1). The other experts' routed tensors are torch.empty (never read:
    a 384-expert layer costs memory for its live experts only). Gate and bias are the layer's,
    the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    gate = (torch.randn(ROUTED_EXPERTS, H, generator=g) * 0.03).to(torch.bfloat16)
    bias = torch.randn(ROUTED_EXPERTS, generator=g) * 0.1
    bias[list(live)] += 50.0

    def codes(shape: tuple[int, ...], lo: int = 0, hi: int = 256) -> torch.Tensor:
        return torch.randint(lo, hi, shape, generator=g, dtype=torch.uint8)

    scale_cols = -(-(INTER // 32) // 8) * 8  # w2_s's columns, padded to 8 as AITER's shuffle_scale pads
    ranks = []
    for _ in range(TP):
        routed = {name: torch.empty(ROUTED_EXPERTS, *shape, dtype=torch.uint8) for name, shape in (
            ("w13", (2 * INTER, H // 2)), ("w13_s", (2 * INTER, H // 32)), ("w2", (H, INTER // 2)),
            ("w2_s", (H, scale_cols)))}
        for e in live:
            routed["w13"][e], routed["w13_s"][e] = codes((2 * INTER, H // 2)), codes((2 * INTER, H // 32), 121, 124)
            routed["w2"][e], routed["w2_s"][e] = codes((H, INTER // 2)), codes((H, scale_cols), 116, 119)
        ranks.append(MoeWeights(
            gate=gate, bias=None if hash_layer else bias, w13=routed["w13"], w13_s=routed["w13_s"].view(-1, H // 32),
            w2=routed["w2"], w2_s=routed["w2_s"].view(-1, scale_cols),
            sgu=codes((2 * INTER, H)) & 0xBF, sgu_s=codes((2 * INTER // 128, H // 128), 123, 126),
            sw2=codes((H, INTER)) & 0xBF, sw2_s=codes((H // 128, INTER // 128), 120, 123)))
    return ranks


def hash_route_ids(rows: int, seed: int = 5, live: tuple[int, ...] = LIVE) -> torch.Tensor:
    """A hash layer's experts for `rows` rows ([rows, 6] int32, the same on every rank): six
    distinct live experts a row."""
    g = torch.Generator().manual_seed(seed)
    picks = torch.stack([torch.randperm(len(live), generator=g)[:6] for _ in range(rows)])
    return torch.tensor(live, dtype=torch.int32)[picks]
