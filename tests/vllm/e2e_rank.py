"""One TP rank of the end-to-end test (test_e2e_layer.py starts 8 of these): vLLM 0.33's real
decoder layers with `--monokernel`, run through vLLM's own forward and hook into mono-jit's
runner (reference backend), on a real 8-rank gloo TP group.

`python e2e_rank.py RANK PORT OUT` builds the five layers of e2e_world.py with vLLM's real
config, `__init__` and `create()` (the deployment facts a CPU cannot show patched as the other
vLLM tests patch them), puts each layer's random weights where vLLM's loader leaves them (so
vLLM's own `MonoDecodeLayer.weights()` builds the runner's AttnWeights / MonoLayerWeights),
loads vLLM's general plug-ins (mono-jit's finder serves the runner module), then runs the
steps of e2e_world.STEPS through the five layers in vLLM's forward context, as the model loop
threads them. Stood in, because they cannot run on a CPU: vLLM's `select` (its compressor and
indexer call `torch.mm(out_dtype=)`, which CPU torch lacks) by e2e_world's indexer and a
compressor that writes the step's new compressed entry; and the layer's original path, which
must never be taken (AITER's kernels) and fails the run if it is.

After the steps it replays step 1 as a FULL graph's capture would run it: the runner's
allocation, loading and compiling paths raise, and the outputs must be the eager run's, in the
same buffers. It writes OUT/rank<RANK>.pt: every layer's outputs of every step; rank 0 also
every input, the metadata, select's arguments, and the caches around each layer.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "support")]
os.environ["VLLM_TARGET_DEVICE"] = "cpu"
os.environ.setdefault("MONO_JIT_BACKEND", "reference")  # the test sets "emulator" for the code objects

import pytest  # noqa: E402
import torch  # noqa: E402
from cpu_vllm import build_layer, fake_amdsmi, make_vllm_config, no_cuda_event, patch_deployment  # noqa: E402
from e2e_world import (ACTIVE, CACHE_PAGES, HCA_WIDTH, KV_BLOCK, LAYERS, ROWS_CAP, SEED, STEPS, SWA_PAGE,  # noqa: E402
                       VOCAB, StepPlan, base_checkpoint, comp_block_table, fill_cache, hca_slots, indexer_topk,
                       layer_checkpoint, routes, swa_slot, swa_window)
from layer_math import encode_records, insert_records, rank_tensors  # noqa: E402

from mono_jit import deepseek_v4  # noqa: E402
from mono_jit.selfcheck.k2_run import scratch_regions  # noqa: E402
from mono_jit.templates.k2.moe_layout import K2MoeLayout  # noqa: E402

V4_PRO = dict(hidden_size=7168, moe_intermediate_size=3072, num_attention_heads=128, q_lora_rank=1536,
              o_groups=16, o_lora_rank=1024, index_n_heads=64, index_head_dim=128)
GARBAGE = 1 << 20  # pad rows' metadata: a slot no cache holds


def log(rank: int, what: str) -> None:
    print(f"[rank {rank} {time.strftime('%H:%M:%S')}] {what}", file=sys.stderr, flush=True)


def flat(cache: torch.Tensor) -> torch.Tensor:
    """A bound paged cache's bytes, flat (its pages contiguous from the first)."""
    return torch.as_strided(cache, (cache.shape[0] * cache.stride(0),), (1,))


