"""K2's register and memory budget per bucket and ratio at TP8, each build compiled into an
empty cache through the service: instructions in its listing, VGPRs, AGPRs, SGPRs, LDS, spilled
registers, scratch, code size and compile time (one job at a time, so the times are per build).
The last line prints upstream's K2 (vLLM 0.33's in-tree build, figures measured with the same
toolchain), beside ours.

    .venv/bin/python bench/k2_resources.py [--max-tokens 1,2,4,8,16,32,64] [--jobs 1]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from mono_jit.cache.store import Store
from mono_jit.config import Settings
from mono_jit.hsaco.metadata import read_metadata
from mono_jit.hsaco.isa import disassemble, find_objdump, instruction_counts
from mono_jit.pipeline.prebuild import prebuild
from mono_jit.spec import Spec
from mono_jit.templates import get

RATIOS = {4: 1024, 128: 8192}  # CSA's indexer top-k; HCA at the default 1M-token width
UPSTREAM = "upstream K2 (vLLM 0.33 in-tree, widths 1-64): 256 VGPRs, 9-86 VGPRs spilled, up to 196 B scratch"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", default="1,2,4,8,16,32,64")
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args()
    buckets = [int(t) for t in args.max_tokens.split(",")]
    specs = [Spec(8, ratio, width, rows) for ratio, width in RATIOS.items() for rows in buckets]
    with tempfile.TemporaryDirectory() as scratch:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("MONO_JIT_")}
        settings = Settings({**environ, "MONO_JIT_CACHE_DIR": str(Path(scratch) / "cache")})
        summary, _ = prebuild([get("k2")], specs, settings, jobs=args.jobs, timeout=1800)
        if summary.failed:
            raise SystemExit(f"{len(summary.failed)} builds failed: {summary.failed}")
        rows = []
        objdump = find_objdump(settings)
        for entry in Store(settings).entries():
            (kernel,) = read_metadata(entry.hsaco)[1]
            spec = entry.meta.spec
            instructions = sum(instruction_counts(disassemble(entry.hsaco, objdump)).values())
            rows.append((spec["ratio"], spec["max_tokens"], instructions, kernel.vgpr, kernel.agpr, kernel.sgpr,
                         kernel.lds,
                         kernel.vgpr_spills + kernel.sgpr_spills, kernel.scratch, len(entry.hsaco),
                         entry.meta.compile_seconds))
    print(f"{'ratio':>5} {'rows':>4} {'instrs':>6} {'VGPR':>4} {'AGPR':>4} {'SGPR':>4} {'LDS B':>6} {'spills':>6} "
          f"{'scratch':>7} {'code B':>7} {'compile s':>9}")
    for row in sorted(rows):
        print("{:>5} {:>4} {:>6} {:>4} {:>4} {:>4} {:>6} {:>6} {:>7} {:>7} {:>9.1f}".format(*row))
    print(f"max VGPRs {max(r[3] for r in rows)}, spills {max(r[7] for r in rows)}, scratch {max(r[8] for r in rows)} B")
    print(UPSTREAM)


if __name__ == "__main__":
    main()
