"""One layer's weights as vLLM 0.33's hook hands them over, checked, and the kernels' views of them.

vLLM's `MonoDecodeLayer.weights` builds `AttnWeights` and `MonoLayerWeights` by keyword
(`mono_decode.py:269-306`) from the loaded, preshuffled layer and calls `.check(dims)` on each
(`dims`: vLLM's `Dims(tp)`; only its `tp` is read here). The widths below are DeepSeek-V4-Pro's
(`mono_jit.deepseek_v4`) and the layouts those vLLM 0.33's DeepSeek-V4 loader leaves them in:
FP8 weights as e4m3 with vLLM's padded rows (`VLLM_ROCM_FP8_PADDING`: a row of K bytes, K a
multiple of 512, is K + 256 bytes apart), `fused_wqa_wkv`, `wo_b` and the shared gate_up in
AITER's (16, 16) preshuffle, block scales as E8M0 codes repeated over 32 x 32 blocks (vLLM's
`_mx_scales` expands the checkpoint's 128 x 128 codes). A mismatch is a ValueError naming the
tensor: the kernels' loads are bounded by buffer sizes, not shapes, so a wrong layout would be
read as garbage rather than fault.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .. import deepseek_v4
from ..errors import MonoJitError
from ..deepseek_v4 import HEAD_DIM, KV_LORA, MIXES, Q_LORA
from ..templates.geometry import MX_BLOCK as MX  # a 32 x 32 scale block, as vLLM's _mx_scales makes them
from ..templates.geometry import WEIGHT_BLOCK as CHECKPOINT_BLOCK
from ..templates.k2.attention_layout import O_LORA



class WeightError(MonoJitError, ValueError):
    """A weight whose shape, dtype or layout is not what the kernels read."""


def padded_row(k: int) -> int:
    """vLLM's row stride (bytes) of a row-major e4m3 weight with K = k."""
    return k + 256 if k % 512 == 0 else k


def _check(owner: str, name: str, tensor: Any, shape: tuple[int, ...], dtype: torch.dtype,
           row_stride: int | None = None) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise WeightError(f"{owner} {name}: expected a tensor, got {type(tensor).__name__}")
    laid_out = tensor.is_contiguous() if row_stride is None else tensor.stride() == (row_stride, 1)
    if tuple(tensor.shape) != shape or tensor.dtype != dtype or not laid_out:
        layout = "contiguous" if row_stride is None else f"rows {row_stride} apart"
        raise WeightError(f"{owner} {name}: {tuple(tensor.shape)} {tensor.dtype} strides {tuple(tensor.stride())}; "
                          f"expected {shape} {dtype}, {layout}")


NAN_CODE = 255  # E8M0's one non-power-of-two code


