"""`keytable`: the attention keys of each decode token, as a standalone FlyDSL launch.

Contract (M = rows this step, 1 <= M <= spec.max_tokens; W = spec.topk_width; flat buffers):
  in   swa_indices  [M, 128] int32     decode_swa_indices: global SWA slots, -1 padded
       swa_lens     [M] int32          decode_swa_lens = min(p + 1, 128)
       token_req    [M] int32          token_to_req_indices (CSA only)
       topk         [M, W] int32       CSA: topk_indices_buffer (local compressed indices);
                                       HCA: c128a_global_decode_topk_indices (global slots)
       block_table  [R * stride] int32 the compressed block table, flat (CSA only)
       m, block_table_stride, entries_per_page   i32 runtime arguments
                                       (entries_per_page = kv block size / 4 for CSA)
  out  slots        [M, W + 128] int32 SWA slots, then compressed slots; -1 after the end
       lens         [M] int32          valid keys per row
Specialised by ratio (CSA maps local indices through the block table, HCA takes them as
given), top-k width and max tokens; not by TP.
"""

from __future__ import annotations

from ... import deepseek_v4
from ...spec import Spec
from ..base import Argument, LaunchShape, Template


class KeyTableTemplate(Template):
    name = "keytable"
    spec_fields = ("ratio", "topk_width", "max_tokens")
    kernel_module = ".kernel"

    def launch_shape(self, spec: Spec) -> LaunchShape:
        # One wave per row; the compaction is a wave-wide prefix count.
        return LaunchShape(grid=(spec.max_tokens, 1, 1), block=(64, 1, 1))

    def arguments(self, spec: Spec) -> tuple[Argument, ...]:
        w, s = spec.topk_width, deepseek_v4.SWA_WINDOW
        return (
            Argument("swa_indices", "tensor", "int32", f"[M, {s}] global SWA slots, -1 padded"),
            Argument("swa_lens", "tensor", "int32", "[M] SWA window lengths"),
            Argument("token_req", "tensor", "int32", "[M] request of each token (CSA)"),
            Argument("topk", "tensor", "int32", f"[M, {w}] compressed top-k, -1 padded"),
            Argument("block_table", "tensor", "int32", "[R * stride] compressed block table (CSA)"),
            Argument("slots", "tensor", "int32", f"[M, {w + s}] out: key slots"),
            Argument("lens", "tensor", "int32", "[M] out: keys per row"),
            Argument("m", "i32", "int32", "rows this step (1..max_tokens)"),
            Argument("block_table_stride", "i32", "int32", "elements per block-table row (CSA)"),
            Argument("entries_per_page", "i32", "int32", "compressed entries per page (CSA: block_size / 4)"),
        )
