"""K2's buffers for one rank and one bucket, a step of K2's world (k2_world.py), the launch
arguments by name (and in the template's order for a positional launcher), and the comparison with the reference. `mono-jit selftest`,
the emulated and the gfx950 tests launch through it; the CPU tests check its tables, its
argument order and that its comparison accepts the reference and rejects a perturbed output."""

from __future__ import annotations

from typing import Any

import torch

from ..config import PEER_WAIT_DEFAULT
from ..deepseek_v4 import HIDDEN as H
from ..templates.base import in_order
from ..spec import Spec
from ..templates import get
from ..templates.geometry import PEERS
from ..templates.reference_math import mxfp8_dequantize, mxfp8_quantize
from ..templates.k2 import moe_reference as moe_ref
from ..templates.k2 import attention_reference as ref
from ..templates.k2.attention_layout import STATE_TABLE, WEIGHT_TABLE
from ..templates.k2.moe_layout import K2MoeLayout
from ..templates.k2.moe_reference import MoeWeights
from .k2_world import COMP_BLOCK, COMP_STRIDE, KV_GAIN, SWA_BLOCK, SWA_STRIDE, World

SENTINEL = -3.0
PEER_WAIT_US = round(PEER_WAIT_DEFAULT * 1e6)  # the runner's default (the peer_wait setting)


def _pad_rows(t: torch.Tensor, rows: int, fill: float | int = 0) -> torch.Tensor:
    """t [M, ...] as [rows, ...], rows past M filled."""
    out = torch.full((rows, *t.shape[1:]), fill, dtype=t.dtype)
    out[: t.shape[0]] = t
    return out


