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
K1's normed input and qr), then K2 (the attention to the MoE's all-reduce). K2 reads the layer's
weights and the runner's buffers through address tables (tables.py): a layer's is made at its
first call (an eager step: vLLM warms every graph size up before it captures), and one state
table per output set at construction. The outputs live in two runner-owned sets; a layer writes
the set that does not hold its inputs (the previous layer's outputs), so a step allocates
nothing and a graph's replays read and write the buffers its capture saw. A runner built
without K2 (`templates=("k1",)`, for tests of the front half) runs K1 and `select`, then
declines the layer to vLLM's path. The call's tensors are checked and viewed as the kernels read
them by step.py; this module maps them to the kernels' arguments.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Iterable

import torch

from .. import deepseek_v4
from ..config import Settings
from ..pipeline.deployment import LAYER_TEMPLATES
from ..errors import CaptureError
from ..pipeline.resolve import capturing
from ..spec import STANDARD_MAX_TOKENS, bucket_for
from ..deepseek_v4 import HEAD_DIM, Q_LORA, STREAMS
from ..templates import get
from ..templates.geometry import CTAS, PEERS
from ..templates.k2.attention_layout import STATE_TABLE, WEIGHT_TABLE
from .agree import agree
from .backends import Backend, Kernel, backend as make_backend
from .grid import GridEntry, layer_grid, load_grid
from .host_memory import HostSharedMemory, host_tensor
from .peer import DeviceBuffer, exchange
from .step import HookCall, flat_rows, padded_rows, pages
from .tables import Entry, addresses, state_entries, weight_entries
from .weights import MonoLayerWeights

log = logging.getLogger("mono_jit.runtime")

BLOCKS = CTAS  # CTAs of a persistent launch: every one resident, one per CU (vLLM's CU gate)
H = deepseek_v4.HIDDEN


class _Declined(tuple):
    """What `forward` returns to send a layer down vLLM's own path: vLLM's hook returns
    `forward(...)[:4]`, and this object's slices are None."""

    def __getitem__(self, item: Any) -> Any:
        return None


DECLINED = _Declined()


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
        self.hca_width = max_topk or deepseek_v4.CSA_INDEX_TOPK
        self.kernels: dict[GridEntry, Kernel] = {}
        self.buffers: dict[GridEntry, dict[str, Any]] = {}
        self._launches: dict[tuple[str, int, int], GridEntry] = {}
        self._layer_tables: dict[int, tuple[MonoLayerWeights, torch.Tensor]] = {}
        self.peer_memory: Any = None
        self._peer_views: list[torch.Tensor] = []
        why = ""
        try:
            self.backend = backend or make_backend(self.settings.backend)
            grid = layer_grid(tp, self.hca_width, self.templates, self.buckets)
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
        if self.declined is None:  # every rank is here: the exchanges are collective
            self.declined = self._exchange_peers(group)
        if self.declined is None:
            log.info("mono-jit runner ready on rank %d: %d kernels (%s backend)", rank, len(self.kernels),
                     self.backend.name)
        else:
            log.warning("mono-jit: every rank keeps vLLM's original path (%s)", self.declined)
            self.kernels, self.buffers, self._launches = {}, {}, {}

    # -- state -------------------------------------------------------------------------
    def _allocate(self) -> None:
        """Each build's buffers (zeroed; scratch shared by a template's builds, peer buffers
        later), K1's outputs, K2's two output sets and their state tables, at the widest bucket."""
        scratch: dict[tuple[str, str], torch.Tensor] = {}
        for build in self.kernels:
            declared = [b for b in get(build.template).work_buffers(build.spec) if not b.peers]
            for b in declared:
                if not b.zeroed_once:
                    key = (build.template, b.name)
                    if key not in scratch or scratch[key].numel() < b.elements:
                        scratch[key] = self._zeros(b.elements, getattr(torch, b.dtype))
            self.buffers[build] = {
                b.name: scratch[(build.template, b.name)][:b.elements] if not b.zeroed_once
                else self._zeros(b.elements, getattr(torch, b.dtype)) for b in declared}
        rows, heads = max(self.buckets), deepseek_v4.per_rank(self.tp).heads
        bf16, i32 = torch.bfloat16, torch.int32
        empty = self._empty
        self.front_out = {"r_out": empty(rows, STREAMS, H, dtype=bf16), "post_out": empty(rows, STREAMS),
                          "comb_out": empty(rows, STREAMS, STREAMS), "x_norm": empty(rows, H, dtype=bf16),
                          "qr_out": empty(rows, Q_LORA, dtype=bf16), "q_out": empty(rows, heads, HEAD_DIM, dtype=bf16)}
        self.unread = {"bfloat16": empty(0, dtype=bf16), "float32": empty(0), "int32": empty(0, dtype=i32)}
        if not any(b.template == "k2" for b in self.kernels):
            return
        self.output_sets = [{"out": empty(rows, H, dtype=bf16), "res_out": empty(rows, STREAMS, H, dtype=bf16),
                             "post_out": empty(rows, STREAMS, 1), "comb_out": empty(rows, STREAMS, STREAMS),
                             "pre_out": empty(rows, STREAMS)} for _ in range(2)]
        self.ffn_norm_out = empty(rows, H, dtype=bf16)
        self.hca_topk = torch.full((rows * self.hca_width,), -1, dtype=i32, device=self.device)
        self.state_tables = [self._reached(STATE_TABLE, state_entries(self.front_out, outputs, self.ffn_norm_out),
                                           f"set{index}", writable=True)
                             for index, outputs in enumerate(self.output_sets)]

    def _empty(self, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.empty(*shape, dtype=dtype, device=self.device)

    def _zeros(self, elements: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(elements, dtype=dtype, device=self.device)

    def _table(self, addresses: list[int]) -> torch.Tensor:
        return torch.tensor(addresses, dtype=torch.int64).to(self.device)

    def _reached(self, order: tuple[str, ...], entries: dict[str, Entry], owner: str, writable: bool) -> torch.Tensor:
        """An address table of `entries` (in `order`), its tensors made reachable by the backend's
        launches (the emulator registers them; HIP and the references need nothing)."""
        for name, entry in entries.items():
            if isinstance(entry, torch.Tensor):
                self.backend.expose(f"{owner}.{name}", entry, writable)
        return self._table(addresses(order, entries))

    def _exchange_peers(self, group: Any) -> str | None:
        """Each build's peer buffers, allocated and exchanged over `group` in grid order (the
        same on every rank), with the table of every rank's address; the reason on every rank
        if one failed. Host shared memory stands for HIP's IPC when the runner is on the CPU."""
        for build in self.kernels:
            for b in get(build.template).work_buffers(build.spec):
                if not b.peers:
                    continue
                dtype = getattr(torch, b.dtype)
                if self.peer_memory is None:  # kept: the mappings live as long as the runner
                    self.peer_memory = HostSharedMemory() if self.device.type == "cpu" else _hip_of(self.backend)
                memory = self.peer_memory
                try:
                    peers, failed = exchange(memory, b.elements * dtype.itemsize, group, self.rank, self.tp)
                except Exception as exc:  # a group that cannot hold the exchange fails it on every rank
                    return f"rank {self.rank}: peer memory: {type(exc).__name__}: {exc}"
                if peers is None:
                    return failed
                local = peers.local.pointer
                self.buffers[build][b.name] = (host_tensor(local, dtype, (b.elements,)) if self.device.type == "cpu"
                                               else DeviceBuffer(local, b.elements, b.dtype))
                if self.device.type == "cpu":  # the peers' buffers are other processes' host memory
                    self._expose_peers(f"{build.template}{build.spec.max_tokens}r{build.spec.ratio}.{b.name}",
                                       peers.addresses, peers.local.elements)
                addresses = peers.addresses + [0] * (PEERS - len(peers.addresses))
                self.buffers[build][b.peers] = self._table(addresses)
        return None

    def _expose_peers(self, name: str, peer_addresses: list[int], nbytes: int) -> None:
        """Every rank's mapping of one peer buffer, reachable by this rank's launches (K2 pushes
        into the peers' and polls its own), written by the other ranks' processes."""
        for peer, address in enumerate(peer_addresses):
            view = host_tensor(address, torch.uint8, (nbytes,))
            self._peer_views.append(view)  # the backend's registration holds the address, not the view
            self.backend.expose(f"{name}[{peer}]", view, writable=True)
        if self.tp > 1:
            self.backend.peers_elsewhere(float(self.settings.peer_wait))  # type: ignore[arg-type]

    def _index(self) -> dict[tuple[str, int, int], GridEntry]:
        """(template, rows, ratio) -> the grid entry a step of that many rows launches, for every
        row count up to the widest bucket: made once, so a step only looks it up."""
        index = {}
        for entry in self.kernels:
            reads_ratio = "ratio" in get(entry.template).spec_fields
            for ratio in (entry.spec.ratio,) if reads_ratio else (deepseek_v4.CSA_RATIO, deepseek_v4.HCA_RATIO):
                for rows in range(1, entry.bucket + 1):
                    if bucket_for(rows, self.buckets) == entry.bucket:
                        index[(entry.template, rows, ratio)] = entry
        return index

    def _entry(self, template: str, rows: int, ratio: int = deepseek_v4.CSA_RATIO) -> GridEntry:
        try:
            return self._launches[(template, rows, ratio)]
        except KeyError:
            raise KeyError(f"{template} for {rows} rows, ratio {ratio}: not in this runner's grid") from None

    def weights_table(self, w: MonoLayerWeights) -> torch.Tensor:
        """The layer's K2 weights table, made at its first call (eager) and kept with its weights."""
        kept = self._layer_tables.get(id(w))
        if kept is not None and kept[0] is w:
            return kept[1]
        if capturing():
            raise CaptureError(f"layer {w.attn.layer_id} first reached mono-jit's runner inside a graph capture: "
                               "its weights table is made at an eager step")
        table = self._reached(WEIGHT_TABLE, weight_entries(w), f"layer{w.attn.layer_id}", writable=False)
        self._layer_tables[id(w)] = (w, table)
        return table

    # -- the layer -------------------------------------------------------------------------
    def forward(self, w: MonoLayerWeights, x: torch.Tensor, residual: torch.Tensor, post_mix: torch.Tensor,
                res_mix: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor, swa_cache: torch.Tensor,
                swa_indices: torch.Tensor, swa_lens: torch.Tensor, token_to_req: torch.Tensor, *,
                topk_indices: torch.Tensor, comp_cache: torch.Tensor, select: Callable, comp_block_table=None,
                outs=None, fold: bool = True, route_ids=None, topk: int = 0, global_keys: bool = False) -> tuple:
        """The layer's (out, res_out, post_out, comb_out, pre_out), or DECLINED. `outs` is not
        read: the outputs are the runner's own (the hook never passes it)."""
        if self.declined is not None:
            return DECLINED
        call = HookCall(w, x, residual, post_mix, res_mix, positions, slot_mapping, swa_cache, swa_indices,
                        swa_lens, token_to_req, topk_indices, comp_cache, select, comp_block_table, fold,
                        route_ids, topk, global_keys)
        call.check(self.hca_width)
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
        """K2 into the output set that does not hold the layer's inputs; the five outputs [M, ...].
        A runner without K2 declines here (vLLM's path computes the layer)."""
        if not hasattr(self, "output_sets"):
            return DECLINED
        m = call.rows
        build = self._entry("k2", m, call.ratio)
        index = self._free_set(call)
        self.backend.launch(self.kernels[build], self.k2_arguments(call, build, index), self._stream())
        o = self.output_sets[index]
        return o["out"][:m], o["res_out"][:m], o["post_out"][:m], o["comb_out"][:m], o["pre_out"][:m]

    def _free_set(self, call: HookCall) -> int:
        held = {t.untyped_storage().data_ptr() for t in (call.x, call.residual, call.post_mix, call.res_mix)}
        for index, outputs in enumerate(self.output_sets):
            if not any(t.untyped_storage().data_ptr() in held for t in outputs.values()):
                return index
        raise RuntimeError("the layer's inputs hold both of the runner's output sets")

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

    def k2_arguments(self, call: HookCall, build: GridEntry, outputs: int) -> dict[str, Any]:
        """K2's arguments (its package docstring) from the hook's tensors, the layer's table and
        output set `outputs`. An HCA row's slots are copied into the runner's table at the build's
        width, -1 past vLLM's active width (its persistent buffer holds older steps' slots there)."""
        m, width = call.rows, build.spec.topk_width
        csa = call.ratio == deepseek_v4.CSA_RATIO
        unread = self.unread["int32"]
        if csa:
            topk = flat_rows(call.topk_indices, m)
            block_table = call.comp_block_table
            if block_table is None:
                raise ValueError("comp_block_table: None at a CSA layer; expected vLLM's block table")
            table, bt_stride = flat_rows(block_table, block_table.shape[0]), block_table.stride(0)
            token_req, per_page = call.token_to_req[:m], call.comp_cache.shape[1]
        else:
            slots = self.hca_topk[: m * width].view(m, width)
            slots.fill_(-1)
            n, active = call.topk_indices.shape
            slots[:n, :active].copy_(call.topk_indices)
            topk, table, bt_stride, token_req, per_page = slots.view(-1), unread, 1, unread, call.comp_cache.shape[1]
        hashed = call.route_ids is not None
        return {
            "positions": call.positions[:m], "slot_mapping": call.slot_mapping[:m],
            "swa_indices": flat_rows(call.swa_indices, m), "swa_lens": call.swa_lens[:m],
            "topk": topk, "token_req": token_req, "block_table": table,
            "swa_cache": pages(call.swa_cache), "comp_cache": pages(call.comp_cache),
            "weights": self.weights_table(call.w), "state": self.state_tables[outputs],
            **self.buffers[build],
            "route_ids": call.route_ids[:m].reshape(-1) if call.route_ids is not None else unread,
            "m": m, "rank": self.rank,
            "swa_page_stride": call.swa_cache.stride(0), "swa_block": call.swa_cache.shape[1],
            "comp_page_stride": call.comp_cache.stride(0), "comp_block": call.comp_cache.shape[1],
            "bt_stride": bt_stride, "per_page": per_page, "use_hash": int(hashed),
            "peer_wait_us": round(self.settings.peer_wait * 1e6),
        }


def _hip_of(backend: Backend) -> Any:
    """The HIP handle of a backend that launches on a GPU (its IPC maps the peers' buffers)."""
    hip = getattr(backend, "hip", None)
    if hip is None:
        raise ValueError(f"the {backend.name} backend has no HIP to map peer memory with")
    return hip
