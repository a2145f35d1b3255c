"""Run vLLM 0.33's K1 then K2 code objects (tests/vllm/upstream_mono.py builds them) on 8 emulated
gfx950s sharing memory, one TP rank each, the way vLLM's mono/runner.py launches a layer's step,
and hold K2's outputs against tests/support/layer_math.py's `decode_layer` of the same step.

K2 reads what K1 leaves (q, the key table `kt` / `klen`, the attention seam's rows, the scratch
and the epoch words), so each rank runs upstream's own K1 first, on the same device and buffers,
as the runner does; the step's top-k is layer_math's (the runner's `select` between the kernels
fills it; here it is the step's given table). Every argument is what `MonoRunner.forward` passes:
an Int64 address of a registered CPU tensor (or a byte stride) or an Int32. The peer buffers are
one `2 * peer_half_bytes(8)` host buffer a rank, zeroed, their addresses in rank order (the
runner's `PeerBuffer.addresses`); `sym` is the rank's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import layer_math as lm
import torch
from upstream_k1_run import SENTINEL, TP, K1Buffers, k1_buffers
from upstream_mono import upstream_parameters, vllm_mono_dir

from mono_jit.cache.meta import EntryMeta
from mono_jit.emulator import CodeObject, Launch, LaunchReport, Machine
from mono_jit.templates.kernargs import pack

LOG2E = 1.4426950408889634


@dataclass
class RankBuffers:
    """One rank's K1 and K2 arguments by upstream's parameter names, and the read-only ones."""

    k1: K1Buffers
    k2: dict[str, Any]
    weights: set[str]


def k2_values(ckpt: lm.CheckpointLayer, step: lm.LayerStep, k1: K1Buffers, rank: int, peers: list[torch.Tensor],
              w: dict[str, Any] | None = None) -> tuple[dict[str, Any], set[str]]:
    """The arguments `MonoRunner.forward` gives K2 on rank `rank` after `k1` (its buffers); `w`
    the rank's layer_math.rank_tensors when the caller holds them (made here otherwise)."""
    from vllm.models.deepseek_v4.amd.mono.dims import HC, HEAD_DIM, HIDDEN

    m = step.residual.shape[0]
    w = w if w is not None else lm.rank_tensors(ckpt, rank, TP)
    v = k1.values

    def out(*shape: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.full(shape, SENTINEL, dtype=torch.uint8).view(dtype)

    qk_scale = torch.tensor([HEAD_DIM ** -0.5 * LOG2E], dtype=torch.float32).view(torch.int32).item()
    weights = dict(sink=w["attn_sink"], cos_sin=w["cos_sin"], woa=w["wo_a"], woa_s=w["wo_a_scale"], wob=w["wo_b"],
                   wob_s=w["wo_b_scale"], hc_fn=w["hc_ffn_fn"], hc_scale=w["hc_ffn_scale"], hc_base=w["hc_ffn_base"],
                   ffn_w=w["ffn_norm"], gate_w=w["gate_w"], bias=w["bias"], w13=w["w13"], w13_s=w["w13_s"],
                   w2=w["w2"], w2_s=w["w2_s"], sgu=w["sgu"], sgu_s=w["sgu_s"], sw2=w["sw2"], sw2_s=w["sw2_s"],
                   zrec=torch.zeros(1024, dtype=torch.uint8))
    from_k1 = dict(q=v["q"], swa=v["swa"], kt=v["kt"], klen=v["klen"], slot=v["slot"], swa_idx=v["swa_idx"],
                   swa_lens=v["swa_lens"], t2r=v["t2r"], topk=v["topk"], comp_bt=v["comp_bt"], pos=v["pos"],
                   res_in=v["res_out"], post_in=v["post_out"], comb_in=v["comb_out"], pre_in=v["pre_in"],
                   comp=step.comp_cache, scratch=v["scratch"], epoch=v["epoch"])
    outputs = dict(res_out=out(m, HC, HIDDEN * 2, dtype=torch.bfloat16), post_out=out(m, HC * 4, dtype=torch.float32),
                   comb_out=out(m, HC, HC * 4, dtype=torch.float32), pre_out=out(m, HC * 4, dtype=torch.float32),
                   out=out(m, HIDDEN * 2, dtype=torch.bfloat16),
                   peers=torch.tensor([p.data_ptr() for p in peers], dtype=torch.int64))
    scalars = dict(swa_stride=step.swa_page_stride, swa_block=step.swa_block, comp_stride=step.comp_page_stride,
                   comp_block=step.comp_block, bt_stride=v["bt_stride"], qk_scale=qk_scale,
                   sym=peers[rank].data_ptr(), rank=rank, tl=0)
    values = {**weights, **from_k1, **outputs, **scalars}
    assert set(values) == {n for n, _ in upstream_parameters(vllm_mono_dir() / "layer.py", "k2")}, set(values)
    return values, set(weights) | {"comp"}


def rank_buffers(ckpt: lm.CheckpointLayer, step: lm.LayerStep, topk: int = 0,
                 tensors: list[dict[str, Any]] | None = None) -> list[RankBuffers]:
    """Every rank's buffers for one step of builds whose key table is `topk` wide (0: the CSA
    top-k; an HCA build's width), the peer buffers shared; `tensors` every rank's
    layer_math.rank_tensors when the caller holds them (to run another kernel on the same)."""
    from vllm.models.deepseek_v4.amd.mono.layer import peer_half_bytes

    peers = [torch.zeros(2 * peer_half_bytes(TP), dtype=torch.uint8) for _ in range(TP)]
    ranks = []
    for rank in range(TP):
        k1 = k1_buffers(ckpt, step, rank, topk)
        k2, weights = k2_values(ckpt, step, k1, rank, peers, tensors[rank] if tensors else None)
        ranks.append(RankBuffers(k1, {**k2, "peer_buffer": peers[rank]}, weights))
    return ranks


def _launch(code: CodeObject, meta: EntryMeta, values: dict[str, Any], device: int) -> Launch:
    args = {n: (t.data_ptr() if isinstance(t, torch.Tensor) else t) for n, t in values.items()
            if n != "peer_buffer"}
    return Launch(code, meta.launch.grid, meta.launch.block, pack(meta, args), 0, device)


def run_layer(k1_entry: Any, k2_entry: Any, ranks: list[RankBuffers],
              timing: Any = None, weak: Any = None) -> tuple[LaunchReport, LaunchReport]:
    """K1 on every rank (together), then K2 on every rank (together), on one 8-device machine
    whose memory holds every rank's tensors (weights and step inputs read-only); `timing` (a
    clock.trace.Clock) records both launches' traces for the clock. `weak`: the emulator's
    WeakMemory options (None: sequentially consistent memory); the peer buffers are then
    uncached, as vLLM's runner allocates them (hipDeviceMallocUncached)."""
    machine = Machine(devices=TP)
    machine.timing = timing
    machine.weak_memory = weak
    for r, buffers in enumerate(ranks):  # K1 and K2 share parameter names (hc_fn, res_out, ...)
        for kernel, values, read_only in (("k1", buffers.k1.values, buffers.k1.weights),
                                          ("k2", buffers.k2, buffers.weights)):
            for name, value in values.items():
                if isinstance(value, torch.Tensor):
                    machine.register_new(value, f"r{r}.{kernel}.{name}", writable=name not in read_only)
        machine.mark_uncached(buffers.k2["peer_buffer"])
    k1_code, k2_code = CodeObject(k1_entry.hsaco), CodeObject(k2_entry.hsaco)
    first = machine.launch_many([_launch(k1_code, k1_entry.meta, b.k1.values, r) for r, b in enumerate(ranks)])
    second = machine.launch_many([_launch(k2_code, k2_entry.meta, b.k2, r) for r, b in enumerate(ranks)])
    return first, second


def outputs(buffers: RankBuffers, m: int) -> dict[str, torch.Tensor]:
    """K2's outputs on one rank, named and shaped as layer_math.LayerExpected's."""
    v = buffers.k2
    return dict(out=v["out"], res_out=v["res_out"], post_out=v["post_out"].view(m, 4, 1), comb_out=v["comb_out"])