def scratch_regions(lay: K2MoeLayout, work: torch.Tensor) -> dict[str, torch.Tensor]:
    """A K2 work buffer's (f32 words, on the CPU) attention hand-off regions (K2Layout offsets)."""
    i32 = work.view(torch.int32)[lay.i32_at // 4: lay.i32_at // 4 + lay.i32_words]
    u8 = work.view(torch.uint8)[lay.u8_at: lay.u8_at + lay.bytes]
    width = lay.heads * 512
    return {
        "slots": i32[lay.key_slots: lay.key_counts].view(lay.rows, lay.keys),
        "counts": i32[lay.key_counts: lay.key_counts + 2 * lay.rows].view(lay.rows, 2),
        "xo_codes": u8[lay.xo_codes: lay.xo_codes + lay.rows * width].view(lay.rows, width),
        "xo_scales": u8[lay.xo_scales: lay.xo_scales + lay.rows * width // 32].view(lay.rows, width // 32),
        "z_codes": u8[lay.z_codes: lay.z_codes + lay.rows * lay.o_width].view(lay.rows, lay.o_width),
        "z_scales": u8[lay.z_scales: lay.z_scales + lay.rows * lay.o_width // 32].view(lay.rows, -1),
    }


def partial_from_xo(scratch: dict[str, torch.Tensor], m: int, w: ref.K2Weights) -> torch.Tensor:
    """The reference's S4-S6 (wo_a, bf16, MXFP8, wo_b, bf16) on a kernel's xo hand-off (rows :m)."""
    z = ref.wo_a(scratch["xo_codes"][:m], scratch["xo_scales"][:m], w)
    return ref.wo_b(*mxfp8_quantize(z), w)


class K2Run:
    """One rank's device buffers of one K2 bucket (TP8) for the world's step."""

    def __init__(self, world: World, weights: ref.K2Weights, rank: int, bucket: int, device: str,
                 mailbox: Any = None, peer_addresses: list[int] | None = None, moe: MoeWeights | None = None,
                 route_ids: torch.Tensor | None = None, sync: torch.Tensor | None = None,
                 work: torch.Tensor | None = None):
        """`sync` and `work`: an earlier run's (the runner keeps both across steps), else zeroed."""
        x = world.rank(rank)
        self.x, self.w, self.rank, self.m = x, weights, rank, x.q.shape[0]
        width = x.topk.shape[1]
        self.lay = lay = K2MoeLayout(8, x.ratio, width, bucket)
        self.moe, self.route_ids = moe, route_ids
        self.peer_wait_us = PEER_WAIT_US
        csa = x.ratio == 4

        def dev(t: torch.Tensor) -> torch.Tensor:
            return t.contiguous().flatten().to(device)

        self.step = {
            "positions": dev(_pad_rows(x.positions.long(), bucket)),
            "slot_mapping": dev(_pad_rows(x.slot_mapping.long(), bucket, -1)),
            "swa_indices": dev(_pad_rows(x.swa_indices.int(), bucket, -1)),
            "swa_lens": dev(_pad_rows(x.swa_lens.int(), bucket)),
            "topk": dev(_pad_rows(x.topk.int(), bucket, -1)),
            "token_req": dev(_pad_rows(x.token_req.int(), bucket) if csa else torch.zeros(bucket, dtype=torch.int32)),
            "block_table": dev(x.block_table.int() if csa else torch.zeros(1, dtype=torch.int32)),
            "swa_cache": dev(x.swa_cache.data), "comp_cache": dev(x.comp_cache.data),
        }
        # the layer's weights, in vLLM's layouts, and their table (layout.WEIGHT_TABLE)
        self.weight_tensors = {
            "w_oa": dev(weights.wo_a), "s_oa": dev(weights.s_woa), "w_ob": dev(weights.wo_b),
            "s_ob": dev(weights.s_wob), "attn_sink": dev(weights.attn_sink.float()), "rope": dev(weights.rope),
            "hc_fn": dev(weights.hc_ffn_fn), "hc_base": dev(weights.hc_ffn_base), "hc_scale": dev(weights.hc_ffn_scale),
            "ffn_norm": dev(weights.ffn_norm)}
        integers = {"woa_stride": weights.wo_a.shape[1], "woa_shuffled": 0, "wob_stride": lay.o_width,
                    "wob_shuffled": 1, "sgu_stride": 7168, "sgu_shuffled": 1, "sw2_stride": lay.inter,
                    "sw2_shuffled": 0}
        if moe is not None:  # part two's weights (a part-one test leaves their entries 0: unread)
            self.weight_tensors.update({
                "gate": dev(moe.gate),
                "bias": dev(moe.bias if moe.bias is not None else torch.zeros(moe.gate.shape[0])),
                "w13": dev(moe.w13), "w13_s": dev(moe.w13_s), "w2": dev(moe.w2), "w2_s": dev(moe.w2_s),
                "sgu": dev(moe.sgu), "sgu_s": dev(moe.sgu_s), "sw2": dev(moe.sw2), "sw2_s": dev(moe.sw2_s)})
        self.weights = torch.tensor([self.weight_tensors[n].data_ptr() if n in self.weight_tensors else
                                     integers.get(n, 0) for n in WEIGHT_TABLE], dtype=torch.int64).to(device)
        # the runner's buffers: K1's outputs (K2's inputs) and K2's outputs, and their table
        rows, bf16 = bucket, torch.bfloat16
        self.state_tensors = {
            "q": dev(_pad_rows(x.q, rows)), "residual": dev(_pad_rows(x.residual, rows)),
            "post_in": dev(_pad_rows(x.post, rows)), "comb_in": dev(_pad_rows(x.comb, rows)),
            "r_out": torch.full((rows * 4 * H,), SENTINEL, dtype=bf16, device=device),
            "post_out": torch.full((rows * 4,), SENTINEL, device=device),
            "comb_out": torch.full((rows * 16,), SENTINEL, device=device),
            "pre_out": torch.full((rows * 4,), SENTINEL, device=device),
            "x_norm": torch.full((rows * H,), SENTINEL, dtype=bf16, device=device),
            "out": torch.full((rows * H,), SENTINEL, dtype=bf16, device=device)}
        self.state = torch.tensor([self.state_tensors[n].data_ptr() for n in STATE_TABLE], dtype=torch.int64).to(device)
        route_ids = route_ids if route_ids is not None else torch.zeros(self.m, 6, dtype=torch.int32)
        self.route_table = route_ids.int().contiguous().flatten().clone().to(device)  # one tensor for every launch
        self.sync = sync if sync is not None else torch.zeros(lay.sync_words, dtype=torch.int32, device=device)
        self.work = work if work is not None else torch.zeros(lay.work_words, dtype=torch.float32, device=device)
        self.mailbox = mailbox if mailbox is not None else torch.zeros(lay.peer_bytes // 8, dtype=torch.int64,
                                                                      device=device)
        addresses = peer_addresses or [self.mailbox.data_ptr()] * lay.tp  # one GPU: every peer is itself
        self.peers = torch.tensor(addresses + [0] * (PEERS - len(addresses)), dtype=torch.int64).to(device)

    def arguments(self) -> dict[str, Any]:
        """K2Template.arguments' names -> values for this step."""
        return {**self.step, "weights": self.weights, "state": self.state, "sync": self.sync, "work": self.work,
                "mailbox": self.mailbox, "peers": self.peers,
                "route_ids": self.route_table, "m": self.m, "rank": self.rank,
                "swa_page_stride": SWA_STRIDE, "swa_block": SWA_BLOCK, "comp_page_stride": COMP_STRIDE,
                "comp_block": COMP_BLOCK, "bt_stride": self.x.block_table.shape[1] if self.x.block_table is not None
                else 1, "per_page": COMP_BLOCK, "use_hash": int(self.route_ids is not None),
                "peer_wait_us": self.peer_wait_us}

    def device_memory(self) -> list[tuple[str, torch.Tensor, bool]]:
        """(name, tensor, writable) of every buffer the kernel reaches through the weights and
        state tables or as an argument (an emulated device registers them; weights read-only)."""
        tensors = [(name, t, False) for name, t in self.weight_tensors.items()]
        tensors += [(name, t, True) for name, t in {**self.state_tensors, **self.step}.items()]
        return tensors + [(name, v, True) for name, v in self.arguments().items() if isinstance(v, torch.Tensor)]

    def ordered(self) -> tuple:
        """The arguments positional, as FlyDSL's launcher takes them: by name, in the order
        K2Template.arguments declares (a name either side lacks is a KernargError naming it)."""
        lay = self.lay
        names = [a.name for a in get("k2").arguments(Spec(lay.tp, lay.ratio, lay.topk_width, lay.rows))]
        return in_order("k2", names, self.arguments())

    # -- what the kernel wrote ------------------------------------------------------------------
    def outputs(self) -> dict[str, torch.Tensor]:
        """K2's outputs for the step's rows, shaped as the reference's."""
        m = self.m
        s = {n: t.cpu() for n, t in self.state_tensors.items()}
        return {"r": s["r_out"].view(-1, 4, H)[:m], "post": s["post_out"].view(-1, 4)[:m],
                "comb": s["comb_out"].view(-1, 4, 4)[:m], "pre": s["pre_out"].view(-1, 4)[:m],
                "x_norm": s["x_norm"].view(-1, H)[:m]}

    def scratch(self) -> dict[str, torch.Tensor]:
        """The work buffer's hand-off regions (K2Layout offsets)."""
        return scratch_regions(self.lay, self.work.cpu())

    def write_scratch(self, name: str, value: torch.Tensor) -> None:
        """Put a reference hand-off where a standalone stage reads it (rows 0.. of the region)."""
        lay = self.lay
        u8 = self.work.view(torch.uint8)
        at = lay.u8_at + {"xo_codes": lay.xo_codes, "xo_scales": lay.xo_scales, "z_codes": lay.z_codes,
                          "z_scales": lay.z_scales, "ffn_codes": lay.ffn_codes, "ffn_scales": lay.ffn_scales}[name]
        flat = value.contiguous().flatten().view(torch.uint8)
        u8[at: at + flat.numel()].copy_(flat.to(u8.device))

    def region(self, kind: str, offset: int, count: int) -> torch.Tensor:
        """A device view of `count` elements at `offset` of the work buffer's f32, i32 or u8
        region (K2MoeLayout offsets): for a standalone stage's inputs and outputs."""
        lay = self.lay
        if kind == "f32":
            return self.work[offset: offset + count]
        if kind == "i32":
            return self.work.view(torch.int32)[lay.i32_at // 4 + offset: lay.i32_at // 4 + offset + count]
        return self.work.view(torch.uint8)[lay.u8_at + offset: lay.u8_at + offset + count]

    def moe_scratch(self) -> dict[str, torch.Tensor]:
        """Part two's hand-offs (K2MoeLayout offsets): ids, routing weights, the shared output
        and each pick's weighted down output."""
        lay, work, m = self.lay, self.work.cpu(), self.m
        i32 = work.view(torch.int32)[lay.i32_at // 4: lay.i32_at // 4 + lay.i32_words]
        return {"ids": i32[lay.ids: lay.ids + 6 * m].view(m, 6),
                "weights": work[lay.route_weights: lay.route_weights + 6 * m].view(m, 6),
                "shared": work[lay.shared_raw: lay.shared_raw + m * H].view(m, H),
                "picks": work[lay.routed_y: lay.routed_y + 6 * m * H].view(m, 6, H)}

    def pairs(self, region: str, src: int, half: int = 0) -> torch.Tensor:
        """[rows, 7168] bf16 of PART[src] (one hop) from this rank's mailbox half, and the tags."""
        lay = self.lay
        words = self.mailbox.cpu().view(torch.int32).view(-1, 2)
        first = (half * lay.half_bytes + lay.part_pair(src, 0, 0)) // 8
        block = words[first: first + lay.rows * H // 2]
        return block[:, 0].contiguous().view(torch.bfloat16).view(lay.rows, H), block[:, 1].view(lay.rows, H // 2)

    def put_partials(self, partials: list[torch.Tensor], tag: int, half: int = 0) -> None:
        """Fill this rank's mailbox as the peers' pushes would (one hop: PART; two hops: RS for
        the columns this rank owns, AG with the sums for the others), tagged `tag`."""
        lay = self.lay
        words = torch.zeros(lay.half_bytes // 4, dtype=torch.int32)
        pad = [torch.cat([p, torch.zeros(lay.rows - p.shape[0], H, dtype=torch.bfloat16)]) for p in partials]

        def put(offset: int, values: torch.Tensor) -> None:
            first = offset // 4
            pairs = values.contiguous().view(torch.int32).flatten()
            words[first: first + 2 * pairs.numel(): 2] = pairs
            words[first + 1: first + 2 * pairs.numel(): 2] = tag

        if lay.two_hop:
            own = slice(self.rank * lay.owned_cols, (self.rank + 1) * lay.owned_cols)
            for src, p in enumerate(pad):
                put(lay.rs_pair(src, 0, own.start), p[:, own])
            put(lay.ag_pair(0, 0), ref.all_reduce(pad))
        else:
            for src, p in enumerate(pad):
                put(lay.part_pair(src, 0, 0), p)
        view = self.mailbox.view(torch.int32)
        start = half * lay.half_bytes // 4
        view[start: start + words.numel()].copy_(words.to(view.device))

    # -- the comparison --------------------------------------------------------------------------
    def expected(self, partials: list[torch.Tensor]) -> ref.K2Outputs:
        own = ref.rank_attention(self.x, self.w)
        return ref.finish(own, self.x, self.w, partials)

    def expected_out(self, moes: list[MoeWeights]) -> torch.Tensor:
        """The reduced MoE output the reference gives on this run's own x_norm (the same on
        every rank): each rank's MoE (`moes` in rank order), all-reduced. The reference's own
        x_norm is not the input to hold the MoE to: x_norm's 1-ulp roundings (22 % of values in
        the 8-rank emulated run) move the test MoE's out by up to 3.7 (mean 0.37 of 17.9)."""
        x_norm = self.outputs()["x_norm"]
        return moe_ref.all_reduce([moe_ref.rank_moe(x_norm, w, self.route_ids).partial for w in moes])

    def check_out(self, want: torch.Tensor) -> None:
        """The reduced MoE output against the reference's, rows past m untouched."""
        got = self.state_tensors["out"].cpu()
        actual = got[: self.m * H].view(self.m, H).float()
        torch.testing.assert_close(actual, want.float(), rtol=3e-2, atol=3e-2)
        assert (actual - want.float()).abs().mean().item() <= 3e-3, "out: mean error"
        assert got[self.m * H:].eq(SENTINEL).all(), "out: rows past m were written"

    def check(self, want: ref.K2Outputs) -> None:
        """The FFN seam's outputs, rows past m untouched (K1's tolerances: f32 sums in another
        order, a bf16 ulp, an fp8 code flipped by it): R against `want`'s (K2Ranks.check passes
        the reference fed every rank's own xo codes, k2_ties.py), the gate and x_norm against the
        seam of the kernel's own R. Against the reference's R they are not
        held: R's 1-ulp roundings (from the ranks' partials, each a GEMV in another order) move
        post by up to 1.8e-3 (the whole K2 on 8 emulated ranks, tests/emulator/test_emulated_k2.py)."""
        got = self.outputs()
        own = ref.seam_of(got["r"], self.w)
        close = torch.testing.assert_close
        checks = (("r", want.seam.r, 1e-2, 1e-3), ("post", own.post, 1e-4, 1e-5),
                  ("comb", own.comb, 1e-3, 1e-4), ("pre", own.pre, 1e-4, 1e-5),
                  ("x_norm", own.x_norm, 2e-2, 2e-3))
        for name, expected, worst, mean in checks:
            actual = got[name].float()
            close(actual, expected.float(), rtol=worst, atol=worst, msg=lambda text: f"{name}: {text}")
            error = (actual - expected.float()).abs().mean().item()
            assert error <= mean, f"{name}: mean error {error:.2e} > {mean:.0e}"
        for name, out in self.state_tensors.items():
            if name in ("r_out", "post_out", "comb_out", "pre_out", "x_norm", "out"):
                tail = out.cpu()[self.m * out.numel() // self.lay.rows:]
                assert tail.eq(SENTINEL).all(), f"{name}: rows past m were written"

    def check_attention(self, want: ref.K2Outputs) -> None:
        """The merged, inverse-RoPE'd attention output (MXFP8 in the scratch) against the
        reference's, dequantised (an e4m3 step of tolerance; o is the world's KV_GAIN x a normed o)."""
        s, m = self.scratch(), self.m
        got = mxfp8_dequantize(s["xo_codes"][:m], s["xo_scales"][:m])
        close = torch.testing.assert_close
        close(got, mxfp8_dequantize(want.rank.xo_codes, want.rank.xo_scales), rtol=0.07, atol=0.02 * KV_GAIN)
