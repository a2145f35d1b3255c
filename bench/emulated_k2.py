"""Our K2 and vLLM 0.33's own K2 side by side on the emulated gfx950, on the same inputs: at each
(bucket, ratio), one layer_math checkpoint layer (its 8 ranks' tensors as vLLM holds them, shared
by both kernels) and one step of `bucket` rows. vLLM's K2 runs after its own K1 on 8 emulated
devices (tests/vllm/upstream_k2_run.py, builds through the plug-in of tests/vllm/upstream_mono.py);
ours on 8 devices from the same tensors and layer_math's K1 outputs of the step
(tests/support/k2_layer_buffers.py). Per (bucket, ratio) and kernel: wave-instructions per rank
(the mean over the 8, and the busiest CU's: one workgroup a CU), MFMAs, barriers and polls per
rank, bytes of weights read per rank per tensor (a scale with its weight) and in all, against
the floor of bench/moe_bandwidth.py's `k2_floor` for the experts the step routed; and each
kernel's `out` against layer_math's decode_layer (relative norm error, rank 0: vLLM's is a few
percent off from the step alone, not a defect; tests/vllm/test_emulated_upstream_k2.py says why).

Then, for the largest bucket run (at ratio 4 if it ran):

    bytes_over_floor N          ours: weight bytes read per rank / the floor
    instructions_vs_upstream N  ours / vLLM's wave-instructions

Needs vLLM 0.33, FlyDSL and MONO_JIT_AITER_HELPERS (AITER's FlyDSL helpers, for vLLM's
kernels). Builds are cached in the cache root (--cache-dir, else mono-jit's). The defaults
(buckets 1 and 8, ratios 4 and 128: four pairs of 8-rank launches) took 506 s with the builds
cached on the 2-core development machine at a load of 7-9, and about 5 GB of memory; a first run
compiles 8 of vLLM's builds and 4 of ours first (minutes more). Other buckets run the same way;
vLLM's past bucket 8 have not been run here. The layer routes among 8 reachable experts, so the
floor is that of the experts the step routed, not moe_bandwidth.py's random-routing union.

    MONO_JIT_AITER_HELPERS=DIR .venv/bin/python bench/emulated_k2.py [--buckets 1,8] [--ratios 4,128]
        [--seed 1] [--cache-dir DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests" / "support"), str(HERE.parent / "tests" / "vllm")]

# weight groups: a tensor with its scales, by vLLM's field names (ours) and vLLM's K2 parameter names
GROUPS = {"wo_a": ("wo_a", "wo_a_scale", "wo_a_codes", "woa", "woa_s"),
          "wo_b": ("wo_b", "wo_b_scale", "wo_b_codes", "wob", "wob_s"),
          "router": ("gate_w", "bias"), "w13": ("w13", "w13_s"), "w2": ("w2", "w2_s"),
          "sgu": ("sgu", "sgu_s", "sgu_codes"), "sw2": ("sw2", "sw2_s", "sw2_codes"),
          "hc_ffn_fn": ("hc_ffn_fn", "hc_fn")}
GROUP_OF = {name: group for group, names in GROUPS.items() for name in names}
TP = 8
MB = 1e6


def weight_traffic(report: Any) -> dict[str, dict[str, float]]:
    """Per weight group ("other": sink, RoPE table, norms, the seam's scale / base): bytes read and
    distinct bytes read, the mean over the ranks. Allocations are named r<rank>.[<kernel>.]<name>."""
    out: dict[str, dict[str, float]] = {}
    for name, entry in report.per_allocation.items():
        if "distinct_bytes_read" not in entry:
            continue  # not a weight
        tensor = name.split("|")[0].rsplit(".", 1)[-1]
        row = out.setdefault(GROUP_OF.get(tensor, "other"), {"read": 0.0, "distinct": 0.0})
        row["read"] += (entry["buffer_read"] + entry["global_read"] + entry["scalar_read"]) / TP
        row["distinct"] += entry["distinct_bytes_read"] / TP
    return out


def figures(report: Any, out_error: float) -> dict[str, Any]:
    """One kernel's counters of one 8-rank launch, per rank."""
    traffic = weight_traffic(report)
    per_rank = [d["wave_instructions"] for d in report.per_device]
    return {"wave_instructions_per_rank": report.wave_instructions / TP, "wave_instructions_max_rank": max(per_rank),
            "busiest_cu_instructions": report.busiest_workgroup_instructions, "mfma_per_rank": report.mfma / TP,
            "barriers_per_rank": report.barriers / TP, "polls_per_rank": report.polls / TP,
            "weight_bytes_read": sum(r["read"] for r in traffic.values()),
            "weight_bytes_distinct": sum(r["distinct"] for r in traffic.values()), "weights": traffic,
            "out_error": out_error, "seconds": report.seconds}


def out_error(got: Any, want: Any) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm())


