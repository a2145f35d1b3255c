"""Our K2's buffers for one rank of a layer_math step, from the tensors vLLM holds (layer_math's
`rank_tensors`): the weights table the runner makes of them (`runtime.tables.weight_table`),
K1's outputs as layer_math computes them (the attention seam's r / post / comb, the normed and
roped q of the rank's heads, the SWA cache after the step's insert), the work buffers and the
arguments as `MonoRunner.k2_arguments` fills them. So our K2 runs on the same weights and step
as vLLM's own K2 (tests/vllm/upstream_k2_run.py), for side-by-side counts on the emulator.
It has the interface `k2_emulation.register` reads (weight_tensors, state_tensors, step,
arguments())."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

import layer_math as lm
from mono_jit import deepseek_v4
from mono_jit.runtime.tables import weight_table
from mono_jit.runtime.weights import AttnWeights, MonoLayerWeights
from mono_jit.selfcheck.k2_run import PEER_WAIT_US, K2Run
from mono_jit.spec import Spec
from mono_jit.templates.k2.attention_layout import STATE_TABLE
from mono_jit.templates.k2.moe_layout import K2MoeLayout

H = deepseek_v4.HIDDEN
SENTINEL = -3.0  # in the outputs before the launch


def layer_weights(tensors: dict[str, Any]) -> MonoLayerWeights:
    """vLLM's keyword fields (layer_math.rank_tensors) as the runner's MonoLayerWeights."""
    attn = AttnWeights(**{k: tensors[k] for k in lm.ATTN_FIELDS})
    return MonoLayerWeights(attn=attn, **{k: v for k, v in tensors.items() if k not in lm.ATTN_FIELDS})


@dataclass
class FrontOutputs:
    """K1's outputs of a step as layer_math computes them (every head; a rank takes its own)."""

    q: torch.Tensor  # [M, 128, 512] bf16, normed and roped
    r: torch.Tensor  # [M, 4, H] bf16
    post: torch.Tensor  # [M, 4] f32
    comb: torch.Tensor  # [M, 4, 4] f32
    swa_cache: torch.Tensor  # the SWA cache bytes after the step's insert

    @classmethod
    def of(cls, step: lm.LayerStep, ckpt: lm.CheckpointLayer) -> "FrontOutputs":
        seam = lm.attention_seam(step, ckpt)
        qr, kv = lm.qkv_norms(seam["normed"], ckpt)
        swa = step.swa_cache.clone()
        records = lm.encode_records(lm.kv_rope(kv, ckpt.cos_sin, step.positions))
        lm.insert_records(swa, records, step.slot_mapping, step.swa_page_stride, step.swa_block)
        q = lm.q_heads(lm.query(qr, ckpt), ckpt.cos_sin, step.positions)
        return cls(q, seam["r"], seam["post"].reshape(-1, 4), seam["comb"], swa)