def install(layer, fields: dict, tid2eid: torch.Tensor | None) -> None:
    """One rank's tensors where vLLM's loading and preshuffle leave them, 128 x 128 scale codes
    where vLLM keeps the checkpoint's (its `weights()` expands them with _mx_scales)."""
    def param(t: torch.Tensor) -> torch.nn.Parameter:
        return torch.nn.Parameter(t, requires_grad=False)

    def codes(t: torch.Tensor) -> torch.Tensor:
        return t[::4, ::4].contiguous()

    a, ffn = layer.attn, layer.ffn
    experts, shared = ffn.experts.routed_experts, ffn.shared_experts
    a.fused_wqa_wkv.weight, a._wqa_wkv_scale = param(fields["wqkv"]), codes(fields["wqkv_scale"])
    a.q_norm.weight, a.kv_norm.weight = param(fields["q_norm"]), param(fields["kv_norm"])
    for linear, name, scale in ((a.wq_b, "wq_b", "wq_b_scale"), (a.wo_a, "wo_a", "wo_a_scale"),
                                (shared.down_proj, "sw2", "sw2_s")):
        linear.weight, linear.weight_scale_inv = param(fields[name]), codes(fields[scale])
    a.wo_b.weight, a._wo_b_scale = param(fields["wo_b"]), codes(fields["wo_b_scale"])
    a.attn_sink = param(fields["attn_sink"])
    a.rotary_emb.cos_sin_cache = fields["cos_sin"]
    for name in ("hc_attn_fn", "hc_attn_scale", "hc_attn_base", "hc_ffn_fn", "hc_ffn_scale", "hc_ffn_base"):
        setattr(layer, name, param(fields[name]))
    layer.attn_norm.weight, layer.ffn_norm.weight = param(fields["attn_norm"]), param(fields["ffn_norm"])
    ffn.gate.weight = param(fields["gate_w"])
    ffn.gate.e_score_correction_bias = None if fields["bias"] is None else param(fields["bias"])
    ffn.gate.tid2eid = None if tid2eid is None else param(tid2eid)
    experts.w13_weight, experts.w13_weight_scale = param(fields["w13"]), param(fields["w13_s"])
    experts.w2_weight, experts.w2_weight_scale = param(fields["w2"]), param(fields["w2_s"])
    shared.gate_up_proj.weight, shared._gateup_scale = param(fields["sgu"]), codes(fields["sgu_s"])


