"""One forward step as vLLM's hook passes it: the call's tensors checked against what the kernels
read (`HookCall.check`), and the flat views the kernels take of vLLM's tables, weights and KV
caches. The twin of weights.py, which does the same for a layer's weights; runner.py maps these
to the kernels' arguments."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .. import deepseek_v4
from ..deepseek_v4 import STREAMS
from ..templates.geometry import KV_RECORD
from ..templates.k2.attention_addressing import RECORD_CHUNK
from ..templates.k2.moe_layout import TOPK
from .weights import MonoLayerWeights

MAX_TOKENS = deepseek_v4.MAX_DECODE_TOKENS
H = deepseek_v4.HIDDEN


@dataclass
class HookCall:
    """One `forward` call's arguments, as vLLM's hook passes them (`mono_decode.py:402-423`)."""

    w: MonoLayerWeights
    x: torch.Tensor
    residual: torch.Tensor
    post_mix: torch.Tensor
    res_mix: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    swa_cache: torch.Tensor
    swa_indices: torch.Tensor
    swa_lens: torch.Tensor
    token_to_req: torch.Tensor
    topk_indices: torch.Tensor
    comp_cache: torch.Tensor
    select: Callable[[torch.Tensor, torch.Tensor], None]
    comp_block_table: torch.Tensor | None
    fold: bool
    route_ids: torch.Tensor | None
    topk: int
    global_keys: bool

    @property
    def rows(self) -> int:
        return self.x.shape[0]

    @property
    def ratio(self) -> int:
        return self.w.attn.ratio

    def check(self, hca_width: int) -> None:
        """The hook's tensors as the kernels read them; a ValueError names the first that is not."""
        m = self.rows
        if not 1 <= m <= MAX_TOKENS:
            raise ValueError(f"a step of {m} rows: expected 1 to {MAX_TOKENS}")
        tensors: list[tuple[str, torch.Tensor, torch.dtype, tuple[int, ...]]] = [
            ("residual", self.residual, torch.bfloat16, (m, STREAMS, H))]
        if self.fold:
            tensors += [("x", self.x, torch.bfloat16, (m, H)),
                        ("post_mix", self.post_mix, torch.float32, (m, STREAMS, 1)),
                        ("res_mix", self.res_mix, torch.float32, (m, STREAMS, STREAMS))]
        for name, tensor, dtype, shape in tensors:
            if tensor.dtype != dtype or tuple(tensor.shape) != shape or not tensor.is_contiguous():
                raise ValueError(f"{name}: {tuple(tensor.shape)} {tensor.dtype}; expected contiguous {shape} {dtype}")
        for name, tensor in (("positions", self.positions), ("slot_mapping", self.slot_mapping)):
            if tensor.dtype != torch.int64 or tensor.dim() != 1 or tensor.shape[0] < m or not tensor.is_contiguous():
                raise ValueError(f"{name}: {tuple(tensor.shape)} {tensor.dtype}; expected contiguous int64 [>= {m}]")
        for name, cache in (("swa_cache", self.swa_cache), ("comp_cache", self.comp_cache)):
            if cache.dtype != torch.uint8 or cache.dim() != 3 or cache.shape[2] != KV_RECORD or \
                    cache.stride()[1:] != (KV_RECORD, 1):
                raise ValueError(f"{name}: {tuple(cache.shape)} {cache.dtype} strides {cache.stride()}; expected "
                                 f"uint8 [pages, block, {KV_RECORD}] with rows {KV_RECORD} bytes apart")
            if cache.stride(0) % RECORD_CHUNK:  # a record's chunks would straddle others' bytes, unnoticed
                raise ValueError(f"{name}: page stride {cache.stride(0)} bytes; expected a multiple of {RECORD_CHUNK} "
                                 f"(K2 reads the records as {RECORD_CHUNK}-byte chunks of the cache)")
        self._check_tables(m, hca_width)

    def _check_tables(self, m: int, hca_width: int) -> None:
        """The step's int32 tables: rows of `width` values `stride` apart, at least `rows` of them."""
        hca = self.ratio == deepseek_v4.HCA_RATIO
        if self.global_keys != hca:
            raise ValueError(f"global_keys={self.global_keys} on a layer of compress ratio {self.ratio}: "
                             "expected global slots exactly on HCA (ratio 128) layers")
        tables = [("swa_indices", self.swa_indices, m, deepseek_v4.SWA_WINDOW, deepseek_v4.SWA_WINDOW),
                  ("swa_lens", self.swa_lens, m, 1, 1), ("token_to_req", self.token_to_req, m, 1, 1)]
        if hca:
            topk = self.topk_indices
            if topk.dtype != torch.int32 or topk.dim() != 2 or topk.shape[0] > m or topk.shape[1] > hca_width or \
                    topk.stride(1) != 1:
                raise ValueError(f"topk_indices: {tuple(topk.shape)} {topk.dtype} strides {topk.stride()}; expected "
                                 f"int32 HCA slots [<= {m}, <= {hca_width}] with unit column stride")
        else:
            bt = self.comp_block_table
            if bt is None or bt.dim() != 2:
                raise ValueError("comp_block_table: a CSA layer needs its [requests, pages] int32 block table")
            tables += [("topk_indices", self.topk_indices, m, deepseek_v4.CSA_INDEX_TOPK, deepseek_v4.CSA_INDEX_TOPK),
                       ("comp_block_table", bt, 1, bt.shape[1], bt.stride(0))]
        if self.route_ids is not None:
            tables.append(("route_ids", self.route_ids, m, TOPK, TOPK))
        for name, t, rows, width, stride in tables:
            inner = t.reshape(t.shape[0], -1) if t.dim() > 1 else t[:, None]
            if t.dtype != torch.int32 or t.shape[0] < rows or inner.shape[1] != width or \
                    (t.dim() > 1 and (t.stride(0) != stride or t.stride(-1) != 1)):
                raise ValueError(f"{name}: {tuple(t.shape)} {t.dtype} strides {t.stride()}; expected int32 rows of "
                                 f"{width}, {stride} apart, at least {rows} of them")


def flat_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """The first `rows` rows of a row-major table (vLLM's persistent buffers, taller than the step;
    rows t.stride(0) elements apart) as one flat view, from the first row's start to the last
    row's end."""
    return torch.as_strided(t, ((rows - 1) * t.stride(0) + t.shape[-1],), (1,))


def padded_rows(weight: torch.Tensor) -> torch.Tensor:
    """A row-padded e4m3 weight [N, K] (rows `stride` bytes apart) as the flat bytes of its N
    whole rows, padding included: the kernel reads row n at n x stride."""
    n, stride = weight.shape[0], weight.stride(0)
    if weight.untyped_storage().nbytes() < (weight.storage_offset() + n * stride) * weight.element_size():
        raise ValueError(f"a weight of {n} rows {stride} apart whose storage ends inside its last row's padding")
    return torch.as_strided(weight, (n * stride,), (1,)).view(torch.uint8)


def pages(cache: torch.Tensor) -> torch.Tensor:
    """vLLM's [pages, block, 584] record view of a KV cache as the flat bytes the pages span
    (page p at p x page stride: its block's data rows, then their scale bytes)."""
    count, block, _ = cache.shape
    return torch.as_strided(cache, ((count - 1) * cache.stride(0) + block * KV_RECORD,), (1,))
