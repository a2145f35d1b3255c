"""Warm load: a cached kernel through mono-jit vs FlyDSL's own disk-cache hit, same template and
spec, each in a fresh process, timed inside the process from before its first import to the
kernel bytes in hand. Prints both figures and `ratio <flydsl / mono-jit>`.

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
r = resolve(sys.argv[1], Spec.from_dict(json.loads(sys.argv[2])))
assert not r.compiled
took = time.perf_counter() - t
print(json.dumps({"seconds": took, "bytes": len(r.hsaco), "flydsl_imported": "flydsl" in sys.modules,
                  "torch_imported": "torch" in sys.modules}))
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
print(json.dumps({"seconds": took, "bytes": len(compiled._keepalive.ir)}))
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
    print(f"template {TEMPLATE} spec {SPEC}, median of {args.repeat} fresh processes each")
    print(f"mono-jit warm load (no FlyDSL, no torch import): {mono_s * 1000:.1f} ms")
    print(f"FlyDSL disk-cache hit (import + trace + load):   {fly_s * 1000:.1f} ms")
    print(f"ratio {fly_s / mono_s:.1f}")


if __name__ == "__main__":
    main()
