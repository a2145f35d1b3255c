"""Run vLLM 0.33's K1 code object (tests/vllm/upstream_mono.py builds it) on an emulated gfx950 the way
vLLM's mono/runner.py launches it, and hold its outputs against tests/support/layer_math.py's formulation of
the same math (`attention_seam`, `qkv_norms`, `query`).

`K1Buffers` allocates what `MonoRunner.forward` passes K1 for one step of TP rank 0, sized by
vLLM's own constants (imported, not copied): the step's inputs and the rank's weights from
layer_math (`random_checkpoint_layer`, `random_step`, the loaded layouts of `front_tensors`), the
runner's own rows (MAX_TOKENS of them) filled with a sentinel so a stray or missing write shows,
and zeroed scratch and epoch words. `launch` passes every argument as the runner does, an Int64
device address (the registered CPU tensor's `data_ptr`) or byte stride, or an Int32. Needs the
plug-in folder on sys.path (vLLM's mono package imports AITER's helpers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import layer_math as lm
import torch
from upstream_mono import upstream_parameters, vllm_mono_dir

from mono_jit.spec import Spec

SENTINEL = 0x7F  # bytes of the runner's output rows before the launch: bf16 / f32 NaN patterns
TP, RANK = 8, 0
HEADS = lm.HEADS // TP
# Relative norm error bounds against layer_math (live rows), each stage from the kernel's own input
# to it (`expected`). Both sides round at the same points, so they differ where a summation order
# moves an f32 value by ulps: the seam's mixes stay f32 (post / comb / pre: 1e-4, 20 Sinkhorn
# rounds of f32 ulps; measured up to 4e-6); a bf16 store flips an ulp (2^-8 relative at most) in a
# few elements (r, normed from the step; qr from the kernel's normed, q from its qr: 1e-3, as
# layer_math.BOUNDS).
BOUNDS = {"r": 1e-3, "post": 1e-4, "comb": 1e-4, "pre": 1e-4, "normed": 1e-3, "qr": 1e-3, "q": 1e-3}
EXPECTED_NOTE = "qr and the records from the kernel's normed, q from its qr"


@dataclass
class K1Buffers:
    """One step's K1 arguments for rank 0: `values` by upstream's parameter name (tensors, or ints
    for strides and Int32s), `weights` the read-only ones among them."""

    step: lm.LayerStep
    values: dict[str, Any]
    weights: set[str]


def k1_buffers(ckpt: lm.CheckpointLayer, step: lm.LayerStep, rank: int = RANK, topk: int = 0) -> K1Buffers:
    """The arguments `MonoRunner.forward` gives K1 (vllm/.../mono/runner.py) on TP rank `rank`,
    for `step`'s rows, of a build whose key table is `topk` wide (0: the CSA top-k). An HCA step
    (no block table) passes the runner's 4-word dummy where the block table was and the top-k
    table's row stride where its stride was, and a token-to-request table of zeros (vLLM's
    metadata always has one; an HCA build does not read it); the key table and scratch are sized
    for `topk`."""
    from vllm.models.deepseek_v4.amd.mono.dims import HC, HEAD_DIM, HIDDEN, INDEX_TOPK, MAX_TOKENS, Q_RANK, Dims
    from vllm.models.deepseek_v4.amd.mono.layer import EPOCH_WORDS, scratch_bytes

    m = step.residual.shape[0]
    w = lm.front_tensors(ckpt, rank, TP)
    rows = MAX_TOKENS
    hca = step.block_table is None
    block_table = torch.zeros(4, dtype=torch.int32) if hca else step.block_table

    def out(*shape: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.full(shape, SENTINEL, dtype=torch.uint8).view(dtype)

    weights = dict(hc_fn=w["hc_attn_fn"], hc_scale=w["hc_attn_scale"], hc_base=w["hc_attn_base"],
                   attn_w=w["attn_norm"], wqkv=w["wqkv"], wqkv_s=w["wqkv_scale"], qn_w=w["q_norm"],
                   kvn_w=w["kv_norm"], wqb=w["wq_b"], wqb_s=w["wq_b_scale"], cos_sin=w["cos_sin"])
    inputs = dict(res_in=step.residual, pend=step.x, post_in=step.post_mix, comb_in=step.res_mix,
                  pre_in=torch.zeros(4, dtype=torch.int32), pos=step.positions, slot=step.slot_mapping,
                  swa_idx=step.swa_indices, swa_lens=step.swa_lens, comp_bt=block_table,
                  topk=step.topk, t2r=torch.zeros(m, dtype=torch.int32) if step.token_req is None else step.token_req)
    outputs = dict(res_out=out(rows, HC, HIDDEN * 2, dtype=torch.bfloat16),
                   post_out=out(rows, HC * 4, dtype=torch.float32), comb_out=out(rows, HC, HC * 4, dtype=torch.float32),
                   pre_out=out(rows, HC * 4, dtype=torch.float32),
                   q=out(rows, Dims(TP).heads, HEAD_DIM * 2, dtype=torch.bfloat16),
                   normed_out=out(rows, HIDDEN * 2, dtype=torch.bfloat16),
                   qr_out=out(rows, Q_RANK * 2, dtype=torch.bfloat16),
                   swa=step.swa_cache.clone(),
                   kt=torch.zeros(rows * Dims(TP, max(topk, INDEX_TOPK)).keys, dtype=torch.int32),
                   klen=torch.zeros(2 * rows, dtype=torch.int32),
                   scratch=torch.zeros(scratch_bytes(m, TP, topk), dtype=torch.uint8),
                   epoch=torch.zeros(EPOCH_WORDS, dtype=torch.int32))
    scalars = dict(swa_stride=step.swa_page_stride, swa_block=step.swa_block, comp_block=step.comp_block,
                   bt_stride=(step.topk if hca else block_table).stride(0), tl=0)
    values = {**weights, **inputs, **outputs, **scalars}
    assert set(values) == {n for n, _ in upstream_parameters(vllm_mono_dir() / "layer.py", "k1")}
    return K1Buffers(step, values, set(weights) | set(inputs))


def launch(template: Any, entry: Any, buffers: K1Buffers, weak: Any = None) -> Any:
    """K1's cache entry on a fresh emulated device through mono-jit's emulator backend, every
    tensor registered (the weights and inputs read-only) and passed as its address, as the runner
    passes it (`runtime/kernargs.pack` places the Int64s and Int32s); the LaunchReport. `weak`: the
    emulator's WeakMemory options (None: sequentially consistent memory)."""
    from mono_jit.emulator import Machine
    from mono_jit.runtime.backends import EmulatorBackend

    machine = Machine()
    machine.weak_memory = weak
    values = {}
    for name, value in buffers.values.items():
        if isinstance(value, torch.Tensor):
            machine.register(value, name, writable=name not in buffers.weights)
            value = value.data_ptr()
        values[name] = value
    backend = EmulatorBackend(machine)
    spec = Spec.from_dict(entry.meta.build_spec)
    backend.launch(backend.load(template, spec, entry.meta, entry.hsaco), values, 0)
    return backend.last_report