def run_pair(spec: Any, ckpt: Any, tensors: list, upstream: dict, ours: Any, seed: int) -> dict:
    """vLLM's K2 (`upstream`: {(kernel, spec): its K1 and K2 builds}) and ours (`ours`, a
    k2_emulation.K2Code) at `spec` on one step of `spec.max_tokens` rows of `ckpt` (`tensors`: its
    ranks' tensors): the row's figures."""
    import k2_layer_buffers as kb
    import layer_math as lm
    import upstream_k2_run as run
    from k2_emulation import run_on_ranks
    from moe_bandwidth import k2_floor

    bucket, ratio = spec.max_tokens, spec.ratio
    step = lm.random_step(ckpt, m=bucket, seed=seed)
    want = lm.decode_layer(step, ckpt)
    experts = len(set(want.expert_ids.flatten().tolist()))
    floor = k2_floor(experts, TP)
    ranks = run.rank_buffers(ckpt, step, spec.topk_width if ratio == 128 else 0, tensors)
    _, up = run.run_layer(upstream["k1", spec], upstream["k2", spec], ranks)
    up_error = out_error(run.outputs(ranks[0], bucket)["out"].view(bucket, -1), want.out)
    del ranks
    front = kb.FrontOutputs.of(step, ckpt)
    boxes = kb.mailboxes(spec, TP)
    buffers = [kb.LayerK2Buffers(spec, step, front, tensors[r], r, boxes) for r in range(TP)]
    mine = run_on_ranks(ours, buffers)
    ours_error = out_error(buffers[0].out(), want.out)
    return {"bucket": bucket, "ratio": ratio, "experts": experts, "floor": floor, "floor_bytes": sum(floor.values()),
            "ours": figures(mine, ours_error), "upstream": figures(up, up_error)}


def ours_code(spec: Any, settings: Any) -> Any:
    """Our K2 at `spec` from the cache (compiled on a miss), as a k2_emulation.K2Code."""
    from k2_emulation import K2Code

    from mono_jit.pipeline.resolve import resolve
    from mono_jit.templates import get

    found = resolve(get("k2"), spec, settings=settings)
    return K2Code.of(spec, found.hsaco, [launch.to_json() for launch in found.meta.launches])


