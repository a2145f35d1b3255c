"""Warming a host from the registry vs compiling its grid, measured in the same run.

1. Compile one TP8 deployment's grid (every registered template over `deployment_grid()`, the
   README's `mono-jit prebuild`) into a build cache: `compile_s`.
2. Start Debian's docker-registry on 127.0.0.1 (plain HTTP, named insecure), behind the tests'
   counting proxy, and `mono-jit push` the build cache: `push_s`.
3. Warm an empty host two ways, each in a fresh process: `mono-jit pull` (`pull_s`), and the
   read-through tier (MONO_JIT_REMOTE set, `resolve_many` of the whole grid, as a runner does at
   start-up: `readthrough_s`). Each figure includes the process's start and imports.
4. Pull again into the warmed host: the entries, bytes and requests it moved (should be 0, 0 and
   the one manifest read).

Prints one `name value` line per figure, then `ratio_pull N` and `ratio_readthrough N`
(compile_s over each). The registry is on loopback: a real one adds network time per request
(1 + one per missing entry), while compile time grows with the grid.

    .venv/bin/python bench/registry_warm.py [--template k1,router,keytable] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "support"))  # the tests' registry starter and counting proxy

from oci_registry import LocalRegistry, Proxy, registry_available  # noqa: E402

MONO_JIT = [str(Path(sys.executable).parent / "mono-jit")]  # the console script beside this interpreter
READ_THROUGH = """
import json, sys
from mono_jit.pipeline.resolve import resolve_many
from mono_jit.spec import deployment_grid
from mono_jit.templates import all_templates
names = sys.argv[1].split(",")
resolved = resolve_many([(n, s) for n in all_templates() if n in names for s in deployment_grid()])
print(json.dumps({"kernels": len(resolved), "compiled": sum(r.compiled for r in resolved)}))
"""


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    started = time.perf_counter()
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=3600)
    took = time.perf_counter() - started
    if out.returncode != 0:
        sys.exit(f"{' '.join(argv[:4])} failed: {out.stderr.strip()[-2000:]}")
    return took, out.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--template", default="k1,router,keytable")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    reason = registry_available()
    if reason is not None:
        sys.exit(reason)
    base = {k: v for k, v in os.environ.items() if not k.startswith("MONO_JIT_")}
    with tempfile.TemporaryDirectory(prefix="mono-jit-bench-") as folder:
        root = Path(folder)
        registry = LocalRegistry(root / "registry")
        proxy = Proxy(registry.host)
        try:
            ref = f"{proxy.host}/mono-jit/bench:grid"
            env = {**base, "MONO_JIT_REMOTE_INSECURE": proxy.host}
            build = {**env, "MONO_JIT_CACHE_DIR": str(root / "build")}
            compile_s, _ = timed([*MONO_JIT, "prebuild", "--template", args.template, "--jobs", str(args.jobs),
                                  "--json"], build)
            push_s, out = timed([*MONO_JIT, "push", ref, "--json"], build)
            pushed = json.loads(out)
            proxy.reset()
            pull_s, out = timed([*MONO_JIT, "pull", ref, "--json"], {**env, "MONO_JIT_CACHE_DIR": str(root / "a")})
            pulled = json.loads(out)
            pull_requests = sum(proxy.counts.values())
            proxy.reset()
            through = {**env, "MONO_JIT_CACHE_DIR": str(root / "b"), "MONO_JIT_REMOTE": ref}
            readthrough_s, out = timed([sys.executable, "-c", READ_THROUGH, args.template], through)
            grid = json.loads(out)
            through_requests = sum(proxy.counts.values())
            proxy.reset()
            _, out = timed([*MONO_JIT, "pull", ref, "--json"], {**env, "MONO_JIT_CACHE_DIR": str(root / "a")})
            again = json.loads(out)
            second_requests = dict(proxy.counts)
        finally:
            proxy.stop()
            registry.stop()
    if grid["compiled"]:
        sys.exit(f"the read-through compiled {grid['compiled']} of {grid['kernels']} kernels: it should fetch them")
    print(f"grid_kernels {grid['kernels']}")
    print(f"entries {pulled['fetched']}  bytes {pulled['bytes']}  (pushed {pushed['uploaded']} blobs, "
          f"{pushed['bytes']} bytes)")
    print(f"compile_s {compile_s:.2f}")
    print(f"push_s {push_s:.2f}")
    print(f"pull_s {pull_s:.2f}  ({pull_requests} requests)")
    print(f"readthrough_s {readthrough_s:.2f}  ({through_requests} requests)")
    print(f"second_pull_entries {again['fetched']}  second_pull_bytes {again['bytes']}  "
          f"second_pull_requests {second_requests}")
    print(f"ratio_pull {compile_s / pull_s:.1f}")
    print(f"ratio_readthrough {compile_s / readthrough_s:.1f}")


if __name__ == "__main__":
    main()
