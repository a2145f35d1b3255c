"""The decode layer's bandwidth model on paper: bytes of weights one rank reads per step, per
max-tokens bucket, at TP8, and the floor time at MI355X's HBM bandwidth: the figure K1 + K2 are
to approach on hardware (weights dominate: activations, KV records and the all-reduces are KBs).

    .venv/bin/python bench/moe_bandwidth.py [--max-tokens 1,2,4,8,16,32,64] [--tp 8]

Formula, per rank and layer, for a step of M rows (E = 384 routed experts, k = 6 a row):
    experts(M) = E (1 - (1 - k / E)^M)     the expected union at random routing: each row picks k
                                           distinct experts uniformly, so an expert escapes a row
                                           with probability 1 - k / E (M x 6 independent draws,
                                           E (1 - (1 - 1 / E)^(6 M)), is printed beside it)
    routed(M)  = experts(M) x (w13 + w13_s + w2 + w2_s), one expert's rank share (I = 3072 / tp):
                 w13 2 I x H / 2 fp4x2 bytes + 2 I x H / 32 E8M0, w2 H x I / 2 + H x I / 32
    bytes(M)   = routed(M) + shared (gate_up 2 S x H + down H x S e4m3, S = 3072 / tp, 128 x 128
                 E8M0 blocks) + router (gate E x H bf16, bias E f32) + attention (K1: fused_wqa_wkv
                 2048 x H, wq_b heads x 512 x 1536; K2: wo_a groups x 1024 x 4096, wo_b H x
                 groups x 1024; e4m3 with 128 x 128 E8M0 blocks; per-rank shapes from the k1 / k2
                 layouts) + mHC (hc_attn_fn, hc_ffn_fn: 24 x 4 H f32 each)
    floor(M)   = bytes(M) / B, B = 8 TB/s: MI355X's peak HBM3E bandwidth (AMD's launch figure,
                 June 2025: 288 GB HBM3E at 8 TB/s, www.amd.com/en/products/accelerators/instinct/
                 mi350/mi355x.html; reported e.g. by The Register, 2025-06-12, "AMD's MI355X is a
                 1.4 kW liquid-cooled monster").
Every weight is read once a step (K2 reads a routed expert once however many rows chose it).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from mono_jit import STANDARD_MAX_TOKENS, deepseek_v4
from mono_jit.deepseek_v4 import HEAD_DIM, Q_LORA, STREAMS
from mono_jit.templates.geometry import MX_BLOCK, WEIGHT_BLOCK
from mono_jit.templates.k1.layout import QKV, K1Layout
from mono_jit.templates.k2.attention_layout import K2Layout

HBM_BYTES_PER_S = 8e12
MIXES = 24
LAYERS = 61


def fp8_bytes(n: int, k: int) -> int:
    """An e4m3 [n, k] weight and its 128 x 128 E8M0 block codes (rows vLLM pads are not read)."""
    return n * k + math.ceil(n / WEIGHT_BLOCK) * math.ceil(k / WEIGHT_BLOCK)


def mxfp4_bytes(n: int, k: int) -> int:
    """An fp4x2 [n, k / 2] weight and its E8M0 codes, one per 32 (w2_s's pad columns not read)."""
    return n * k // 2 + n * k // MX_BLOCK


def expected_union(rows: int, experts: int = deepseek_v4.ROUTED_EXPERTS,
                   k: int = deepseek_v4.EXPERTS_PER_TOKEN) -> float:
    return experts * (1 - (1 - k / experts) ** rows)


def expected_union_draws(rows: int, experts: int = deepseek_v4.ROUTED_EXPERTS,
                         k: int = deepseek_v4.EXPERTS_PER_TOKEN) -> float:
    return experts * (1 - (1 - 1 / experts) ** (k * rows))


@dataclass
class Step:
    rows: int
    union: float
    union_draws: float
    routed: float
    shared: int
    router: int
    attention: int
    mhc: int

    @property
    def total(self) -> float:
        return self.routed + self.shared + self.router + self.attention + self.mhc

    @property
    def floor_s(self) -> float:
        return self.total / HBM_BYTES_PER_S


def k2_floor(experts: float, tp: int) -> dict[str, float]:
    """The weight bytes K2 must read on one rank in a step whose rows chose `experts` distinct
    routed experts, per weight with its scale codes: wo_a (groups x [1024, K]), wo_b, the
    router's gate and bias, the routed experts' w13 / w2, the shared expert's gate_up (sgu) and
    down (sw2), the FFN seam's hc_ffn_fn."""
    h = deepseek_v4.HIDDEN
    inter = deepseek_v4.MOE_INTERMEDIATE // tp  # routed and shared experts are split alike
    k2 = K2Layout(tp, deepseek_v4.CSA_RATIO, deepseek_v4.CSA_INDEX_TOPK, 1)
    group_k = k2.heads // k2.groups * HEAD_DIM
    return {"wo_a": fp8_bytes(k2.o_width, group_k), "wo_b": fp8_bytes(h, k2.o_width),
            "router": deepseek_v4.ROUTED_EXPERTS * h * 2 + deepseek_v4.ROUTED_EXPERTS * 4,
            "w13": experts * mxfp4_bytes(2 * inter, h), "w2": experts * mxfp4_bytes(h, inter),
            "sgu": fp8_bytes(2 * inter, h), "sw2": fp8_bytes(h, inter), "hc_ffn_fn": MIXES * STREAMS * h * 4}


def step(rows: int, tp: int) -> Step:
    k1, union = K1Layout(tp, rows), expected_union(rows)
    k2 = k2_floor(union, tp)
    return Step(rows, union, expected_union_draws(rows), k2["w13"] + k2["w2"], shared=k2["sgu"] + k2["sw2"],
                router=k2["router"],
                attention=fp8_bytes(QKV, deepseek_v4.HIDDEN) + fp8_bytes(k1.q_width, Q_LORA) + k2["wo_a"] + k2["wo_b"],
                mhc=2 * k2["hc_ffn_fn"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", default=",".join(map(str, STANDARD_MAX_TOKENS)))
    parser.add_argument("--tp", type=int, default=8)
    args = parser.parse_args()
    mb = 1e6
    print(f"weights read per rank per step, one layer, TP{args.tp}; floor at {HBM_BYTES_PER_S / 1e12:.0f} TB/s "
          f"(MB = 1e6 bytes; {deepseek_v4.ROUTED_EXPERTS} experts, "
           f"top-{deepseek_v4.EXPERTS_PER_TOKEN} a row at random)")
    print(f"{'rows':>4} {'experts':>8} {'(6M draws)':>10} {'routed MB':>10} {'shared MB':>9} {'router MB':>9} "
          f"{'attn MB':>8} {'mHC MB':>7} {'total MB':>9} {'floor us':>9} {'x61 ms':>7}")
    for rows in sorted({int(r) for r in args.max_tokens.split(",")}):
        s = step(rows, args.tp)
        print(f"{rows:>4} {s.union:>8.1f} {s.union_draws:>10.1f} {s.routed / mb:>10.1f} {s.shared / mb:>9.2f} "
              f"{s.router / mb:>9.2f} {s.attention / mb:>8.2f} {s.mhc / mb:>7.2f} {s.total / mb:>9.1f} "
              f"{s.floor_s * 1e6:>9.1f} {s.floor_s * LAYERS * 1e3:>7.2f}")


if __name__ == "__main__":
    main()
