"""K2's kernel contract in torch (the package docstring): what the runtime's reference backend
launches in K2's place, on the same arguments the kernel takes.

The kernel reads its weights and the runner's buffers through two address tables (`weights`,
`state`); so does this: each entry is read as the host memory at that address, with the shape
the layout gives it, no copy (a write through it is a write to the runner's buffer). The two
all-reduces go through the peer buffers the way the kernel's do: this rank's bf16 partial is
stored into every other rank's `mailbox` (at the address `peers` gives for it), then an int64
tag (this launch's epoch + 1); the rank waits for the 7 tags in its own buffer and sums the 8
partials in rank order (reference.all_reduce). A rank whose peers never come fails the launch
after POLL_SECONDS, as the kernel's bounded poll traps (the kernel after `peer_wait_us`, which
the reference does not take: its ranks are processes sharing a few CPU cores).

Host memory only: the tables hold raw addresses, which a CPU process can read back as tensors
and a GPU's cannot. On the CPU the peer buffers are shared-memory mappings (runtime/
host_memory.py), so 8 rank processes reduce through them as 8 GPUs through IPC memory.

The reference's own mailbox layout (not the kernel's pairs): two regions (the attention's, the
MoE's), each a slot per sending peer, slot (sender - owner - 1) mod tp: an 8-byte tag, then
max_tokens x 7168 bf16. Two regions suffice: a rank stores its MoE partial of launch e only
after reading every attention partial of e, and its attention partial of e + 1 only after
reading every MoE partial of e, so no slot is overwritten before its owner read it.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import torch

from ... import deepseek_v4
from ...runtime.host_memory import host_tensor
from ...spec import Spec
from ...deepseek_v4 import STREAMS
from ..geometry import WEIGHT_BLOCK
from . import moe_reference as moe
from . import attention_reference as part_one
from .attention_layout import O_LORA, STATE_TABLE, WEIGHT_TABLE
from .moe_layout import TOPK, K2MoeLayout

POLL_SECONDS = 600.0  # ranks are processes sharing a few CPU cores: wide skews are normal
TAG_BYTES = 8
H = deepseek_v4.HIDDEN


class Mailboxes:
    """This rank's all-reduces through the peer buffers (module docstring)."""

    def __init__(self, a: Mapping[str, Any], lay: K2MoeLayout) -> None:
        self.tp, self.rank, self.rows = lay.tp, a["rank"], lay.rows
        self.slot_bytes = TAG_BYTES + self.rows * H * 2
        self.region_bytes = (self.tp - 1) * self.slot_bytes
        have = a["mailbox"].numel() * a["mailbox"].element_size()
        if 2 * self.region_bytes > have:
            raise ValueError(f"K2 reference: a mailbox of {have} bytes, expected at least {2 * self.region_bytes}")
        self.addresses = [int(p) for p in a["peers"][: self.tp].tolist()]
        self.own = a["mailbox"].data_ptr()

    def _slot(self, owner_address: int, region: int, sender: int, owner: int) -> tuple[torch.Tensor, torch.Tensor]:
        at = owner_address + region * self.region_bytes + ((sender - owner - 1) % self.tp) * self.slot_bytes
        return host_tensor(at, torch.int64, (1,)), host_tensor(at + TAG_BYTES, torch.bfloat16, (self.rows, H))

    def all_reduce(self, partial: torch.Tensor, region: int, tag: int) -> torch.Tensor:
        """bf16 [M, H]: the ranks' partials summed in rank order (every rank the same bits)."""
        m = partial.shape[0]
        for owner, address in enumerate(self.addresses):
            if owner != self.rank:
                flag, data = self._slot(address, region, self.rank, owner)
                data[:m].copy_(partial)
                flag[0] = tag  # after the data: x86 keeps stores in order (TSO)
        partials = []
        for sender in range(self.tp):
            if sender == self.rank:
                partials.append(partial)
                continue
            flag, data = self._slot(self.own, region, sender, self.rank)
            deadline = time.monotonic() + POLL_SECONDS
            while int(flag[0]) != tag:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"K2 reference on rank {self.rank}: no partial from rank {sender} after "
                                       f"{POLL_SECONDS:.0f} s")
                time.sleep(0.0005)
            partials.append(data[:m].clone())
        return part_one.all_reduce(partials)