def own_copies(tensors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every rank's tensors with a copy of its own of those layer_math shares between ranks (the
    replicated gate, seams, norms, RoPE table), as each GPU holds its own: so each rank's distinct
    bytes are counted on its own allocation."""
    import torch

    seen: set[int] = set()
    for rank_tensors in tensors:
        for name, t in rank_tensors.items():
            if isinstance(t, torch.Tensor) and t.numel():
                if t.data_ptr() in seen and t.is_contiguous():
                    rank_tensors[name] = t = t.clone()
                seen.add(t.data_ptr())
    return tensors


def run_all(buckets: list[int], ratios: list[int], seed: int, cache: Path) -> list[dict]:
    import layer_math as lm
    from cache_settings import settings_at
    from upstream_mono import prebuilt

    from mono_jit.spec import Spec

    specs = {(b, r): Spec(TP, r, 1024 if r == 4 else 8192, b) for r in ratios for b in buckets}
    settings = settings_at(cache)
    helpers = Path(os.environ["MONO_JIT_AITER_HELPERS"])
    rows = []
    with tempfile.TemporaryDirectory() as folder, \
            prebuilt({"k1": specs.values(), "k2": specs.values()}, Path(folder), cache, helpers) as upstream:
        for ratio in ratios:
            ckpt = lm.random_checkpoint_layer(5, ratio, False, seed=seed)
            tensors = own_copies([lm.rank_tensors(ckpt, rank, TP) for rank in range(TP)])
            for bucket in buckets:
                spec = specs[bucket, ratio]
                rows.append(run_pair(spec, ckpt, tensors, upstream, ours_code(spec, settings), seed))
                print_row(rows[-1], header=len(rows) == 1)
            del tensors, ckpt
    return rows


def print_row(row: dict, header: bool) -> None:
    if header:
        print(f"{'bucket':>6} {'ratio':>5} {'kernel':>8} {'instr/rank':>11} {'max rank':>10} {'busiest CU':>10} "
              f"{'MFMA/rank':>9} {'barriers':>8} {'polls':>7} {'weights MB':>10} {'distinct':>8} {'floor MB':>8} "
              f"{'/floor':>6} {'out err':>8} {'s':>5}")
    for kernel in ("ours", "upstream"):
        f = row[kernel]
        print(f"{row['bucket']:>6} {row['ratio']:>5} {kernel:>8} {f['wave_instructions_per_rank']:>11,.0f} "
              f"{f['wave_instructions_max_rank']:>10,} {f['busiest_cu_instructions']:>10,} {f['mfma_per_rank']:>9,.0f} "
              f"{f['barriers_per_rank']:>8,.0f} {f['polls_per_rank']:>7,.0f} {f['weight_bytes_read'] / MB:>10.2f} "
              f"{f['weight_bytes_distinct'] / MB:>8.2f} {row['floor_bytes'] / MB:>8.2f} "
              f"{f['weight_bytes_read'] / row['floor_bytes']:>6.3f} {f['out_error']:>8.2e} {f['seconds']:>5.0f}")
    print("  per tensor, MB read (distinct) ours | vLLM's | floor, "
          f"{row['experts']} experts routed:")
    for group in (*GROUPS, "other"):
        cells = [row[k]["weights"].get(group, {"read": 0.0, "distinct": 0.0}) for k in ("ours", "upstream")]
        floor = row["floor"].get(group, 0.0)
        print(f"    {group:>9}: " + " | ".join(f"{c['read'] / MB:7.3f} ({c['distinct'] / MB:7.3f})" for c in cells)
              + f" | {floor / MB:7.3f}")
    sys.stdout.flush()


def summary(rows: list[dict]) -> dict[str, Any]:
    """The largest bucket's row (at ratio 4 if it ran): ours over the floor and over vLLM's."""
    largest = max(r["bucket"] for r in rows)
    row = min((r for r in rows if r["bucket"] == largest), key=lambda r: r["ratio"])
    ours, up = row["ours"], row["upstream"]
    return {"bucket": row["bucket"], "ratio": row["ratio"],
            "bytes_over_floor": ours["weight_bytes_read"] / row["floor_bytes"],
            "instructions_vs_upstream": ours["wave_instructions_per_rank"] / up["wave_instructions_per_rank"]}


def numbers(text: str, name: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"--{name} {text!r}: expected a comma list of integers") from None
    if not values:
        raise SystemExit(f"--{name} {text!r}: expected at least one value")
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--buckets", default="1,8", help="comma list of max-tokens buckets (rows a step: all)")
    parser.add_argument("--ratios", default="4,128", help="comma list of ratios: 4 (CSA), 128 (HCA)")
    parser.add_argument("--seed", type=int, default=1, help="layer_math's checkpoint and step seed")
    parser.add_argument("--cache-dir", type=Path, default=None, help="cache root for both kernels' builds")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args()
    buckets, ratios = numbers(args.buckets, "buckets"), numbers(args.ratios, "ratios")
    bad = [b for b in buckets if not 1 <= b <= 64] + [r for r in ratios if r not in (4, 128)]
    if bad:
        raise SystemExit(f"{bad}: buckets are 1..64, ratios 4 or 128")
    from upstream_mono import helpers_problem

    problem = helpers_problem()
    if problem:
        raise SystemExit(problem)
    from mono_jit.config import Settings

    cache = args.cache_dir or Settings().cache_dir
    start = time.perf_counter()
    if args.json:
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()):
            rows = run_all(sorted(set(buckets)), sorted(set(ratios)), args.seed, cache)
        print(json.dumps({"schema": "mono-jit-emulated-k2/1", "rows": rows, **summary(rows),
                          "seconds": time.perf_counter() - start}, indent=1))
        return
    rows = run_all(sorted(set(buckets)), sorted(set(ratios)), args.seed, cache)
    s = summary(rows)
    print(f"largest bucket {s['bucket']}, ratio {s['ratio']}:")
    print(f"bytes_over_floor {s['bytes_over_floor']:.4f}")
    print(f"instructions_vs_upstream {s['instructions_vs_upstream']:.4f}")
    print(f"bench wall time {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
