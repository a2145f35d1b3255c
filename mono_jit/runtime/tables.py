"""K2's two address tables (templates/k2/attention_layout.py WEIGHT_TABLE and STATE_TABLE), as int64 lists.

K2 reads its weights and the runner's buffers through tables of addresses, so that each is
live in registers only in the stage that reads it (the K2 package docstring). The weights table
is made once a layer, from vLLM's tensors as loaded and preshuffled (MonoLayerWeights, already
checked), with the scale views K2 reads; the state table once per output set of the runner.
Neither ever changes afterwards: the tensors they point at never move.
"""

from __future__ import annotations

import torch

from ..templates.k2.attention_layout import STATE_TABLE, WEIGHT_TABLE
from .weights import MonoLayerWeights

Entry = torch.Tensor | int


def addresses(order: tuple[str, ...], entries: dict[str, Entry]) -> list[int]:
    missing = [name for name in order if name not in entries]
    if missing or len(entries) != len(order):
        raise KeyError(f"table entries {sorted(entries)}; expected {list(order)}")
    return [v.data_ptr() if isinstance(v, torch.Tensor) else int(v) for v in (entries[n] for n in order)]


def weight_entries(w: MonoLayerWeights) -> dict[str, Entry]:
    """The layer's weights table's entries: wo_a with vLLM's padded rows (row-major), wo_b and the
    shared gate_up AITER-preshuffled, the routed experts in AITER's A8W4 layout, 128 x 128 block
    codes for the FP8 weights; a hash layer (no bias) gets 0 in the bias entry (K2 reads it
    through a 0-byte view there)."""
    a = w.attn
    s_oa, s_ob = a.k2_scales()
    sgu_s, sw2_s = w.shared_scales()
    return {
        "w_oa": a.wo_a, "s_oa": s_oa, "w_ob": a.wo_b, "s_ob": s_ob, "attn_sink": a.attn_sink, "rope": a.cos_sin,
        "hc_fn": w.hc_ffn_fn, "hc_base": w.hc_ffn_base, "hc_scale": w.hc_ffn_scale, "ffn_norm": w.ffn_norm,
        "woa_stride": a.wo_a.stride(0), "woa_shuffled": 0, "wob_stride": a.wo_b.shape[1], "wob_shuffled": 1,
        "gate": w.gate_w, "bias": w.bias if w.bias is not None else 0,
        "w13": w.w13, "w13_s": w.w13_s, "w2": w.w2, "w2_s": w.w2_s,
        "sgu": w.sgu, "sgu_s": sgu_s, "sw2": w.sw2, "sw2_s": sw2_s,
        "sgu_stride": w.sgu.shape[1], "sgu_shuffled": 1, "sw2_stride": w.sw2.stride(0), "sw2_shuffled": 0}


def weight_table(w: MonoLayerWeights) -> list[int]:
    """The layer's weights table (weight_entries' addresses, in K2's order)."""
    return addresses(WEIGHT_TABLE, weight_entries(w))


def state_entries(front: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor],
                  x_norm: torch.Tensor) -> dict[str, Entry]:
    """The runner's buffers K2 reads and writes: K1's outputs (`front`: q_out, r_out, post_out,
    comb_out), one output set (out, res_out, post_out, comb_out, pre_out) and K2's normed row."""
    return {
        "q": front["q_out"], "residual": front["r_out"], "post_in": front["post_out"], "comb_in": front["comb_out"],
        "r_out": outputs["res_out"], "post_out": outputs["post_out"], "comb_out": outputs["comb_out"],
        "pre_out": outputs["pre_out"], "x_norm": x_norm, "out": outputs["out"]}


def state_table(front: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor], x_norm: torch.Tensor) -> list[int]:
    """One output set's state table (state_entries' addresses, in K2's order)."""
    return addresses(STATE_TABLE, state_entries(front, outputs, x_norm))
