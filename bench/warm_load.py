"""Warm load: a cached kernel through mono-jit vs FlyDSL's own disk-cache hit, and a whole TP8
deployment grid through mono-jit, each in a fresh process.

1. One kernel (router, TP8, ratio 4, bucket 8, then bucket 16): mono-jit's `resolve` against
   FlyDSL 0.5.0's disk-cache hit of the same template and specs (trace the launcher, load from
   its cache), in fresh processes that start with the standard library modules every serving
   process already holds (dataclasses, typing, json, ...; untimed on both sides).
   `ratio N` is the cost of loading one kernel: the second kernel of the process, another
   entry, once each side's own modules are imported (as in a vLLM worker, whose runner loads
   its kernels after its imports). `fresh_ratio N` is the first kernel of the process,
   including each side's own imports (mono-jit's modules; FlyDSL and MLIR): a once-per-process
   cost, which the grid figure below also carries. The goal for `ratio` is >= 100.
2. The grid: every (template, spec) of one TP8 deployment (every registered template over
   `deployment_grid()`: ratios 4 and 128, buckets 1..64), resolved by `resolve_many` in a fresh
   process with a warm cache, timed the same way. Prints `grid_load_s N` (the goal is < 1), next
   to the upstream figure it replaces: vLLM's in-tree mono re-traces every kernel on each start,
   1,208 s per rank for its 640 kernels (FlyDSL 0.5.0, measured on an MI355X host). Fails if the
   grid load imported FlyDSL, MLIR, torch or the compile side.

mono-jit's figures end at verified bytes (size, sha256, key and ELF header checked, metadata
parsed): there is no GPU here, so the runner's hipModuleLoadData of those bytes (one driver call
per kernel) is not in them. FlyDSL's figure includes its own module load from its cache.

Every child runs with compiled bytecode in a private PYTHONPYCACHEPREFIX (warmed by untimed
runs), as an installed package would: FlyDSL's wheel ships its .pyc files, while an editable
mono-jit under PYTHONDONTWRITEBYTECODE=1 would recompile its sources in every process.

    .venv/bin/python bench/warm_load.py [--repeat 5] [--cache-dir DIR (already filled: no fill)]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

TEMPLATE, SPEC = "router", {"tp": 8, "ratio": 4, "topk_width": 1024, "max_tokens": 8}
OTHER = {**SPEC, "max_tokens": 16}  # the next kernel: another entry of the same template
UPSTREAM_S, UPSTREAM_KERNELS = 1208.0, 640  # vLLM in-tree mono, FlyDSL 0.5.0, per rank per start
# Absent after a warm grid load: FlyDSL and MLIR, torch, and the compile side.
ABSENT = ("flydsl", "_mlir", "mlir", "torch", "mono_jit.pipeline.compile", "mono_jit.pipeline.workers", "mono_jit.pipeline.prebuild",
          "mono_jit.cache.lock", "filelock", "multiprocessing", "elftools", "msgpack")

MONO_JIT = """
import time, sys
import dataclasses, enum, functools, inspect, json, pathlib, re, struct, typing  # stdlib: untimed
t = time.perf_counter()
from mono_jit.pipeline.resolve import resolve
from mono_jit.spec import Spec
spec, other = (Spec.from_dict(s) for s in json.loads(sys.argv[2]))
r = resolve(sys.argv[1], spec)
took = time.perf_counter() - t
assert not r.compiled
t = time.perf_counter()
again = resolve(sys.argv[1], other)
next_kernel = time.perf_counter() - t
assert not again.compiled and again.entry.key != r.entry.key
print(json.dumps({"seconds": took, "next_kernel": next_kernel, "bytes": len(r.hsaco),
                  "flydsl_imported": "flydsl" in sys.modules, "torch_imported": "torch" in sys.modules}))
"""

FLYDSL = """
import time, sys
import dataclasses, enum, functools, inspect, json, pathlib, re, struct, typing  # stdlib: untimed
t = time.perf_counter()
import flydsl.compiler as flyc
from mono_jit.templates import get
from mono_jit.spec import Spec
spec, other = (Spec.from_dict(s) for s in json.loads(sys.argv[2]))
build = get(sys.argv[1]).build(spec)
compiled = flyc.compile(build.launcher, *build.placeholders)
took = time.perf_counter() - t
t = time.perf_counter()
build = get(sys.argv[1]).build(other)
flyc.compile(build.launcher, *build.placeholders)
next_kernel = time.perf_counter() - t
print(json.dumps({"seconds": took, "next_kernel": next_kernel, "bytes": len(compiled._keepalive.ir)}))
"""

GRID = """
import time, sys
import dataclasses, enum, functools, inspect, json, pathlib, re, struct, typing  # stdlib: untimed
t = time.perf_counter()
from mono_jit.pipeline.resolve import resolve_many
from mono_jit.spec import Spec
pairs = [(name, Spec.from_dict(spec)) for name, spec in json.loads(sys.argv[1])]
resolved = resolve_many(pairs)
took = time.perf_counter() - t
absent = tuple(json.loads(sys.argv[2]))
unique = {r.entry.key: r for r in resolved}
print(json.dumps({"seconds": took, "pairs": len(pairs), "kernels": len(unique),
                  "bytes": sum(len(r.hsaco) for r in unique.values()),
                  "compiled": sum(r.compiled for r in unique.values()),
                  "imported": sorted(m for m in sys.modules if m.startswith(absent))}))
