"""Warm load: a cached kernel through mono-jit vs FlyDSL's own disk-cache hit, same template and
spec, each in a fresh process, timed inside the process from before its first import to the
kernel bytes in hand. Also prints the per-kernel cost once each process has loaded one kernel
(what every further kernel of a deployment grid costs). Ends with `ratio <flydsl / mono-jit>`
for the fresh-process figure.

    .venv/bin/python bench/warm_load.py [--repeat 3]
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

MONO_JIT = """
import time, json, sys
t = time.perf_counter()
from mono_jit.resolve import resolve
from mono_jit.spec import Spec
spec = Spec.from_dict(json.loads(sys.argv[2]))
r = resolve(sys.argv[1], spec)
assert not r.compiled
took = time.perf_counter() - t
t = time.perf_counter()
again = resolve(sys.argv[1], spec)
next_kernel = time.perf_counter() - t
print(json.dumps({"seconds": took, "next_kernel": next_kernel, "bytes": len(r.hsaco),
                  "flydsl_imported": "flydsl" in sys.modules, "torch_imported": "torch" in sys.modules}))
"""

FLYDSL = """
import time, json, sys
t = time.perf_counter()
import flydsl.compiler as flyc
from mono_jit.templates import get
from mono_jit.spec import Spec
build = get(sys.argv[1]).build(Spec.from_dict(json.loads(sys.argv[2])))
compiled = flyc.compile(build.launcher, *build.placeholders)
took = time.perf_counter() - t
t = time.perf_counter()
build = get(sys.argv[1]).build(Spec.from_dict(json.loads(sys.argv[2])))
flyc.compile(build.launcher, *build.placeholders)
next_kernel = time.perf_counter() - t
print(json.dumps({"seconds": took, "next_kernel": next_kernel, "bytes": len(compiled._keepalive.ir)}))
"""


def run(code: str, env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-c", code, TEMPLATE, json.dumps(SPEC)], env=env, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from mono_jit.config import Settings
    from mono_jit.spec import Spec
    from mono_jit.toolchain import compile_environment, resolve_toolchain

    with tempfile.TemporaryDirectory() as scratch:
        mono_env = {**os.environ, "MONO_JIT_CACHE_DIR": os.path.join(scratch, "mono")}
        subprocess.run([sys.executable, "-c", MONO_JIT.replace("assert not r.compiled", ""), TEMPLATE,
                        json.dumps(SPEC)], env=mono_env, check=True, capture_output=True)  # fill
        toolchain = resolve_toolchain(Settings(mono_env))
        fly_env = compile_environment(toolchain, Spec.from_dict(SPEC).arch, mono_env)
        fly_env.update(FLYDSL_RUNTIME_ENABLE_CACHE="1", FLYDSL_RUNTIME_CACHE_DIR=os.path.join(scratch, "flydsl"))
        run(FLYDSL, fly_env)  # fill FlyDSL's own disk cache
        mono = [run(MONO_JIT, mono_env) for _ in range(args.repeat)]
        fly = [run(FLYDSL, fly_env) for _ in range(args.repeat)]
    assert not any(m["flydsl_imported"] or m["torch_imported"] for m in mono), "mono-jit load imported FlyDSL/torch"
    mono_s = statistics.median(m["seconds"] for m in mono)
    fly_s = statistics.median(f["seconds"] for f in fly)
    mono_next = statistics.median(m["next_kernel"] for m in mono)
    fly_next = statistics.median(f["next_kernel"] for f in fly)
    print(f"template {TEMPLATE} spec {SPEC}, median of {args.repeat} fresh processes each")
    print(f"fresh process, first kernel: mono-jit {mono_s * 1000:.1f} ms (no FlyDSL, no torch import), "
          f"FlyDSL disk-cache hit {fly_s * 1000:.1f} ms (imports + trace + load)")
    print(f"each further kernel:         mono-jit {mono_next * 1000:.2f} ms, FlyDSL {fly_next * 1000:.1f} ms "
          f"(ratio {fly_next / mono_next:.0f})")
    print(f"ratio {fly_s / mono_s:.1f}")


if __name__ == "__main__":
    main()
