"""Pure-torch reference of K2 part two (the MoE), stage by stage; its docstrings define the kernel's
semantics. Sources are cited by path under vllm/ (0.33.0).

One rank holds the router, every routed expert's 1/TP share of the intermediate (3072 / TP = 384
columns at TP8) and the shared expert's 1/TP share. Rounding points, as vLLM's ROCm decode path
rounds (models/deepseek_v4/amd/model.py:787 DeepseekV4MoE.forward -> FusedMoE with the shared
expert inside it): the MoE input is the FFN seam's bf16 x_norm; the router's logits are f32; the
shared expert's gate / up output is bf16, its SwiGLU output bf16, its down output bf16; a routed
expert's gate / up stays f32 into the SwiGLU, whose output is bf16 and then MXFP8 into down
(AITER's A8W4 stage 1 -> stage 2); the routed sum is one bf16 of the f32 sum over a row's picks
in top-k order (AITER's stage 2 adds bf16 atomically in no fixed order: the reference takes the
exact, deterministic order); the rank's partial is bf16(routed + shared) (fused_moe/runner/
moe_runner.py:790); the all-reduce sums the partials in f32 in rank order, one bf16 rounding.
Every MX GEMM input is MXFP8 by reference_math.mxfp8_quantize (one implementation: K1's and
the seams'). Inside a stage everything is f32, dot products in f64 (as K1's GEMVs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ... import deepseek_v4
from ..reference_math import e8m0_value, fp8_gemv, mxfp8_dequantize, mxfp8_quantize
from ...deepseek_v4 import STREAMS
from ..geometry import MX_BLOCK
from ..router import reference as router
from . import attention_reference as part_one

SWIGLU_LIMIT = 10.0  # config.swiglu_limit (models/deepseek_v4/amd/model.py:608)
# e2m1 magnitudes by their 3 low bits (1 sign, 2 exponent, 1 mantissa bits; OCP MX): 0, 0.5 (the
# subnormal), then 1.0 x 2^0 .. 1.5 x 2^2.
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# AITER's A8W4 weight tile (aiter/ops/shuffle.py shuffle_weight(is_guinterleave=True), called by
# shuffle_weight_a16w4(w, 16, gate_up)): 16 rows (NLane) x 64 bytes of K, the 64 bytes as 4
# lanes (KLane) x 16 bytes (KPack, 32 fp4 values).
N_LANE, K_LANE, K_PACK = 16, 4, 16
# Its scale tile (shuffle_scale(is_guinterleave=True) / shuffle_scale_a16w4): 32 rows (N_Pack 2
# x N_Lane 16) x 8 columns (K_Pack 2 x K_Lane 4) of E8M0 codes.
S_N_PACK, S_K_PACK, S_K_LANE = 2, 2, 4
SCALE_COLUMN_PAD = S_K_PACK * S_K_LANE  # w2_s's columns padded to a multiple of 8


# -- the weights ------------------------------------------------------------------------------

@dataclass
class MoeWeights:
    """One layer's MoE weights on one rank as vLLM holds them after loading (bytes as uint8).

    E = experts (384; fewer in tests), I = the routed intermediate share, S = the shared one.
    MonoLayerWeights' MoE fields (models/deepseek_v4/amd/mono/runner.py:115, shapes at :142-156), with the shared
    expert's block scales as the checkpoint's 128 x 128 codes (as K1's weights).
    """

    gate: torch.Tensor  # [E, H] bf16
    bias: torch.Tensor | None  # [E] f32 e_score_correction_bias; None on hash layers
    w13: torch.Tensor  # [E, 2 I, H / 2] fp4x2: gate rows then up rows, AITER A8W4-shuffled
    w13_s: torch.Tensor  # [E x 2 I, H / 32] E8M0, AITER shuffle_scale_a16w4(gate_up=True)
    w2: torch.Tensor  # [E, H, I / 2] fp4x2, AITER A8W4-shuffled (gate_up=False)
    w2_s: torch.Tensor  # [E x H, pad8(I / 32)] E8M0 in AITER's shuffle_scale order
    sgu: torch.Tensor  # [2 S, H] e4m3: gate rows then up rows, AITER (16, 16)-preshuffled
    sgu_s: torch.Tensor  # [2 S / 128, H / 128] E8M0
    sw2: torch.Tensor  # [H, S] e4m3, row-major
    sw2_s: torch.Tensor  # [H / 128, S / 128] E8M0


# -- 1. MXFP8 of the MoE input ----------------------------------------------------------------

def moe_input(x_norm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 [M, H], E8M0 [M, H / 32]): the FFN seam's normed bf16 row as MXFP8 per 32 (K1's
    mxfp8_quantize, so equal to Seam.x_codes / x_scales), read by the shared and the routed
    experts alike. vLLM: the A8W4 path quantises the MoE input per 1 x 32 (fused_moe/experts/
    rocm_aiter_moe.py:274 rocm_aiter_fused_experts, QuantMethod.BLOCK_1X32, with AITER's a8w4
    branch chosen by AITER_BF16_FP8_MOE_BOUND=0 at fused_moe/oracle/mxfp4.py:1822). AITER seeds
    its amax with 1e-10 (fused_mx_quant_moe_sort, per the in-tree mono's stages/moe.py docstring):
    that moves only the code of a block whose amax is below 1e-10, none of its values."""
    return mxfp8_quantize(x_norm)


# -- 2. the router ----------------------------------------------------------------------------

def route(x_norm: torch.Tensor, w: MoeWeights, route_ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [M, 6] int32, weights [M, 6] f32): the `router` template's semantics
    (router/reference.py): logits = bf16 x_norm . bf16 gate in f32; score = sqrt(softplus),
    softplus = max(l, 0) + log1p(exp(-|l|)); the top-6 of score + bias, larger first, ties to the
    LOWER expert index (vLLM's dsv4_topk takes the min index among the maxima,
    fused_moe/router/dsv4_topk.py:92-95); weights = the chosen unbiased scores / their sum x 2.5.
    Hash layers (route_ids given: vLLM's tid2eid[input_ids[:M]], models/deepseek_v4/amd/
    mono_decode.py:395) take those experts in their order, no bias, the same weights.
    vLLM: fused_moe/router/fused_topk_bias_router.py:285 (sqrtsoftplus -> topk_softplus_sqrt),
    and its CPU twin fused_moe/router/cpu_router.py:81 _sqrtsoftplus_bias_topk."""
    if route_ids is not None:
        return router.route(x_norm, w.gate, None, route_ids)
    return router.route(x_norm, w.gate, w.bias)


# -- 3. the shared expert ---------------------------------------------------------------------

def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """f32 silu(min(g, 10)) x clamp(u, -10, 10): vLLM's SiluAndMulWithClamp
    (model_executor/layers/activation.py:239 forward_native), for the routed experts too
    (FusedMoE's swiglu_limit, fused_moe/experts/rocm_aiter_moe.py:465 passes it to AITER)."""
    g = gate.float().clamp(max=SWIGLU_LIMIT)
    u = up.float().clamp(-SWIGLU_LIMIT, SWIGLU_LIMIT)
    return g * torch.sigmoid(g) * u


def shared_expert(codes: torch.Tensor, scales: torch.Tensor, w: MoeWeights) -> torch.Tensor:
    """bf16 [M, H]: the rank's shared-expert share. gate_up = bf16(MXFP8 x . sgu) (K1's
    fp8_gemv, sgu preshuffled), h = bf16(swiglu(gate_up[:, :S], gate_up[:, S:])), then
    bf16(MXFP8(h) . sw2). vLLM: models/deepseek_v4/amd/model.py:179 DeepseekV4MLP.forward
    (gemm_a8w8_blockscale_bpreshuffle to bf16, act_fn, down_proj to bf16, no all-reduce: the MoE's
    one all-reduce follows). vLLM quantises that path's inputs per 128 (group_fp8_quant); here
    they are MXFP8 per 32 like every input of K1 and K2 (as the in-tree mono's shared stage)."""
    s = w.sw2.shape[1]
    gate_up = fp8_gemv(codes, scales, w.sgu, w.sgu_s, deepseek_v4.HIDDEN, shuffled=True).to(torch.bfloat16)
    h = swiglu(gate_up[:, :s], gate_up[:, s:]).to(torch.bfloat16)
    h_codes, h_scales = mxfp8_quantize(h)
    return fp8_gemv(h_codes, h_scales, w.sw2, w.sw2_s, s).to(torch.bfloat16)


# -- 4. the routed experts --------------------------------------------------------------------

def e2m1_value(nibbles: torch.Tensor) -> torch.Tensor:
    """f32 of e2m1 codes (0..15; bit 3 the sign)."""
    magnitude = torch.tensor(E2M1, dtype=torch.float32)[(nibbles & 7).long()]
    return torch.where((nibbles & 8) != 0, -magnitude, magnitude)


def fp4_dequantize(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """f32 [..., K] of fp4x2 bytes [..., K / 2] (value 2i in the low nibble, 2i + 1 in the high,
    as torch.float4_e2m1fn_x2) with one E8M0 per 32 values [..., >= K / 32]."""
    codes = torch.arange(256)
    pairs = torch.stack([e2m1_value(codes & 0xF), e2m1_value(codes >> 4)], dim=-1)  # a byte's two values
    values = torch.nn.functional.embedding(packed.long(), pairs).flatten(-2)  # one lookup a byte
    blocks = values.shape[-1] // MX_BLOCK
    scale = e8m0_value(scales[..., :blocks])
    return (values.unflatten(-1, (blocks, MX_BLOCK)) * scale[..., None]).flatten(-2)


def unshuffle_w13(w13: torch.Tensor) -> torch.Tensor:
    """[E, 2 I, H / 2] bytes, gate rows then up rows, from AITER's gate_up A8W4 layout, whose
    order is [E][I / 16 tiles][gate, up][K / 64 bytes][4 KLane][16 rows][16 bytes]: gate and up
    interleave in 16-row tiles (shuffle_weight_a16w4(w13, 16, True), as vLLM calls it at
    fused_moe/oracle/mxfp4.py:1834)."""
    e, rows, k = w13.shape
    tiles = rows // 2 // N_LANE
    x = w13.reshape(e, tiles, 2, k // (K_LANE * K_PACK), K_LANE, N_LANE, K_PACK)
    return x.permute(0, 2, 1, 5, 3, 4, 6).reshape(e, rows, k)


def unshuffle_w2(w2: torch.Tensor) -> torch.Tensor:
    """[E, H, I / 2] bytes from AITER's A8W4 layout [E][H / 16][K / 64 bytes][4][16 rows][16]
    (shuffle_weight_a16w4(w2, 16, False), fused_moe/oracle/mxfp4.py:1849)."""
    e, rows, k = w2.shape
    x = w2.reshape(e, rows // N_LANE, k // (K_LANE * K_PACK), K_LANE, N_LANE, K_PACK)
    return x.permute(0, 1, 4, 2, 3, 5).reshape(e, rows, k)


def unshuffle_scales(s: torch.Tensor, experts: int, gate_up: bool) -> torch.Tensor:
    """[E, rows, cols] E8M0 codes from AITER's A8W4 scale order, [E][rows / 32][cols / 8][K_Lane 4]
    [N_Lane 16][K_Pack 2][N_Pack 2] (shuffle_scale(is_guinterleave=True), fused_moe/oracle/
    mxfp4.py:1841 and :1857). Column c = (c / 8, K_Pack, K_Lane); row r of a 32-row block is
    (N_Pack, N_Lane): for gate_up the N_Pack is gate / up (gate rows then up rows come out),
    otherwise r = 32 (r / 32) + 16 N_Pack + N_Lane. On w2_s's padded columns this is exactly the
    plain shuffle_scale layout the in-tree reads (mono/common/mx.py:46 scale_index)."""
    total, cols = s.shape
    rows = total // experts
    x = s.reshape(experts, rows // (S_N_PACK * N_LANE), cols // SCALE_COLUMN_PAD, S_K_LANE, N_LANE, S_K_PACK, S_N_PACK)
    if gate_up:  # -> [E, N_Pack, rows / 32, N_Lane, cols / 8, K_Pack, K_Lane]
        return x.permute(0, 6, 1, 4, 2, 5, 3).reshape(experts, rows, cols)
    return x.permute(0, 1, 6, 4, 2, 5, 3).reshape(experts, rows, cols)  # [E, rows / 32, N_Pack, N_Lane, ...]


def expert_union(ids: torch.Tensor, experts: int) -> list[int]:
    """The step's union of chosen experts, ascending, each once however many rows chose it (ids
    outside 0..E-1, a hash table's or a pad's, choose nothing): the experts whose weights K2
    reads this step."""
    return sorted({int(e) for e in ids.flatten().tolist() if 0 <= e < experts})


def expert_matrices(w: MoeWeights, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(w13 [2 I, H], w2 [H, I]) f32 of one expert, from vLLM's shuffled bytes and scales."""
    experts, rows = w.w13.shape[0], w.w13.shape[1]
    w13 = unshuffle_w13(w.w13[expert:expert + 1])[0]
    w13_s = unshuffle_scales(w.w13_s.view(experts, -1)[expert].view(rows, -1), 1, gate_up=True)[0]
    w2 = unshuffle_w2(w.w2[expert:expert + 1])[0]
    w2_s = unshuffle_scales(w.w2_s.view(experts, -1)[expert].view(w.w2.shape[1], -1), 1, gate_up=False)[0]
    return fp4_dequantize(w13, w13_s), fp4_dequantize(w2, w2_s)


def routed_experts(codes: torch.Tensor, scales: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                   w: MoeWeights) -> torch.Tensor:
    """bf16 [M, H]: the rank's routed share. For each expert of the union (its weights read once)
    and each pick (row r, slot j) of it: gu = MXFP8 x_r . w13^T (MXFP4 x MXFP8, f32), h =
    MXFP8(bf16(swiglu(gu[:I], gu[I:]))), y = h . w2^T (f32) x weights[r, j]; then per row the
    picks' y summed in f32 in top-k order and rounded to bf16 once. vLLM: fused_moe/experts/
    rocm_aiter_moe.py:274 rocm_aiter_fused_experts (AITER's A8W4 two-stage MoE: stage 1 gate/up +
    the clamped SiLU -> bf16, MXFP8 of it, stage 2 down x the routing weight, summed per token),
    with each rank's intermediate share as FusedMoE shards it (w13 rows, w2 columns)."""
    x = mxfp8_dequantize(codes, scales).double()
    inter = w.w2.shape[2] * 2
    picks = torch.zeros(*ids.shape, deepseek_v4.HIDDEN, dtype=torch.float32)
    for expert in expert_union(ids, w.w13.shape[0]):
        w13, w2 = expert_matrices(w, expert)
        rows, slots = torch.nonzero(ids == expert, as_tuple=True)
        gu = x[rows].matmul(w13.double().T).float()
        h_codes, h_scales = mxfp8_quantize(swiglu(gu[:, :inter], gu[:, inter:]).to(torch.bfloat16))
        h = mxfp8_dequantize(h_codes, h_scales)
        y = h.double().matmul(w2.double().T).float()
        picks[rows, slots] = y * weights[rows, slots, None].float()
    total = picks[:, 0]
    for j in range(1, ids.shape[1]):
        total = total + picks[:, j]
    return total.to(torch.bfloat16)


# -- 5. the rank's partial and the MoE all-reduce ---------------------------------------------

def moe_partial(routed: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
    """bf16 [M, H] = bf16(routed + shared) in f32: what a rank contributes to the MoE all-reduce.
    vLLM: fused_moe/runner/moe_runner.py:790 (shared_output + fused_output), then the one
    all-reduce at :515."""
    return (routed.float() + shared.float()).to(torch.bfloat16)


def all_reduce(partials: Sequence[torch.Tensor]) -> torch.Tensor:
    """The MoE all-reduce: part one's all_reduce (f32 in rank order, one bf16 rounding), the same
    mechanism as the attention's."""
    return part_one.all_reduce(partials)


@dataclass
class RankMoe:
    """Stages 1-4 on one rank, with what each stage hands the next."""

    codes: torch.Tensor  # [M, H] e4m3
    scales: torch.Tensor  # [M, 224] E8M0
    ids: torch.Tensor  # [M, 6] int32
    weights: torch.Tensor  # [M, 6] f32
    shared: torch.Tensor  # [M, H] bf16
    routed: torch.Tensor  # [M, H] bf16
    partial: torch.Tensor  # [M, H] bf16


def rank_moe(x_norm: torch.Tensor, w: MoeWeights, route_ids: torch.Tensor | None = None) -> RankMoe:
    """Stages 1-4 and the partial on one rank, from the FFN seam's x_norm."""
    codes, scales = moe_input(x_norm)
    ids, weights = route(x_norm, w, route_ids)
    shared = shared_expert(codes, scales, w)
    routed = routed_experts(codes, scales, ids, weights, w)
    return RankMoe(codes, scales, ids, weights, shared, routed, moe_partial(routed, shared))


# -- 6. the layer's outputs and the whole K2 --------------------------------------------------

@dataclass
class LayerOutputs:
    """What vLLM's hook gets back from the runner, (out, res_out, post_out, comb_out, pre_out)
    (models/deepseek_v4/amd/mono/runner.py:292 forward; buffers at :282-290), of which the hook
    returns the first four as the layer's (x, residual, post_mix, res_mix)
    (models/deepseek_v4/amd/mono_decode.py:423 `return out[:4]`), i.e. what the unfused layer
    returns at models/deepseek_v4/amd/model.py:1051-1057 (the FFN seam's mhc_fused_post_pre,
    then x = ffn(x)): the next layer folds out into res_out with post_out / comb_out."""

    out: torch.Tensor  # [M, H] bf16: the MoE output, all-reduced (the layer's x)
    res_out: torch.Tensor  # [M, 4, H] bf16: R after the attention's fold (the layer's residual)
    post_out: torch.Tensor  # [M, 4, 1] f32: the FFN seam's post mix (the layer's post_mix)
    comb_out: torch.Tensor  # [M, 4, 4] f32: the FFN seam's Sinkhorn comb (the layer's res_mix)
    pre_out: torch.Tensor  # [M, 4] f32: the FFN seam's pre (written; the hook drops it)


def layer_outputs(out: torch.Tensor, seam: part_one.Seam) -> LayerOutputs:
    """The five outputs from the reduced MoE output and part one's FFN seam (pre_out is the
    seam's pre)."""
    return LayerOutputs(out, seam.r, seam.post.reshape(-1, STREAMS, 1), seam.comb, seam.pre)


@dataclass
class K2Result:
    """The whole K2 on one rank."""

    part_one: part_one.K2Outputs
    moe: RankMoe
    outputs: LayerOutputs


def k2_ranks(inputs: Sequence[part_one.K2Inputs], weights: Sequence[part_one.K2Weights],
             moe: Sequence[MoeWeights], route_ids: torch.Tensor | None = None) -> list[K2Result]:
    """The whole K2 on every rank of a simulated TP group, in rank order: part one
    (reference.k2_part_one_ranks), then each rank's MoE on its (identical) FFN-seam x_norm with
    its weight shards, the MoE all-reduce of the ranks' partials, and the layer's outputs.
    `route_ids` [M, 6]: a hash layer's experts (the same on every rank), else None."""
    if not len(inputs) == len(weights) == len(moe):
        raise ValueError("one input, one part-one weight set and one MoE weight set per rank")
    ones = part_one.k2_part_one_ranks(inputs, weights)
    moes = [rank_moe(one.seam.x_norm, w, route_ids) for one, w in zip(ones, moe)]
    out = all_reduce([m.partial for m in moes])
    return [K2Result(one, m, layer_outputs(out, one.seam)) for one, m in zip(ones, moes)]


def moe_shards(tp: int = 8) -> int:
    """The routed and the shared intermediate a rank holds: MOE_INTERMEDIATE / tp (FusedMoE's
    intermediate_size_per_partition; DeepseekV4MLP's MergedColumnParallelLinear share)."""
    inter = deepseek_v4.per_rank(tp).inter
    if deepseek_v4.MOE_INTERMEDIATE % tp or inter % (2 * K_LANE * K_PACK):
        raise ValueError(f"TP {tp} does not split the intermediate {deepseek_v4.MOE_INTERMEDIATE} in 128-value "
                         "fp4 tiles")
    return inter