def _weights(t: dict[str, int], lay: K2MoeLayout, positions: torch.Tensor) -> part_one.K2Weights:
    f32, u8 = torch.float32, torch.uint8
    if t["woa_shuffled"] or not t["wob_shuffled"]:
        raise ValueError("K2 reference: wo_a row-major (padded rows) and wo_b preshuffled, as vLLM loads them")
    group_k = lay.heads // lay.groups * 512
    return part_one.K2Weights(
        attn_sink=host_tensor(t["attn_sink"], f32, (lay.heads,)),
        wo_a=host_tensor(t["w_oa"], u8, (lay.groups * O_LORA, t["woa_stride"])),
        s_woa=host_tensor(t["s_oa"], u8, (lay.groups * O_LORA // WEIGHT_BLOCK, group_k // WEIGHT_BLOCK)),
        wo_b=host_tensor(t["w_ob"], u8, (H, t["wob_stride"])),
        s_wob=host_tensor(t["s_ob"], u8, (H // WEIGHT_BLOCK, lay.groups * O_LORA // WEIGHT_BLOCK)),
        rope=host_tensor(t["rope"], f32, (int(positions.max()) + 1, 64)),
        hc_ffn_fn=host_tensor(t["hc_fn"], f32, (24, STREAMS * H)), hc_ffn_base=host_tensor(t["hc_base"], f32, (24,)),
        hc_ffn_scale=host_tensor(t["hc_scale"], f32, (3,)), ffn_norm=host_tensor(t["ffn_norm"], torch.bfloat16, (H,)))


def _moe_weights(t: dict[str, int], lay: K2MoeLayout, use_hash: bool) -> moe.MoeWeights:
    u8, e, i = torch.uint8, deepseek_v4.ROUTED_EXPERTS, lay.inter
    if not t["sgu_shuffled"] or t["sw2_shuffled"]:
        raise ValueError("K2 reference: the shared gate_up preshuffled and down row-major, as vLLM loads them")
    s2 = 2 * i  # the shared expert's share is as wide as a routed one's at TP8 (384)
    sw2 = host_tensor(t["sw2"], u8, (H, t["sw2_stride"]))[:, :i]
    return moe.MoeWeights(
        gate=host_tensor(t["gate"], torch.bfloat16, (e, H)),
        bias=None if use_hash else host_tensor(t["bias"], torch.float32, (e,)),
        w13=host_tensor(t["w13"], u8, (e, 2 * i, H // 2)), w13_s=host_tensor(t["w13_s"], u8, (e * 2 * i, H // 32)),
        w2=host_tensor(t["w2"], u8, (e, H, i // 2)),
        w2_s=host_tensor(t["w2_s"], u8, (e * H, -(-(i // 32) // moe.SCALE_COLUMN_PAD) * moe.SCALE_COLUMN_PAD)),
        sgu=host_tensor(t["sgu"], u8, (s2, t["sgu_stride"])),
        sgu_s=host_tensor(t["sgu_s"], u8, (s2 // WEIGHT_BLOCK, H // WEIGHT_BLOCK)),
        sw2=sw2, sw2_s=host_tensor(t["sw2_s"], u8, (H // WEIGHT_BLOCK, i // WEIGHT_BLOCK)))


def run(a: dict[str, Any], spec: Spec) -> None:
    """K2 on this rank's arguments: part one, its all-reduce, the FFN seam, the MoE and its
    all-reduce; the outputs written through the state table, the epoch advanced."""
    if a["weights"].device.type != "cpu":
        raise ValueError("K2's reference reads its address tables as host memory: CPU tensors only")
    lay, m = K2MoeLayout.of(spec), a["m"]
    t = dict(zip(WEIGHT_TABLE, (int(v) for v in a["weights"].tolist())))
    s = dict(zip(STATE_TABLE, (int(v) for v in a["state"].tolist())))
    bf16, f32 = torch.bfloat16, torch.float32
    positions = a["positions"][:m]
    csa = spec.ratio == deepseek_v4.CSA_RATIO
    x = part_one.K2Inputs(
        q=host_tensor(s["q"], bf16, (m, lay.heads, 512)), positions=positions, slot_mapping=a["slot_mapping"][:m],
        swa_indices=a["swa_indices"].view(-1, deepseek_v4.SWA_WINDOW)[:m], swa_lens=a["swa_lens"][:m],
        topk=a["topk"].view(-1, lay.topk_width)[:m], ratio=spec.ratio,
        swa_cache=part_one.PagedCache(a["swa_cache"], a["swa_page_stride"], a["swa_block"]),
        comp_cache=part_one.PagedCache(a["comp_cache"], a["comp_page_stride"], a["comp_block"]),
        residual=host_tensor(s["residual"], bf16, (m, STREAMS, H)), post=host_tensor(s["post_in"], f32, (m, STREAMS)),
        comb=host_tensor(s["comb_in"], f32, (m, STREAMS, STREAMS)),
        token_req=a["token_req"][:m] if csa else None,
        block_table=a["block_table"].view(-1, a["bt_stride"]) if csa else None,
        entries_per_page=a["per_page"] if csa else None)
    use_hash = bool(a["use_hash"])
    epoch = int(a["sync"][0]) & 0xFFFFFFFF
    tag = epoch + 1
    mail = Mailboxes(a, lay)
    w = _weights(t, lay, positions)
    own = part_one.rank_attention(x, w)
    seam = part_one.ffn_seam(mail.all_reduce(own.partial, 0, tag), x, w)
    route_ids = a["route_ids"][: m * TOPK].view(m, TOPK) if use_hash else None
    partial = moe.rank_moe(seam.x_norm, _moe_weights(t, lay, use_hash), route_ids).partial
    out = mail.all_reduce(partial, 1, tag)
    for name, value in (("r_out", seam.r), ("post_out", seam.post), ("comb_out", seam.comb), ("pre_out", seam.pre),
                        ("x_norm", seam.x_norm), ("out", out)):
        host_tensor(s[name], value.dtype, tuple(value.shape)).copy_(value)
    a["sync"][0] = tag - (1 << 32) if tag >= 1 << 31 else tag
