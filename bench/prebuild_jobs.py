"""Prebuild wall time with --jobs 1 over --jobs 2 on the same grid, each into an empty cache.
Prints both times and `ratio <jobs1 / jobs2>` (above 1 means the pool helps).

    .venv/bin/python bench/prebuild_jobs.py [--max-tokens 1,2,4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def prebuild(jobs: int, max_tokens: str, cache: str) -> float:
    env = {**os.environ, "MONO_JIT_CACHE_DIR": cache}
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "mono_jit.cli.main", "prebuild", "--jobs", str(jobs),
                          "--max-tokens", max_tokens, "--json"], env=env, check=True, capture_output=True, text=True)
    took = time.perf_counter() - started
    summary = json.loads(out.stdout)
    assert summary["failed"] == 0 and summary["hits"] == 0, summary
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", default="1,2,4")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        one = prebuild(1, args.max_tokens, os.path.join(scratch, "j1"))
        two = prebuild(2, args.max_tokens, os.path.join(scratch, "j2"))
    print(f"grid: every template, ratios 4,128, max tokens {args.max_tokens}")
    print(f"--jobs 1: {one:.1f} s   --jobs 2: {two:.1f} s")
    print(f"ratio {one / two:.2f}")


if __name__ == "__main__":
    main()