class LayerK2Buffers:
    """One rank's buffers of our K2 build `spec` for `step` (M = its rows <= spec.max_tokens);
    `tensors` are the rank's layer_math.rank_tensors, `peers` every rank's mailbox (rank order)."""

    def __init__(self, spec: Spec, step: lm.LayerStep, front: FrontOutputs, tensors: dict[str, Any], rank: int,
                 peers: list[torch.Tensor]):
        self.spec, self.rank, self.m = spec, rank, step.residual.shape[0]
        self.lay = lay = K2MoeLayout.of(spec)
        self.layer = layer = layer_weights(tensors)
        # the runner's state buffers hold its widest bucket's rows
        m, rows, heads = self.m, deepseek_v4.MAX_DECODE_TOKENS, deepseek_v4.HEADS // spec.tp
        csa = spec.ratio == deepseek_v4.CSA_RATIO
        # every tensor the weights table points at, by vLLM's field name (the codes K2 reads too)
        s_oa, s_ob = layer.attn.k2_scales()
        sgu_s, sw2_s = layer.shared_scales()
        self.weight_tensors = {n: t for n, t in tensors.items() if isinstance(t, torch.Tensor)}
        self.weight_tensors.update(wo_a_codes=s_oa, wo_b_codes=s_ob, sgu_codes=sgu_s, sw2_codes=sw2_s)
        self.weights = torch.tensor(weight_table(layer), dtype=torch.int64)

        def rows_of(t: torch.Tensor) -> torch.Tensor:
            out = torch.zeros((rows, *t.shape[1:]), dtype=t.dtype)
            out[:m] = t
            return out.flatten()

        def sentinel(count: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.full((count,), SENTINEL, dtype=dtype)

        q = front.q[:, heads * rank:heads * (rank + 1)].contiguous()
        self.state_tensors = {
            "q": rows_of(q), "residual": rows_of(front.r), "post_in": rows_of(front.post),
            "comb_in": rows_of(front.comb.reshape(m, 16)),
            "r_out": sentinel(rows * 4 * H, torch.bfloat16), "post_out": sentinel(rows * 4),
            "comb_out": sentinel(rows * 16), "pre_out": sentinel(rows * 4),
            "x_norm": sentinel(rows * H, torch.bfloat16), "out": sentinel(rows * H, torch.bfloat16)}
        self.state = torch.tensor([self.state_tensors[n].data_ptr() for n in STATE_TABLE], dtype=torch.int64)
        unread = torch.zeros(4, dtype=torch.int32)
        if csa:
            topk, token_req, block_table = step.topk, step.token_req, step.block_table
            bt_stride = block_table.stride(0)
        else:  # the runner copies an HCA row's slots into its table at the build's width, -1 past them
            topk = torch.full((m, spec.topk_width), -1, dtype=torch.int32)
            topk[:, :step.topk.shape[1]] = step.topk
            token_req, block_table, bt_stride = unread, unread, 1
        self.step = {
            "positions": step.positions.contiguous(), "slot_mapping": step.slot_mapping.contiguous(),
            "swa_indices": step.swa_indices.contiguous().flatten(), "swa_lens": step.swa_lens.contiguous(),
            "topk": topk.contiguous().flatten(), "token_req": token_req.contiguous(),
            "block_table": block_table.contiguous().flatten(), "swa_cache": front.swa_cache,
            "comp_cache": step.comp_cache}
        self.scalars = {
            "m": m, "rank": rank, "swa_page_stride": step.swa_page_stride, "swa_block": step.swa_block,
            "comp_page_stride": step.comp_page_stride, "comp_block": step.comp_block, "bt_stride": bt_stride,
            "per_page": step.comp_block, "use_hash": 0, "peer_wait_us": PEER_WAIT_US}
        self.sync = torch.zeros(lay.sync_words, dtype=torch.int32)
        self.work = torch.zeros(lay.work_words, dtype=torch.float32)
        self.mailbox = peers[rank]
        self.peers = torch.tensor([p.data_ptr() for p in peers], dtype=torch.int64)
        self.route_ids = torch.zeros(m * 6, dtype=torch.int32)

    device_memory = K2Run.device_memory  # the same buffers, by the same names

    def arguments(self) -> dict[str, Any]:
        """The K2 template's argument names -> values, as the runner's k2_arguments gives them."""
        return {**self.step, "weights": self.weights, "state": self.state, "sync": self.sync, "work": self.work,
                "mailbox": self.mailbox, "peers": self.peers, "route_ids": self.route_ids, **self.scalars}

    def out(self) -> torch.Tensor:
        """K2's all-reduced MoE output of the step's rows, [M, H] bf16."""
        return self.state_tensors["out"].view(-1, H)[:self.m]


def mailboxes(spec: Spec, tp: int) -> list[torch.Tensor]:
    """Every rank's zeroed peer buffer of build `spec`."""
    return [torch.zeros(K2MoeLayout.of(spec).peer_bytes // 8, dtype=torch.int64) for _ in range(tp)]
