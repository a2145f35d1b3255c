"""The end-to-end test's world, shared by the rank processes (e2e_rank.py) and the checking test
(test_e2e_layer.py): the layers' checkpoints, the decode steps' plans and the KV caches' contents.
Pure torch and tests/support/layer_math.py; nothing here imports vLLM or mono_jit's runtime.

Five layers, V4-Pro's first five kinds (cpu_vllm.LAYER_KINDS): 0 HCA with hash routing and no
fold (the first layer), 1 HCA hash, 2 CSA hash, 3 HCA, 4 CSA. Their big weights (wqkv, wq_b, wo_a,
wo_b, the experts) are one random checkpoint's, shared to keep 8 processes inside the machine's
memory; each layer has its own seams, norms, sink and router gate, so a runner that read one
layer's table for another would show in every output.

Steps: three decode steps of the five layers, each request one token a step. Request r owns SWA
pages 2r, 2r + 1 (64 tokens a page: the window's 128 tokens wrap over the two) and compressed
pages 2r, 2r + 1; its context grows by one token a step. Step 1 is a FULL graph of 4 rows with 3
requests: row 3 is graph padding (slot -1, garbage metadata). Caches start filled with random
records (every slot a valid fp8_ds_mla record), the same on every rank.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from layer_math import (CheckpointLayer, encode_records, insert_records, random_checkpoint_layer,
                        route_table)

from mono_jit import deepseek_v4

H = deepseek_v4.HIDDEN
LAYERS = {0: (128, True), 1: (128, True), 2: (4, True), 3: (128, False), 4: (4, False)}  # ratio, hash
SEED = 15
VOCAB = 1024
SWA_PAGE = 64  # tokens a SWA page
KV_BLOCK = 256  # tokens a compressed KV block (vLLM's block size)
CACHE_PAGES = 8
ROWS_CAP = 128  # vLLM's persistent buffers' height (max_num_batched_tokens)
HCA_WIDTH = 8192  # the HCA key table's width at a 1M context
ACTIVE = 128  # vLLM's active HCA width for contexts under 16K tokens
INDEX_TOPK = 1024
INDEX_KEEP = 48  # keys the test's indexer keeps a row (vLLM's keeps up to 1024)


@dataclass(frozen=True)
class StepPlan:
    rows: int  # M, the graph's padded size
    requests: int  # live rows (the first ones)
    mode: str  # vLLM's CUDA-graph runtime mode
    first_len: int  # request 0's context length after this step's token; request r's is first_len + 37 r

    def seq_len(self, r: int) -> int:
        return self.first_len + 37 * r


STEPS = (StepPlan(1, 1, "NONE", 300), StepPlan(4, 3, "FULL", 301), StepPlan(2, 2, "FULL", 302))


def base_checkpoint() -> CheckpointLayer:
    return random_checkpoint_layer(0, deepseek_v4.CSA_RATIO, False, SEED)


def layer_checkpoint(base: CheckpointLayer, layer: int) -> CheckpointLayer:
    """Layer `layer`'s checkpoint: the base's big weights, its own seams, norms, sink and gate."""
    ratio, hashed = LAYERS[layer]
    g = torch.Generator().manual_seed(SEED * 100 + layer)

    def mhc() -> dict[str, torch.Tensor]:
        return dict(fn=torch.randn(24, 4 * H, generator=g) * 0.01, base=torch.randn(24, generator=g) * 0.1,
                    scale=torch.rand(3, generator=g) + 0.5, norm=(1 + 0.1 * torch.randn(H, generator=g)).bfloat16())

    attn, ffn = mhc(), mhc()
    gate = (base.moe.gate.float() * (1 + 0.2 * torch.randn(base.moe.gate.shape[0], 1, generator=g))).bfloat16()
    return dataclasses.replace(
        base, layer_id=layer, ratio=ratio, hash_layer=hashed,
        hc_attn_fn=attn["fn"], hc_attn_base=attn["base"], hc_attn_scale=attn["scale"], attn_norm=attn["norm"],
        hc_ffn_fn=ffn["fn"], hc_ffn_base=ffn["base"], hc_ffn_scale=ffn["scale"], ffn_norm=ffn["norm"],
        attn_sink=torch.randn(base.attn_sink.shape[0], generator=g) + 4.0,
        moe=dataclasses.replace(base.moe, gate=gate))


def routes(ckpt: CheckpointLayer) -> torch.Tensor:
    """A hash layer's tid2eid [VOCAB, 6]."""
    return route_table(ckpt, VOCAB, seed=ckpt.layer_id)


# -- caches and step metadata ---------------------------------------------------------------------

def fill_cache(flat: torch.Tensor, page_stride: int, block: int, seed: int) -> None:
    """Every slot of a flat paged cache: a valid record of a random bf16 key (page tails as they are)."""
    g = torch.Generator().manual_seed(seed)
    slots = CACHE_PAGES * block
    kv = (torch.randn(slots, 512, generator=g) * 0.5).bfloat16()
    insert_records(flat, encode_records(kv), torch.arange(slots), page_stride, block)


def swa_slot(r: int, token: int) -> int:
    """The SWA slot of request r's token at position `token` (its two pages as a ring)."""
    return (2 * r + (token // SWA_PAGE) % 2) * SWA_PAGE + token % SWA_PAGE


def swa_window(r: int, position: int) -> list[int]:
    return [swa_slot(r, t) for t in range(max(0, position - deepseek_v4.SWA_WINDOW + 1), position + 1)]


def comp_block_table(requests: int) -> torch.Tensor:
    """[requests, 2] compressed pages of each request."""
    return torch.tensor([[2 * r, 2 * r + 1] for r in range(requests)], dtype=torch.int32)


def hca_slots(r: int, entries: int) -> list[int]:
    """Request r's compressed HCA entries as global slots (2 records a page)."""
    per_page = KV_BLOCK // deepseek_v4.HCA_RATIO
    return [(2 * r + i // per_page) * per_page + i % per_page for i in range(entries)]


def indexer_topk(qr: torch.Tensor, entries: int, layer: int) -> torch.Tensor:
    """The test's stand-in for vLLM's indexer (it cannot run on a CPU): up to INDEX_KEEP of the
    row's `entries` compressed entries, by a seeded projection of K1's qr, ascending, -1 after."""
    g = torch.Generator().manual_seed(SEED * 1000 + layer)
    proj = torch.randn(qr.shape[0], 4096, generator=g)
    scores = qr.float() @ proj[:, :entries]
    keep = min(entries, INDEX_KEEP)
    row = torch.full((INDEX_TOPK,), -1, dtype=torch.int32)
    row[:keep] = scores.topk(keep).indices.sort().values.int()
    return row
