"""FlyDSL source of the key table (see the package docstring for the contract).

One wave per row. The row is walked in chunks of 64 entries; each lane flags its entry valid,
an inclusive prefix count over the wave gives its output position, and the wave total advances
the running count. SWA entries are valid below swa_len and when >= 0; compressed entries when
>= 0. CSA maps local index i to block_table[req, i // P] * P + i % P with P entries per page
(vLLM's get_compressed_slot_mapping). Positions past the count are filled with -1.
"""


import flydsl.expr as fx
from flydsl.expr import const_expr, range_constexpr

from ... import deepseek_v4
from ...spec import Spec
from ..geometry import WAVE
from . import KeyTableTemplate
from .._dsl import dsl, flat_view, inclusive_count, last_lane, load_scalar, store_scalar
from ..base import Build
from ..launch import template_build

SWA = deepseek_v4.SWA_WINDOW


@dsl
def key_table_row(SwaIdx, SwaLens, TokReq, TopK, BlockTable, out_view, row, out_base, lane, width: int, csa: bool,
                  bt_stride, per_page):
    """One wave: row `row`'s keys to out_view[out_base ..] (SWA window, then the top-k), -1
    after them; returns (keys, SWA keys), the same in every lane. K2's S1 runs this too."""
    swa_view, topk_view = flat_view(SwaIdx), flat_view(TopK)
    swa_len = load_scalar(flat_view(SwaLens), row, fx.Int32)
    count = fx.Int32(0)
    for c in range_constexpr(SWA // WAVE):
        j = c * WAVE + lane
        slot = load_scalar(swa_view, row * SWA + j, fx.Int32)
        valid = (j < swa_len) & (slot >= 0)
        position = inclusive_count(valid.select(1, 0), lane)
        if valid:
            store_scalar(out_view, out_base + count + position - 1, slot, fx.Int32)
        count = count + last_lane(position)
    swa_count = count
    if const_expr(csa):
        table_view = flat_view(BlockTable)
        request = load_scalar(flat_view(TokReq), row, fx.Int32)
    for c in range(0, width // WAVE):
        index = load_scalar(topk_view, row * width + c * WAVE + lane, fx.Int32)
        valid = index >= 0
        if const_expr(csa):
            local = valid.select(index, 0)
            page = load_scalar(table_view, request * bt_stride + local // per_page, fx.Int32)
            slot = page * per_page + local % per_page
        else:
            slot = index
        position = inclusive_count(valid.select(1, 0), lane)
        if valid:
            store_scalar(out_view, out_base + count + position - 1, slot, fx.Int32)
        count = count + last_lane(position)
    for c in range(0, (width + SWA) // WAVE):
        j = c * WAVE + lane
        if j >= count:
            store_scalar(out_view, out_base + j, -1, fx.Int32)
    return count, swa_count


def build(spec: Spec) -> Build:
    width = spec.topk_width
    csa = spec.ratio == deepseek_v4.CSA_RATIO
    row_width = width + SWA

    def keytable_kernel(SwaIndices: fx.Tensor, SwaLens: fx.Tensor, TokenReq: fx.Tensor, TopK: fx.Tensor,
                        BlockTable: fx.Tensor, Slots: fx.Tensor, Lens: fx.Tensor,
                        m: fx.Int32, block_table_stride: fx.Int32, entries_per_page: fx.Int32):
        row = fx.block_idx.x
        lane = fx.thread_idx.x
        if row < m:
            count, _ = key_table_row(SwaIndices, SwaLens, TokenReq, TopK, BlockTable, flat_view(Slots), row,
                                     row * row_width, lane, width, csa, block_table_stride, entries_per_page)
            if lane == 0:
                store_scalar(flat_view(Lens), row, count, fx.Int32)

    return template_build(KeyTableTemplate(), spec, keytable_kernel)
