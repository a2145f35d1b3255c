"""`k1`: the attention seam and the attention front of a DeepSeek-V4-Pro decode layer, as one
persistent FlyDSL launch (256 CTAs x 512 threads) for gfx950.

Arguments: `K1Template.arguments`, in launch order, each with its dtype, shape and role (M =
rows this step, 1 <= M <= spec.max_tokens; every tensor a flat row-major buffer; fp8 tensors
passed as their bytes, e.g. `weight.view(torch.uint8)`). The runner's side (the sync area's
lifetime, scratch sizes, residency): docs/templates.md.

Semantics are reference.k1's. Specialised by TP (the local heads of wq_b) and max tokens; not
by ratio or top-k width: every layer type runs the same K1.
"""

from __future__ import annotations

from ...spec import Spec
from ..base import Argument, WorkBuffer
from ..persistent import PersistentTemplate
from .layout import PIN_LDS_BYTES, K1Layout


class K1Template(PersistentTemplate):
    name = "k1"
    spec_fields = ("tp", "max_tokens")
    pinned_lds = PIN_LDS_BYTES

    def arguments(self, spec: Spec) -> tuple[Argument, ...]:
        lay = K1Layout.of(spec)
        t, i = Argument.tensor, Argument.i32
        return (
            t("x", "bfloat16", "[M, 7168] previous FFN output, already reduced; unread on layer 0"),
            t("residual", "bfloat16", "[M, 4, 7168] mHC streams"),
            t("post_mix", "float32", "[M, 4] previous FFN seam post; unread on layer 0"),
            t("res_mix", "float32", "[M, 4, 4] previous FFN seam comb; unread on layer 0"),
            t("hc_fn", "float32", "[24, 28672] hc_attn_fn"),
            t("hc_base", "float32", "[24] hc_attn_base"),
            t("hc_scale", "float32", "[3] hc_attn_scale"),
            t("attn_norm", "bfloat16", "[7168]"),
            t("w_qkv", "uint8", "[2048, qkv_stride] fused_wqa_wkv e4m3: row-major (rows may be padded, stride % 16 "
              "== 0) or, with qkv_shuffled, AITER's (16, 16) preshuffle of [2048, 7168]"),
            t("s_qkv", "uint8", "[16, 56] its 128 x 128 block scales as E8M0 codes (reference.e8m0_from_scale "
              "turns vLLM's f32 power-of-two scales into them, exactly)"),
            t("q_norm", "bfloat16", "[1536]"),
            t("kv_norm", "bfloat16", "[512]"),
            t("w_qb", "uint8", f"[{lay.q_width}, qb_stride] wq_b e4m3 (qb_shuffled as w_qkv's)"),
            t("s_qb", "uint8", f"[{lay.q_width // 128}, 12] E8M0 block scales"),
            t("rope", "float32", "[P, 64] cos | sin per position (GPT-J pairs on the last 64 dims)"),
            t("positions", "int64", "[M]"),
            t("slot_mapping", "int64", "[M] SWA slots, -1 = none"),
            t("kv_cache", "uint8", "SWA cache bytes: pages of block_size 584-byte fp8_ds_mla records (data rows "
              "first, then the scale bytes: a record's 7 codes and its pad byte, written 0 as vLLM's insert "
              "does), page_stride bytes a page; written through 64-bit addresses, so it may pass 4 GiB",
              unbounded=True),
            t("r_out", "bfloat16", "[M, 4, 7168] out: R after the fold (may alias residual)"),
            t("post_out", "float32", "[M, 4] out: attention seam post, for K2"),
            t("comb_out", "float32", "[M, 4, 4] out: attention seam comb, for K2"),
            t("x_norm", "bfloat16", "[M, 7168] out: normed seam input (vLLM's compressor / indexer)"),
            t("qr_out", "bfloat16", "[M, 1536] out: q_norm(qr) (indexer)"),
            t("q_out", "bfloat16", f"[M, {lay.heads}, 512] out: q, for K2's attention"),
            t("sync", "int32", f"[{lay.sync_words}] epoch, exit and arrival counters, flags; zeroed once (docs/templates.md)"),
            t("work_f32", "float32", f"[{lay.f32_words}] scratch, exactly: the kernel bounds its accesses by it"),
            t("work_u8", "uint8", f"[{lay.bytes}] scratch, exactly: the kernel bounds its accesses by it"),
            i("m", "rows this step (1..max_tokens; clamped to 0..max_tokens)"),
            i("do_fold", "0 on layer 0, else 1"),
            i("qkv_stride", "row stride of w_qkv in bytes (row-major)"),
            i("qkv_shuffled", "1 if w_qkv is AITER-preshuffled (16, 16), else 0"),
            i("qb_stride", "row stride of w_qb in bytes (row-major)"),
            i("qb_shuffled", "1 if w_qb is AITER-preshuffled (16, 16), else 0"),
            i("page_stride", "kv_cache.stride(0) in bytes"),
            i("block_size", "records per SWA page"),
        )

    def work_buffers(self, spec: Spec) -> tuple[WorkBuffer, ...]:
        lay = K1Layout.of(spec)
        return (WorkBuffer("sync", "int32", lay.sync_words, zeroed_once=True),
                WorkBuffer("work_f32", "float32", lay.f32_words), WorkBuffer("work_u8", "uint8", lay.bytes))