def outputs(buffers: K1Buffers) -> dict[str, torch.Tensor]:
    """K1's outputs of the step's rows, named as `expected`'s, in its shapes."""
    v, m = buffers.values, buffers.step.residual.shape[0]
    return dict(r=v["res_out"][:m], post=v["post_out"][:m].view(m, 4, 1), comb=v["comb_out"][:m],
                pre=v["pre_out"][:m], normed=v["normed_out"][:m], qr=v["qr_out"][:m], q=v["q"][:m])


def rope_heads(q: torch.Tensor, cos_sin: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Each head's GPT-J RoPE of dims 448.. (f32, then bf16), no head norm: K1's q (vLLM's K2
    scales each head's scores by its RMS norm)."""
    m, heads, d = q.shape
    return lm.kv_rope(q.reshape(m * heads, d), cos_sin, positions.repeat_interleave(heads)).view(m, heads, d)


def expected(ckpt: lm.CheckpointLayer, step: lm.LayerStep, got: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """layer_math's K1 outputs, each stage from the kernel's own input to it: the seam from the
    step, qr and the KV records from the kernel's normed, q from its qr. A bf16 ulp that a
    summation order flips upstream of a stage (one normed element in 600 flips, and then 40% of
    qr) thus stays out of the stages after it."""
    qr, kv = lm.qkv_norms(got["normed"], ckpt)
    q = lm.query(got["qr"], ckpt, slice(0, HEADS))
    return {**lm.attention_seam(step, ckpt), "qr": qr, "q": rope_heads(q, ckpt.cos_sin, step.positions),
            "records": lm.encode_records(lm.kv_rope(kv, ckpt.cos_sin, step.positions))}


def errors(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> dict[str, dict[str, float]]:
    """Per output: max and mean absolute error and the relative norm error (over every element)."""
    table = {}
    for name, g in got.items():
        diff = (g.double() - want[name].double()).abs()
        table[name] = {"max": float(diff.max()), "mean": float(diff.mean()),
                       "rel": float(diff.norm() / want[name].double().norm())}
    return table
