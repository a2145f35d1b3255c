"""Our K2 and vLLM 0.33's own K2 in modelled time on the emulated MI355X (the clock of
mono_jit/emulator/clock/), on the same layer_math inputs as bench/emulated_k2.py (which builds
and runs both; see its docstring for what it needs: vLLM 0.33, FlyDSL, MONO_JIT_AITER_HELPERS).
Per bucket (ratio 4): modelled microseconds of each 8-rank launch at the peak 2.4 GHz and at the
1.52 GHz one MI355X was seen to sustain, the HBM floor of the experts the step routed (weight
bytes a rank must read at 8 TB/s), the wave-instructions per rank as a column, and the wave
that ended each launch with where its time went. Then:

    k2_time_vs_upstream X   ours / vLLM's modelled time, the largest over the buckets
    k2_time_vs_floor X      ours / the floor, the largest over the buckets

The clock is a model (tens of percent absolute error; docs/emulator.md), not an MI355X: nothing
here has run on one. K1 is not timed yet (no k1_time_vs_upstream line).

    MONO_JIT_AITER_HELPERS=DIR .venv/bin/python bench/modelled_step.py [--buckets 1] [--seed 1]
        [--cache-dir DIR] [--events N]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests" / "support"), str(HERE.parent / "tests" / "vllm")]

RATIO = 4
SUSTAINED_GHZ = 1.52
HBM_BYTES_PER_US = 8e12 / 1e6


def timed(report: Any) -> dict[str, Any]:
    """A launch's modelled time at the peak and the sustained clock, and who ended it."""
    from mono_jit.emulator.clock.report import model

    peak = model(report.trace)
    return {"us": peak.us, "us_sustained": model(report.trace, SUSTAINED_GHZ).us, "summary": peak.summary(),
            "instructions_per_rank": report.wave_instructions / len(report.per_device)}


def run_bucket(bucket: int, ckpt: Any, tensors: list, upstream: dict, ours: Any, spec: Any, seed: int,
               clock: Any) -> dict[str, Any]:
    import k2_layer_buffers as kb
    import layer_math as lm
    import upstream_k2_run as run
    from k2_emulation import run_on_ranks
    from moe_bandwidth import k2_floor

    step = lm.random_step(ckpt, m=bucket, seed=seed)
    want = lm.decode_layer(step, ckpt)
    experts = len(set(want.expert_ids.flatten().tolist()))
    floor_us = sum(k2_floor(experts, run.TP).values()) / HBM_BYTES_PER_US
    ranks = run.rank_buffers(ckpt, step, 0, tensors)
    _, up = run.run_layer(upstream["k1", spec], upstream["k2", spec], ranks, timing=clock)
    up_row = timed(up)
    del ranks, up
    front = kb.FrontOutputs.of(step, ckpt)
    boxes = kb.mailboxes(spec, run.TP)
    buffers = [kb.LayerK2Buffers(spec, step, front, tensors[r], r, boxes) for r in range(run.TP)]
    mine = run_on_ranks(ours, buffers, timing=clock)
    return {"bucket": bucket, "floor_us": floor_us, "ours": timed(mine), "upstream": up_row}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--buckets", default="1", help="comma list of max-tokens buckets")
    parser.add_argument("--seed", type=int, default=1, help="layer_math's checkpoint and step seed")
    parser.add_argument("--cache-dir", type=Path, default=None, help="cache root for both kernels' builds")
    parser.add_argument("--events", type=int, default=1 << 24, help="the most clock events a launch may record")
    args = parser.parse_args()
    import emulated_k2 as ek

    buckets = ek.numbers(args.buckets, "buckets")
    if [b for b in buckets if not 1 <= b <= 64]:
        raise SystemExit(f"--buckets {args.buckets!r}: buckets are 1..64")
    from upstream_mono import helpers_problem

    problem = helpers_problem()
    if problem:
        raise SystemExit(problem)
    import layer_math as lm
    from cache_settings import settings_at
    from upstream_mono import prebuilt

    from mono_jit.config import Settings
    from mono_jit.emulator.clock.trace import Clock
    from mono_jit.spec import Spec

    start = time.perf_counter()
    cache = args.cache_dir or Settings().cache_dir
    specs = {b: Spec(ek.TP, RATIO, 1024, b) for b in buckets}
    rows = []
    with tempfile.TemporaryDirectory() as folder, \
            prebuilt({"k1": specs.values(), "k2": specs.values()}, Path(folder), cache,
                     Path(os.environ["MONO_JIT_AITER_HELPERS"])) as upstream:
        ckpt = lm.random_checkpoint_layer(5, RATIO, False, seed=args.seed)
        tensors = ek.own_copies([lm.rank_tensors(ckpt, rank, ek.TP) for rank in range(ek.TP)])
        for bucket in buckets:
            ours = ek.ours_code(specs[bucket], settings_at(cache))
            rows.append(run_bucket(bucket, ckpt, tensors, upstream, ours, specs[bucket], args.seed, Clock(args.events)))
            row = rows[-1]
            print(f"bucket {bucket}: floor {row['floor_us']:.2f} us")
            for kernel in ("ours", "upstream"):
                f = row[kernel]
                print(f"  {kernel:>8}: {f['us']:8.2f} us at 2.4 GHz, {f['us_sustained']:8.2f} us at {SUSTAINED_GHZ} GHz, "
                      f"{f['instructions_per_rank']:>12,.0f} wave-instructions a rank")
                print(f"            {f['summary']}")
            sys.stdout.flush()
    print(f"k2_time_vs_upstream {max(r['ours']['us'] / r['upstream']['us'] for r in rows):.3f}")
    print(f"k2_time_vs_floor {max(r['ours']['us'] / r['floor_us'] for r in rows):.3f}")
    print(f"bench wall time {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