"""


def run(code: str, env: dict[str, str], *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def grid_pairs() -> list[tuple[str, dict]]:
    from mono_jit.spec import deployment_grid
    from mono_jit.templates import all_templates

    return [(name, spec.as_dict()) for name in all_templates() for spec in deployment_grid()]


def fill(env: dict[str, str], pairs: list[tuple[str, dict]]) -> None:
    from mono_jit.config import Settings
    from mono_jit.pipeline.prebuild import prebuild
    from mono_jit.spec import Spec
    from mono_jit.templates import get

    names = sorted({name for name, _ in pairs})
    specs = sorted({Spec.from_dict(spec) for _, spec in pairs})
    summary, _ = prebuild([get(n) for n in names], specs, Settings(env), jobs=os.cpu_count() or 1, timeout=600)
    assert not summary.failed, summary.failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--cache-dir", help="an already filled mono-jit cache (default: fill a scratch one)")
    args = parser.parse_args()
    from mono_jit.config import Settings
    from mono_jit.spec import Spec
    from mono_jit.pipeline.toolchain import compile_environment, resolve_toolchain

    pairs = grid_pairs()
    with tempfile.TemporaryDirectory() as scratch:
        base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE" and not k.startswith("MONO_JIT_")}
        base["PYTHONPYCACHEPREFIX"] = os.path.join(scratch, "pycache")
        mono_env = {**base, "MONO_JIT_CACHE_DIR": args.cache_dir or os.path.join(scratch, "mono")}
        fill(mono_env, pairs)  # a hit for each when --cache-dir is already filled
        toolchain = resolve_toolchain(Settings(mono_env))
        fly_env = compile_environment(toolchain, Spec.from_dict(SPEC).arch, mono_env)
        fly_env.update(FLYDSL_RUNTIME_ENABLE_CACHE="1", FLYDSL_RUNTIME_CACHE_DIR=os.path.join(scratch, "flydsl"))
        grid_args = (json.dumps(pairs), json.dumps(ABSENT))
        # Untimed: fill FlyDSL's disk cache, write every child's bytecode.
        run(FLYDSL, fly_env, TEMPLATE, json.dumps([SPEC, OTHER]))
        run(MONO_JIT, mono_env, TEMPLATE, json.dumps([SPEC, OTHER]))
        run(GRID, mono_env, *grid_args)
        mono, fly, grid = [], [], []
        for _ in range(args.repeat):  # interleaved, so a busy moment costs both sides alike
            mono.append(run(MONO_JIT, mono_env, TEMPLATE, json.dumps([SPEC, OTHER])))
            fly.append(run(FLYDSL, fly_env, TEMPLATE, json.dumps([SPEC, OTHER])))
            grid.append(run(GRID, mono_env, *grid_args))
    assert not any(m["flydsl_imported"] or m["torch_imported"] for m in mono), "mono-jit load imported FlyDSL/torch"
    imported = sorted({m for g in grid for m in g["imported"]})
    assert not imported, f"the warm grid load imported {', '.join(imported)}"
    assert not any(g["compiled"] for g in grid), "the grid load compiled: the cache was not warm"
    mono_s = statistics.median(m["seconds"] for m in mono)
    fly_s = statistics.median(f["seconds"] for f in fly)
    mono_next = statistics.median(m["next_kernel"] for m in mono)
    fly_next = statistics.median(f["next_kernel"] for f in fly)
    grid_s = statistics.median(g["seconds"] for g in grid)
    kernels, nbytes = grid[0]["kernels"], grid[0]["bytes"]
    print(f"one kernel: template {TEMPLATE} spec {SPEC}, then {OTHER}; median of {args.repeat} fresh processes each")
    print(f"  first kernel of a process: mono-jit {mono_s * 1000:.1f} ms (its imports + verified bytes; no FlyDSL, "
          f"no torch), FlyDSL 0.5.0 disk-cache hit {fly_s * 1000:.1f} ms (its imports + trace + load)")
    print(f"  one more kernel:           mono-jit {mono_next * 1000:.2f} ms, FlyDSL {fly_next * 1000:.1f} ms")
    print(f"grid: {grid[0]['pairs']} (template, spec) pairs of a TP8 deployment = {kernels} kernels "
          f"({nbytes / 1e6:.2f} MB of code objects), resolve_many in a fresh process, median of {args.repeat}")
    print(f"  mono-jit, warm cache: {grid_s:.3f} s per rank ({grid_s / kernels * 1000:.2f} ms per kernel), "
          f"imports none of {', '.join(ABSENT)}")
    print(f"  upstream: vLLM's in-tree mono re-traces every kernel on each start: {UPSTREAM_S:,.0f} s per rank "
          f"for its {UPSTREAM_KERNELS} kernels ({UPSTREAM_S / UPSTREAM_KERNELS:.2f} s per kernel; FlyDSL 0.5.0, "
          "same machine kind)")
    print("  (mono-jit figures end at verified bytes; the runner's hipModuleLoadData is not in them: no GPU here)")
    print(f"ratio {fly_next / mono_next:.1f}")
    print(f"fresh_ratio {fly_s / mono_s:.1f}")
    print(f"grid_load_s {grid_s:.4f}")


if __name__ == "__main__":
    main()
