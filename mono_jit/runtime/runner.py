"""One TP rank's mono runner: vLLM 0.33's `MonoRunner` contract, served from mono-jit's cache.

vLLM's hook (`mono_decode._mono_runner`) builds one runner per rank at the first eligible
decode step, eager (it refuses inside a capture), as
`MonoRunner(tp, rank, tp_group.cpu_group, device, max_topk=hca_width)`, and calls
`forward(w, x, residual, post_mix, res_mix, positions, slot_mapping, swa_cache, swa_indices,
swa_lens, token_to_req, topk_indices=..., comp_cache=..., select=..., comp_block_table=None,
outs=None, fold=..., route_ids=None, topk=0, global_keys=False)` for every eligible layer; it
returns `forward(...)[:4]` as the layer's `(x, residual, post_mix, res_mix)`, and a None there
sends the layer down vLLM's own path (`mono_decode.py:402-423`, `model.py:1098-1108`).

Construction is the rank's one eager moment, so everything happens there: every kernel of the
deployment grid is resolved (a hit loads, a miss compiles once per host unless offline), every
buffer the templates declare is allocated and zeroed, then the ranks agree all-or-none. If any
rank failed, every rank keeps vLLM's path for good: `forward` returns `DECLINED` (whose `[:4]`
is None) and each rank has logged once which rank failed and why. `forward` itself allocates,
compiles and loads nothing, so it is safe inside a graph capture; the construction raises
CaptureError if it ever runs inside one.

The layer is K1, then vLLM's `select` (the compressor and, on CSA layers, the indexer, from
K1's normed input and qr), then K2. K2 is built (attention to the MoE's all-reduce) but this
runner does not launch it yet (its layer tables, state table and peer exchange: issue 15), so a
runner whose grid needs K2 declines at construction, before it loads or runs anything
(Template.serves), and `--monokernel` falls back on every rank today. A runner
built with `templates=("k1",)` runs K1 and `select` and then declines, so vLLM's path computes
the layer: that is how the front half is tested end to end through vLLM's own hook.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

from .. import model
from ..config import Settings
from ..errors import CaptureError
from ..resolve import capturing
from ..spec import STANDARD_MAX_TOKENS, bucket_for
from ..templates import get
from .agree import agree
from .backends import Backend, Kernel, backend as make_backend
from .kernels import LAYER_TEMPLATES, GridEntry, layer_grid, load_grid
from .weights import MonoLayerWeights

log = logging.getLogger("mono_jit.runtime")

BLOCKS = 256  # CTAs of a persistent launch: every one resident, one per CU (vLLM's CU gate)
MAX_TOKENS = model.MAX_DECODE_TOKENS
H, STREAMS, Q_LORA, HEAD_DIM = model.HIDDEN, 4, 1536, 512
RECORD = 584


class NotServable(Exception):
    """A template of the runner's grid cannot finish a layer yet (Template.serves)."""


class _Declined(tuple):
    """What `forward` returns to send a layer down vLLM's own path: vLLM's hook returns
    `forward(...)[:4]`, and this object's slices are None."""

    def __getitem__(self, item: Any) -> Any:
        return None


DECLINED = _Declined()


@dataclass
class HookCall:
    """One `forward` call's arguments, as vLLM's hook passes them (vllm-integration.md §3.5)."""

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

    def check(self) -> None:
        """The hook's tensors as the kernels read them; a ValueError names the first that is not."""
        m = self.rows
        if not 1 <= m <= MAX_TOKENS:
            raise ValueError(f"a step of {m} rows: expected 1 to {MAX_TOKENS}")
        tensors = [("residual", self.residual, torch.bfloat16, (m, STREAMS, H))]
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
        cache = self.swa_cache
        if cache.dtype != torch.uint8 or cache.dim() != 3 or cache.shape[2] != RECORD or \
                cache.stride()[1:] != (RECORD, 1):
            raise ValueError(f"swa_cache: {tuple(cache.shape)} {cache.dtype} strides {cache.stride()}; expected "
                             f"uint8 [pages, block, {RECORD}] with rows {RECORD} bytes apart")


