"""mono_jit's references composed into one layer over 8 ranks, on a layer_math step and checkpoint:
what the runner must return bit for bit when it runs the reference backend (test_e2e_layer), and
what test_layer_math holds layer_math's independent formulation against."""

from __future__ import annotations

import layer_math as lm
import torch

from mono_jit.templates.k1 import reference as k1
from mono_jit.templates import reference_math as rmath
from mono_jit.templates.k2 import moe_reference as moe
from mono_jit.templates.k2 import attention_reference as k2

U8 = torch.uint8


def codes(expanded: torch.Tensor) -> torch.Tensor:
    """The 128 x 128 codes behind an mx32 expansion."""
    return expanded[::4, ::4].contiguous()


def rank_weights(w: lm.CheckpointLayer, r: int, tp: int = 8) -> tuple[k1.K1Weights, k2.K2Weights, moe.MoeWeights]:
    """Rank r's K1, K2 part-one and MoE weights as mono_jit's references take them."""
    d = lm.rank_tensors(w, r, tp)
    front = k1.K1Weights(
        hc_fn=d["hc_attn_fn"], hc_base=d["hc_attn_base"], hc_scale=d["hc_attn_scale"], attn_norm=d["attn_norm"],
        w_qkv=d["wqkv"].view(U8), s_qkv=codes(d["wqkv_scale"]), q_norm=d["q_norm"], kv_norm=d["kv_norm"],
        w_qb=d["wq_b"].view(U8), s_qb=codes(d["wq_b_scale"]), rope=d["cos_sin"], qkv_shuffled=True)
    back = k2.K2Weights(
        attn_sink=d["attn_sink"], wo_a=d["wo_a"].view(U8), s_woa=codes(d["wo_a_scale"]), wo_b=d["wo_b"].view(U8),
        s_wob=codes(d["wo_b_scale"]), rope=d["cos_sin"], hc_ffn_fn=d["hc_ffn_fn"], hc_ffn_base=d["hc_ffn_base"],
        hc_ffn_scale=d["hc_ffn_scale"], ffn_norm=d["ffn_norm"])
    experts = moe.MoeWeights(
        gate=d["gate_w"], bias=d["bias"], w13=d["w13"].view(U8), w13_s=d["w13_s"], w2=d["w2"].view(U8),
        w2_s=d["w2_s"], sgu=d["sgu"].view(U8), sgu_s=codes(d["sgu_s"]), sw2=d["sw2"].view(U8),
        sw2_s=codes(d["sw2_s"]))
    return front, back, experts


def compose(step: lm.LayerStep, w: lm.CheckpointLayer, tp: int = 8) -> dict[str, torch.Tensor]:
    """K1's reference on each rank (its rank_tensors), the KV insert, K2's reference (part one and the
    MoE) over the ranks: the layer's outputs, its SWA cache after the insert, y (attn_out), each
    rank's K2 inputs, part-one weights and stages 1-3 (k2_inputs, k2_weights, k2_attention) and the
    routed experts."""
    fold = step.x is not None
    cache = step.swa_cache.clone()
    weights = [rank_weights(w, r, tp) for r in range(tp)]
    fronts = [k1.k1(step.x, step.residual, step.post_mix, step.res_mix, fold, kw, step.positions)
              for kw, _, _ in weights]
    rmath.kv_insert(cache, fronts[0].records, step.slot_mapping, step.swa_page_stride, step.swa_block)
    inputs = [k2.K2Inputs(
        q=f.q, positions=step.positions, slot_mapping=step.slot_mapping, swa_indices=step.swa_indices,
        swa_lens=step.swa_lens, topk=step.topk, ratio=w.ratio,
        swa_cache=k2.PagedCache(cache, step.swa_page_stride, step.swa_block),
        comp_cache=k2.PagedCache(step.comp_cache, step.comp_page_stride, step.comp_block),
        residual=f.r, post=f.post, comb=f.comb, token_req=step.token_req, block_table=step.block_table,
        entries_per_page=step.entries_per_page) for f in fronts]
    whole = moe.k2_ranks(inputs, [b for _, b, _ in weights], [e for _, _, e in weights],
                         step.route_ids if w.hash_layer else None)
    out = whole[0].outputs
    return dict(normed=fronts[0].x_norm, qr=fronts[0].qr, records=fronts[0].records, swa_cache=cache,
                attn_out=whole[0].part_one.y, k2_inputs=inputs, k2_weights=[b for _, b, _ in weights],
                k2_attention=[r.part_one.rank for r in whole], out=out.out, res_out=out.res_out,
                post_out=out.post_out, comb_out=out.comb_out, pre_out=out.pre_out, expert_ids=whole[0].moe.ids)


def from_own_seam(res_out: torch.Tensor, step: lm.LayerStep, w: lm.CheckpointLayer, tp: int = 8) -> dict[str, torch.Tensor]:
    """The references fed a kernel's own hand-off: the FFN seam of its R (res_out, [M, 4, H]),
    and the MoE over the ranks on that seam's x_norm, all-reduced (post_out, comb_out, out)."""
    weights = [rank_weights(w, r, tp) for r in range(tp)]
    seam = k2.seam_of(res_out, weights[0][1])
    route = step.route_ids if w.hash_layer else None
    out = moe.all_reduce([moe.rank_moe(seam.x_norm, e, route).partial for _, _, e in weights])
    return dict(post_out=seam.post, comb_out=seam.comb, out=out)