def checkpoint_codes(owner: str, name: str, codes: torch.Tensor) -> torch.Tensor:
    """The 128 x 128 block codes behind vLLM's 32 x 32 expansion (every 4 x 4 group equal). E8M0
    codes are powers of two except 255, NaN: a weight scaled by it is a broken checkpoint or a
    mislaid tensor, refused (vLLM's _scale_bytes checks its fp32 scales likewise)."""
    if bool((codes == NAN_CODE).any()):
        raise WeightError(f"{owner} {name}: E8M0 code 255 (NaN) among its scales")
    r = CHECKPOINT_BLOCK // MX
    rows, cols = codes.shape
    blocks = codes.view(rows // r, r, cols // r, r)
    first = blocks[:, :1, :, :1]
    if not torch.equal(blocks, first.expand_as(blocks)):
        raise WeightError(f"{owner} {name}: 32 x 32 scale codes that are not a 128 x 128 block's repeated "
                          "(K1 reads the checkpoint's 128 x 128 blocks)")
    return first.reshape(rows // r, cols // r).contiguous()


def kept_codes(weights: Any, owner: str, *names: str) -> tuple[torch.Tensor, ...]:
    """The 128 x 128 block codes of `weights`' named 32 x 32 scales (checkpoint_codes), made at
    their first use (the layer's first, eager, step: vLLM checks the weights then) and kept."""
    kept: dict[str, torch.Tensor] = weights._codes
    for name in names:
        if name not in kept:
            kept[name] = checkpoint_codes(owner, name, getattr(weights, name))
    return tuple(kept[name] for name in names)


@dataclass
class AttnWeights:
    """One layer's attention tensors on this rank (vLLM's keyword fields)."""

    layer_id: int
    wqkv: torch.Tensor  # [2048, 7168] e4m3, (16, 16) preshuffle
    wqkv_scale: torch.Tensor  # [64, 224] E8M0 codes
    q_norm: torch.Tensor  # [1536] bf16
    kv_norm: torch.Tensor  # [512] bf16
    wq_b: torch.Tensor  # [heads x 512, 1536] e4m3, padded rows
    wq_b_scale: torch.Tensor  # [heads x 16, 48]
    wo_a: torch.Tensor  # [groups x 1024, group_k] e4m3, padded rows
    wo_a_scale: torch.Tensor  # [groups x 32, group_k / 32]
    wo_b: torch.Tensor  # [7168, groups x 1024] e4m3, (16, 16) preshuffle
    wo_b_scale: torch.Tensor  # [224, groups x 32]
    attn_sink: torch.Tensor  # [>= heads] f32
    cos_sin: torch.Tensor  # [positions, 64] f32: cos | sin
    ratio: int
    _codes: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    def check(self, dims: Any) -> None:
        w, h = deepseek_v4.per_rank(dims.tp), deepseek_v4.HIDDEN
        owner, e4m3, u8 = f"layer {self.layer_id} attention", torch.float8_e4m3fn, torch.uint8
        table = (
            ("wqkv", (Q_LORA + KV_LORA, h), e4m3, None),
            ("wqkv_scale", ((Q_LORA + KV_LORA) // MX, h // MX), u8, None),
            ("q_norm", (Q_LORA,), torch.bfloat16, None),
            ("kv_norm", (KV_LORA,), torch.bfloat16, None),
            ("wq_b", (w.heads * HEAD_DIM, Q_LORA), e4m3, padded_row(Q_LORA)),
            ("wq_b_scale", (w.heads * HEAD_DIM // MX, Q_LORA // MX), u8, None),
            ("wo_a", (w.groups * O_LORA, w.group_k), e4m3, padded_row(w.group_k)),
            ("wo_a_scale", (w.groups * O_LORA // MX, w.group_k // MX), u8, None),
            ("wo_b", (h, w.groups * O_LORA), e4m3, None),
            ("wo_b_scale", (h // MX, w.groups * O_LORA // MX), u8, None),
        )
        for name, shape, dtype, row_stride in table:
            _check(owner, name, getattr(self, name), shape, dtype, row_stride)
        if self.attn_sink.dtype != torch.float32 or self.attn_sink.numel() < w.heads:
            raise WeightError(f"{owner} attn_sink: {tuple(self.attn_sink.shape)} {self.attn_sink.dtype}; "
                              f"expected float32 with at least {w.heads} values")
        if self.cos_sin.dtype != torch.float32 or self.cos_sin.dim() != 2 or self.cos_sin.shape[1] != 64 \
                or not self.cos_sin.is_contiguous():
            raise WeightError(f"{owner} cos_sin: {tuple(self.cos_sin.shape)} {self.cos_sin.dtype}; expected "
                              "contiguous float32 [positions, 64]")
        if self.ratio not in (deepseek_v4.CSA_RATIO, deepseek_v4.HCA_RATIO):
            raise WeightError(f"{owner}: compress ratio {self.ratio}, expected 4 or 128")
        self.k1_scales()
        self.k2_scales()

    def k1_scales(self) -> tuple[torch.Tensor, ...]:
        """K1's 128 x 128 block codes of wqkv and wq_b (kept_codes)."""
        return kept_codes(self, f"layer {self.layer_id} attention", "wqkv_scale", "wq_b_scale")

    def k2_scales(self) -> tuple[torch.Tensor, ...]:
        """K2's 128 x 128 block codes of wo_a and wo_b (kept_codes)."""
        return kept_codes(self, f"layer {self.layer_id} attention", "wo_a_scale", "wo_b_scale")


@dataclass
class MonoLayerWeights:
    """One layer's tensors on this rank (vLLM's keyword fields)."""

    attn: AttnWeights
    hc_attn_fn: torch.Tensor  # [24, 4 x 7168] f32
    hc_attn_scale: torch.Tensor  # [3] f32
    hc_attn_base: torch.Tensor  # [24] f32
    attn_norm: torch.Tensor  # [7168] bf16
    hc_ffn_fn: torch.Tensor
    hc_ffn_scale: torch.Tensor
    hc_ffn_base: torch.Tensor
    ffn_norm: torch.Tensor
    gate_w: torch.Tensor  # [384, 7168] bf16
    bias: torch.Tensor | None  # [384] f32; None on a hash layer
    w13: torch.Tensor  # [384, 2 inter, 3584] fp4x2
    w13_s: torch.Tensor  # [384 x 2 inter, 224]
    w2: torch.Tensor  # [384, 7168, inter / 2] fp4x2
    w2_s: torch.Tensor  # [384 x 7168, inter / 32 padded to 8]
    sgu: torch.Tensor  # [2 shared inter, 7168] e4m3, (16, 16) preshuffle
    sgu_s: torch.Tensor
    sw2: torch.Tensor  # [7168, shared inter] e4m3
    sw2_s: torch.Tensor
    _codes: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    def check(self, dims: Any) -> None:
        w, h, e = deepseek_v4.per_rank(dims.tp), deepseek_v4.HIDDEN, deepseek_v4.ROUTED_EXPERTS
        f32, bf16, u8, e4m3 = torch.float32, torch.bfloat16, torch.uint8, torch.float8_e4m3fn
        fp4 = torch.float4_e2m1fn_x2
        table = [
            ("gate_w", (e, h), bf16), ("w13", (e, 2 * w.inter, h // 2), fp4), ("w13_s", (e * 2 * w.inter, h // MX), u8),
            ("w2", (e, h, w.inter // 2), fp4), ("w2_s", (e * h, -(-(w.inter // MX) // 8) * 8), u8),
            ("sgu", (2 * w.shared_inter, h), e4m3), ("sgu_s", (2 * w.shared_inter // MX, h // MX), u8),
            ("sw2", (h, w.shared_inter), e4m3), ("sw2_s", (h // MX, w.shared_inter // MX), u8),
        ]
        for seam in ("attn", "ffn"):
            table += [(f"hc_{seam}_fn", (MIXES, 4 * h), f32), (f"hc_{seam}_scale", (3,), f32),
                      (f"hc_{seam}_base", (MIXES,), f32), (f"{seam}_norm", (h,), bf16)]
        if self.bias is not None:
            table.append(("bias", (e,), f32))
        for name, shape, dtype in table:
            _check(f"layer {self.attn.layer_id}", name, getattr(self, name), shape, dtype)
        # NaN codes are refused where codes are converted and kept (checkpoint_codes): K1's, K2's
        # and the shared expert's. The routed experts' scales are AITER's buffers, read as vLLM's
        # own MoE reads them and not scanned: w2_s's pad columns are left uninitialised by AITER's
        # shuffle_scale (torch.empty), so any code may sit there.
        self.shared_scales()

    def shared_scales(self) -> tuple[torch.Tensor, ...]:
        """K2's 128 x 128 block codes of the shared expert's gate_up and down (kept_codes)."""
        return kept_codes(self, f"layer {self.attn.layer_id}", "sgu_s", "sw2_s")