class MonoRunner:
    """The mono decode runner of one TP rank (see the module docstring)."""

    def __init__(self, tp: int, rank: int, group: Any, device: torch.device | str, max_topk: int = 0, *,
                 templates: Iterable[str] = LAYER_TEMPLATES, buckets: Iterable[int] = STANDARD_MAX_TOKENS,
                 settings: Settings | None = None, backend: Backend | None = None) -> None:
        if capturing():
            raise CaptureError("mono-jit's runner was first built inside a graph capture: its kernels and buffers "
                               "are set up at an eager decode step (vLLM warms every graph size up eagerly first)")
        self.tp, self.rank, self.device = tp, rank, torch.device(device)
        self.settings = settings or Settings()
        self.buckets = tuple(sorted(set(buckets)))
        self.templates = tuple(templates)
        self.kernels: dict[GridEntry, Kernel] = {}
        self.buffers: dict[GridEntry, dict[str, torch.Tensor]] = {}
        self._launches: dict[tuple[str, int, int], GridEntry] = {}
        why = ""
        try:
            for name in self.templates:
                if not get(name).serves:
                    raise NotServable(f"template {name!r}: {get(name).not_serving}")
            self.backend = backend or make_backend(self.settings.backend)
            grid = layer_grid(tp, max_topk or model.CSA_INDEX_TOPK, self.templates, self.buckets)
            # HIP loads a module for the calling thread's current device: make it the runner's
            with torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext():
                self.kernels = load_grid(grid, self.backend, self.settings)
            self._allocate()
            self._launches = self._index()
        except CaptureError:
            raise
        except Exception as exc:  # whatever failed, every rank must still reach the agreement
            why = f"{type(exc).__name__}: {exc}"
        self.declined = agree(group, not why, why)
        if self.declined is None:
            log.info("mono-jit runner ready on rank %d: %d kernels (%s backend)", rank, len(self.kernels),
                     self.backend.name)
        else:
            log.warning("mono-jit: every rank keeps vLLM's original path (%s)", self.declined)
            self.kernels, self.buffers, self._launches = {}, {}, {}

    # -- state -------------------------------------------------------------------------
    def _allocate(self) -> None:
        """Each build's work buffers (zeroed), K1's outputs at the widest bucket, and the empties
        that stand for layer 0's unread inputs."""
        for build in self.kernels:
            self.buffers[build] = {
                b.name: torch.zeros(b.elements, dtype=getattr(torch, b.dtype), device=self.device)
                for b in get(build.template).work_buffers(build.spec)}
        rows, heads = max(self.buckets), model.HEADS // self.tp
        bf16, f32 = torch.bfloat16, torch.float32

        def empty(*shape: int, dtype: torch.dtype = f32) -> torch.Tensor:
            return torch.empty(*shape, dtype=dtype, device=self.device)

        self.front_out = {"r_out": empty(rows, STREAMS, H, dtype=bf16), "post_out": empty(rows, STREAMS),
                          "comb_out": empty(rows, STREAMS, STREAMS), "x_norm": empty(rows, H, dtype=bf16),
                          "qr_out": empty(rows, Q_LORA, dtype=bf16), "q_out": empty(rows, heads, HEAD_DIM, dtype=bf16)}
        self.unread = {"bfloat16": empty(0, dtype=bf16), "float32": empty(0)}

    def _index(self) -> dict[tuple[str, int, int], GridEntry]:
        """(template, rows, ratio) -> the grid entry a step of that many rows launches, for every
        row count up to the widest bucket: made once, so a step only looks it up."""
        index = {}
        for entry in self.kernels:
            reads_ratio = "ratio" in get(entry.template).spec_fields
            for ratio in (entry.spec.ratio,) if reads_ratio else (model.CSA_RATIO, model.HCA_RATIO):
                for rows in range(1, entry.bucket + 1):
                    if bucket_for(rows, self.buckets) == entry.bucket:
                        index[(entry.template, rows, ratio)] = entry
        return index

    def _entry(self, template: str, rows: int, ratio: int = model.CSA_RATIO) -> GridEntry:
        try:
            return self._launches[(template, rows, ratio)]
        except KeyError:
            raise KeyError(f"{template} for {rows} rows, ratio {ratio}: not in this runner's grid") from None

    # -- the layer -------------------------------------------------------------------------
    def forward(self, w: MonoLayerWeights, x: torch.Tensor, residual: torch.Tensor, post_mix: torch.Tensor,
                res_mix: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor, swa_cache: torch.Tensor,
                swa_indices: torch.Tensor, swa_lens: torch.Tensor, token_to_req: torch.Tensor, *,
                topk_indices: torch.Tensor, comp_cache: torch.Tensor, select: Callable, comp_block_table=None,
                outs=None, fold: bool = True, route_ids=None, topk: int = 0, global_keys: bool = False) -> tuple:
        """The layer's (out, res_out, post_out, comb_out, pre_out), or DECLINED."""
        if self.declined is not None:
            return DECLINED
        call = HookCall(w, x, residual, post_mix, res_mix, positions, slot_mapping, swa_cache, swa_indices,
                        swa_lens, token_to_req, topk_indices, comp_cache, select, comp_block_table, fold,
                        route_ids, topk, global_keys)
        call.check()
        self.front(call)
        return self.back(call)

    def front(self, call: HookCall) -> dict[str, torch.Tensor]:
        """K1, then vLLM's select on K1's normed input and qr; K1's outputs, [M, ...] each."""
        m = call.rows
        build = self._entry("k1", m)
        self.backend.launch(self.kernels[build], self.k1_arguments(call, build), self._stream())
        outputs = {name: value[:m] for name, value in self.front_out.items()}
        call.select(outputs["x_norm"], outputs["qr_out"])
        return outputs

    def back(self, call: HookCall) -> tuple:
        """K2 and the layer's outputs. K2 is not built yet, so no ready runner has it in its grid:
        the layer goes on in vLLM's path (a runner with K2 in its grid is not ready today)."""
        return DECLINED

    def _stream(self) -> int:
        return torch.cuda.current_stream(self.device).cuda_stream if self.device.type == "cuda" else 0

    def k1_arguments(self, call: HookCall, build: GridEntry) -> dict[str, Any]:
        """K1's arguments (its package docstring) from the hook's tensors and this rank's buffers."""
        m, rows, attn, w = call.rows, build.bucket, call.w.attn, call.w
        s_qkv, s_qb = attn.k1_scales()
        flat = {name: value[:rows].view(-1) for name, value in self.front_out.items()}
        fold = call.fold
        page_stride, block = call.swa_cache.stride(0), call.swa_cache.shape[1]
        return {
            "x": call.x.view(-1) if fold else self.unread["bfloat16"],
            "residual": call.residual.view(-1),
            "post_mix": call.post_mix.view(-1) if fold else self.unread["float32"],
            "res_mix": call.res_mix.view(-1) if fold else self.unread["float32"],
            "hc_fn": w.hc_attn_fn.view(-1), "hc_base": w.hc_attn_base, "hc_scale": w.hc_attn_scale,
            "attn_norm": w.attn_norm,
            "w_qkv": attn.wqkv.view(-1).view(torch.uint8), "s_qkv": s_qkv.view(-1),
            "q_norm": attn.q_norm, "kv_norm": attn.kv_norm,
            "w_qb": padded_rows(attn.wq_b), "s_qb": s_qb.view(-1), "rope": attn.cos_sin.view(-1),
            "positions": call.positions[:m], "slot_mapping": call.slot_mapping[:m],
            "kv_cache": pages(call.swa_cache),
            **flat, **self.buffers[build],
            "m": m, "do_fold": int(fold), "qkv_stride": H, "qkv_shuffled": 1,
            "qb_stride": attn.wq_b.stride(0), "qb_shuffled": 0, "page_stride": page_stride, "block_size": block,
        }


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
    return torch.as_strided(cache, ((count - 1) * cache.stride(0) + block * RECORD,), (1,))