def metadata(layer, plan: StepPlan) -> dict:
    """The layer's two attention-metadata dataclasses for the step (vLLM's ROCm classes), filled
    as e2e_world lays the requests out; pad rows' entries are GARBAGE."""
    from vllm.models.deepseek_v4.amd.rocm import (DeepseekV4ROCMAiterMLASparseMetadata,
                                                  DeepseekV4ROCMAiterSparseSWAMetadata)

    n, rows, attn = plan.requests, plan.rows, layer.attn
    i32 = dict(dtype=torch.int32)
    positions = [plan.seq_len(r) - 1 for r in range(n)]
    swa_slots = torch.full((rows,), -1, dtype=torch.int64)
    swa_indices = torch.full((ROWS_CAP, 1, deepseek_v4.SWA_WINDOW), GARBAGE, **i32)
    swa_lens = torch.full((ROWS_CAP,), GARBAGE, **i32)
    token_to_req = torch.full((ROWS_CAP,), GARBAGE, **i32)
    for r, p in enumerate(positions):
        window = swa_window(r, p)
        swa_slots[r], swa_lens[r], token_to_req[r] = swa_slot(r, p), len(window), r
        swa_indices[r, 0, :len(window)] = torch.tensor(window, **i32)
    starts = torch.arange(n + 1, **i32)
    seq_lens = torch.tensor([plan.seq_len(r) for r in range(n)], **i32)
    swa = DeepseekV4ROCMAiterSparseSWAMetadata(
        block_table=comp_block_table(n), slot_mapping=swa_slots, block_size=SWA_PAGE, seq_lens=seq_lens,
        query_start_loc=starts, token_to_req_indices=token_to_req, decode_swa_indices=swa_indices,
        decode_swa_lens=swa_lens, decode_swa_width=deepseek_v4.SWA_WINDOW, num_decodes=n, num_prefills=0,
        num_decode_tokens=n, num_prefill_tokens=0)
    ratio = attn.compress_ratio
    per_page = KV_BLOCK // ratio
    table = comp_block_table(n)
    comp_slots = torch.full((rows,), -1, dtype=torch.int64)
    for r in range(n):
        if plan.seq_len(r) % ratio == 0:  # this token completes a compressed entry
            last = plan.seq_len(r) // ratio - 1
            comp_slots[r] = int(table[r, last // per_page]) * per_page + last % per_page
    hca = {}
    if ratio == deepseek_v4.HCA_RATIO:
        persistent = torch.full((ROWS_CAP, HCA_WIDTH), -1, **i32)
        persistent[:, ACTIVE:ACTIVE + 64] = 3  # an older, longer step's slots, past today's active width
        for r in range(n):
            entries = hca_slots(r, plan.seq_len(r) // ratio)
            persistent[r, :len(entries)] = torch.tensor(entries, **i32)
        hca = dict(c128a_global_decode_topk_indices=persistent[:n, :ACTIVE].view(n, 1, ACTIVE),
                   c128a_decode_topk_lens=torch.tensor([plan.seq_len(r) // ratio for r in range(n)], **i32))
    comp = DeepseekV4ROCMAiterMLASparseMetadata(
        num_reqs=n, max_query_len=1, max_seq_len=int(seq_lens.max()), num_actual_tokens=n, query_start_loc=starts,
        slot_mapping=comp_slots, block_table=table, req_id_per_token=token_to_req, block_size=KV_BLOCK,
        topk_tokens=HCA_WIDTH if ratio == deepseek_v4.HCA_RATIO else deepseek_v4.CSA_INDEX_TOPK, **hca)
    return {attn.swa_cache_layer.prefix: swa, attn.prefix: comp}


class StandIns:
    """vLLM's select (compressor + indexer) stood in, and the original path refused."""

    def __init__(self) -> None:
        self.selected: list[tuple[torch.Tensor, torch.Tensor]] = []

    def select(self, layer, positions, normed, qr) -> None:
        from vllm.forward_context import get_forward_context

        self.selected.append((normed.clone(), qr.clone()))
        attn = layer.attn
        comp = get_forward_context().attn_metadata[attn.prefix]
        live = [r for r in range(normed.shape[0]) if r < comp.num_reqs]
        # the compressor: the entry a row's token completes, from K1's normed row
        slots = comp.slot_mapping
        written = [r for r in live if int(slots[r]) >= 0]
        if written:
            kv = normed[written, :512].float().mul(0.25).bfloat16()
            insert_records(flat(attn.kv_cache), encode_records(kv), slots[written], attn.kv_cache.stride(0),
                           comp.block_size // attn.compress_ratio)
        if attn.indexer is not None:  # the indexer: CSA top-k into the shared buffer
            buffer = attn.topk_indices_buffer
            buffer[:normed.shape[0]] = GARBAGE
            for r in live:
                entries = (int(positions[r]) + 1) // attn.compress_ratio
                buffer[r] = indexer_topk(qr[r], entries, layer_index(layer))


def layer_index(layer) -> int:
    return int(layer.attn.prefix.split(".")[2])  # model.layers.<i>.attn


def original_path(*args, **kwargs):
    raise AssertionError("a layer took vLLM's original path: the runner declined or the hook skipped it")


def run_steps(layers: dict, cfg, stand_ins: StandIns, rank: int, record: bool,
              indices: range = range(len(STEPS)), attention_hand_off: bool = False) -> list[dict]:
    """The steps of STEPS at `indices` through the five layers, as the model loop threads them;
    `record`: the inputs, caches and K2's buffers too; `attention_hand_off`: K2's xo codes."""
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import set_forward_context

    results = []
    for s in indices:
        plan = STEPS[s]
        g = torch.Generator().manual_seed(SEED * 10 + s)
        rows = plan.rows
        embedding = torch.randn(rows, 7168, generator=g).bfloat16().unsqueeze(1).repeat(1, 4, 1)
        input_ids = torch.randint(0, VOCAB, (rows,), generator=g, dtype=torch.int32)
        positions = torch.tensor([plan.seq_len(r) - 1 if r < plan.requests else 0 for r in range(rows)])
        md = {}
        for layer in layers.values():
            md.update(metadata(layer, plan))
        step: dict = {"plan": plan, "input_ids": input_ids, "positions": positions, "layers": {}}
        x, residual, post_mix, res_mix = embedding, None, None, None
        with set_forward_context(md, cfg, num_tokens=rows, cudagraph_runtime_mode=CUDAGraphMode[plan.mode]):
            for index, layer in layers.items():
                attn = layer.attn
                swa_before = flat(attn.swa_cache_layer.kv_cache).clone() if record else None
                stand_ins.selected.clear()
                out = layer(x, positions, input_ids, post_mix=post_mix, res_mix=res_mix, residual=residual)
                entry = {"out": tuple(t.clone() for t in out), "buffers": [t.data_ptr() for t in out]}
                if record:
                    entry.update(inputs=(x.clone(), *(None if t is None else t.clone()
                                                      for t in (residual, post_mix, res_mix))),
                                 swa_before=swa_before, swa_after=flat(attn.swa_cache_layer.kv_cache).clone(),
                                 comp_after=flat(attn.kv_cache).clone(), selected=list(stand_ins.selected),
                                 metadata=snapshot(md, layer, rows), k2_hand_offs=k2_hand_offs(attn, rows))
                if attention_hand_off:
                    entry["xo"] = k2_attention_hand_off(attn, rows)
                step["layers"][index] = entry
                x, residual, post_mix, res_mix = out
        results.append(step)
        log(rank, f"step {s} ({plan.rows} rows, {plan.mode}) done")
    return results


def k2_hand_offs(attn, rows: int) -> dict:
    """What K2 left in the runner's buffers for the layer's step (copies): its FFN seam's x_norm
    and its work buffer (K2MoeLayout's regions: routing, the experts' and shared expert's sums)."""
    from vllm.models.deepseek_v4.amd import mono_decode

    runner = mono_decode._runner
    build = runner._entry("k2", rows, attn.compress_ratio)
    return {"x_norm": runner.ffn_norm_out[:rows].clone(), "work": runner.buffers[build]["work"].clone(),
            "bucket": build.spec.max_tokens}


def k2_attention_hand_off(attn, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's K2 attention hand-off for the layer's step (copies): S3's MXFP8 codes and
    scales of o after the inverse RoPE, from its work buffer (what the checking test feeds
    the reference's wo_a / wo_b to get the y the ranks' kernels summed)."""
    from vllm.models.deepseek_v4.amd import mono_decode

    runner = mono_decode._runner
    build = runner._entry("k2", rows, attn.compress_ratio)
    regions = scratch_regions(K2MoeLayout.of(build.spec), runner.buffers[build]["work"].cpu())
    return regions["xo_codes"][:rows].clone(), regions["xo_scales"][:rows].clone()


def snapshot(md: dict, layer, rows: int) -> dict:
    """What the checking test needs of the layer's metadata and buffers (copies)."""
    attn = layer.attn
    swa, comp = md[attn.swa_cache_layer.prefix], md[attn.prefix]
    topk = (comp.c128a_global_decode_topk_indices[:, 0] if attn.compress_ratio == deepseek_v4.HCA_RATIO
            else attn.topk_indices_buffer[:rows])
    return {"slot_mapping": swa.slot_mapping.clone(), "swa_indices": swa.decode_swa_indices[:rows, 0].clone(),
            "swa_lens": swa.decode_swa_lens[:rows].clone(), "token_req": swa.token_to_req_indices[:rows].clone(),
            "topk": topk.clone(), "block_table": comp.block_table.clone(),
            "swa_page_stride": attn.swa_cache_layer.kv_cache.stride(0), "swa_block": swa.block_size,
            "comp_page_stride": attn.kv_cache.stride(0), "comp_block": comp.block_size // attn.compress_ratio,
            "route_ids": None if layer.ffn.gate.tid2eid is None else layer.ffn.gate.tid2eid.clone()}


def replay_under_capture(layers: dict, cfg, stand_ins: StandIns, md_module, monkeypatch, eager: list[dict],
                         rank: int) -> dict:
    """The last step again, as a FULL capture runs it (the caches hold what they held then):
    nothing the runner allocates, loads or compiles may be reached; the outputs must equal the
    eager step's, in the same buffers, with the same layer tables."""
    from mono_jit.errors import CaptureError
    from mono_jit.runtime import host_memory, runner as runner_module

    runner = md_module._runner

    def forbidden(*args, **kwargs):
        raise CaptureError("allocated, loaded or compiled inside the capture")

    monkeypatch.setattr(runner_module, "capturing", lambda: True)
    for owner, name in ((runner_module.MonoRunner, "_empty"), (runner_module.MonoRunner, "_zeros"),
                        (runner_module.MonoRunner, "_table"), (runner_module, "load_grid"),
                        (host_memory.HostSharedMemory, "malloc_uncached")):
        monkeypatch.setattr(owner, name, forbidden)
    tables = {key: table for key, (_, table) in runner._layer_tables.items()}
    last = len(eager) - 1
    replay = run_steps(layers, cfg, stand_ins, rank, record=False, indices=range(last, last + 1))[0]
    monkeypatch.undo()
    same_tables = tables.keys() == runner._layer_tables.keys() and \
        all(runner._layer_tables[key][1] is table for key, table in tables.items())
    return {"replay": replay, "same_tables": same_tables,
            "same_buffers": all(replay["layers"][i]["buffers"] == eager[last]["layers"][i]["buffers"] for i in layers)}


def main(rank: int, port: int, out: Path) -> None:
    torch.set_num_threads(1)
    mp = pytest.MonkeyPatch()
    sys.modules["amdsmi"] = fake_amdsmi()
    mp.setattr(torch.cuda, "Event", no_cuda_event())
    mp.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    import vllm.plugins
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state as ps
    from vllm.models.deepseek_v4.amd import mono_decode

    vllm.plugins.load_general_plugins()
    with set_current_vllm_config(VllmConfig()):
        ps.init_distributed_environment(world_size=8, rank=rank, local_rank=rank, backend="gloo",
                                        distributed_init_method=f"tcp://127.0.0.1:{port}")
        ps.ensure_model_parallel_initialized(8, 1)
    patch_deployment(mp)
    cfg = make_vllm_config(**V4_PRO)
    layers = {i: build_layer(cfg, i) for i in LAYERS}
    log(rank, "layers built")
    base = base_checkpoint()
    big = rank_tensors(base, rank)
    for index, layer in layers.items():
        ckpt = layer_checkpoint(base, index)
        install(layer, {**big, **own_fields(ckpt, rank)}, routes(ckpt) if ckpt.hash_layer else None)
        attn = layer.attn
        fill_cache(flat(attn.swa_cache_layer.kv_cache), attn.swa_cache_layer.kv_cache.stride(0), SWA_PAGE,
                   SEED + index)
        fill_cache(flat(attn.kv_cache), attn.kv_cache.stride(0), KV_BLOCK // attn.compress_ratio, SEED + 50 + index)
        assert attn.swa_cache_layer.kv_cache.shape[0] == CACHE_PAGES
    del base
    log(rank, "weights installed")
    stand_ins = StandIns()
    mp.setattr(mono_decode, "_select", stand_ins.select)
    for layer in layers.values():
        mp.setattr(layer, "_forward_fused_post_pre", original_path)
        mp.setattr(layer, "_forward_unfused_post_pre", original_path)
    steps = chosen_steps()
    results = run_steps(layers, cfg, stand_ins, rank, record=rank == 0, indices=steps, attention_hand_off=True)
    runner = mono_decode._runner
    replayed = {}
    if os.environ.get("E2E_REPLAY", "1") == "1":
        with pytest.MonkeyPatch.context() as capture:
            replayed = replay_under_capture(layers, cfg, stand_ins, mono_decode, capture, results, rank)
    torch.save({"steps": dict(zip(steps, results)), "runner": type(runner).__module__, "declined": runner.declined,
                "backend": runner.backend.name, **replayed}, out / f"rank{rank}.pt")
    log(rank, "done")
    ps.destroy_model_parallel()
    ps.destroy_distributed_environment()


def chosen_steps() -> range:
    """The steps of STEPS to run: E2E_STEPS of them from the first (the test's choice), else all."""
    return range(int(os.environ.get("E2E_STEPS", len(STEPS))))


def own_fields(ckpt, rank: int) -> dict:
    """The fields a layer has of its own (e2e_world.layer_checkpoint), as rank_tensors gives them."""
    heads = ckpt.attn_sink.shape[0] // 8
    bias = None if ckpt.hash_layer else ckpt.moe.bias
    return dict(layer_id=ckpt.layer_id, ratio=ckpt.ratio, attn_sink=ckpt.attn_sink[heads * rank:heads * (rank + 1)].clone(),
                hc_attn_fn=ckpt.hc_attn_fn, hc_attn_scale=ckpt.hc_attn_scale, hc_attn_base=ckpt.hc_attn_base,
                attn_norm=ckpt.attn_norm, hc_ffn_fn=ckpt.hc_ffn_fn, hc_ffn_scale=ckpt.hc_ffn_scale,
                hc_ffn_base=ckpt.hc_ffn_base, ffn_norm=ckpt.ffn_norm, gate_w=ckpt.moe.gate, bias=bias)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
