"""The example plug-in (examples/vecadd) as a user installs it: pip into a folder of its own,
then `mono-jit prebuild --template vecadd` compiles it for real; a plain prebuild leaves it out
unless MONO_JIT_PREBUILD_TEMPLATES names it; the entry serves, packs and matches its reference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mono_jit.pipeline.deployment import LAYER_TEMPLATES

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "vecadd"
MONO_JIT = Path(sys.executable).with_name("mono-jit")


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    """examples/vecadd pip-installed into a folder of its own (on PYTHONPATH, not in the venv)."""
    folder = tmp_path_factory.mktemp("plugin") / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                    "--no-build-isolation", "--target", str(folder), str(EXAMPLE)], check=True, capture_output=True)
    return folder


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("plugin-cache") / "cache"


def run(args: list[str], target: Path, cache: Path, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONO_JIT_")}
    env.update(PYTHONPATH=str(target), MONO_JIT_CACHE_DIR=str(cache), **extra)
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)


def test_the_installed_example_prebuilds_by_name(target, cache):
    out = run([str(MONO_JIT), "prebuild", "--template", "vecadd", "--max-tokens", "1,2", "--json"], target, cache)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout)
    assert summary["compiled"] == 2 and summary["failed"] == 0  # one build per bucket: ratios share one
    assert {e["template"] for e in summary["entries"]} == {"vecadd"}
    listed = run([str(MONO_JIT), "list", "--json"], target, cache)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert {row["template"] for row in json.loads(listed.stdout)["entries"]} == {"vecadd"}


SERVE = """
import json, torch
from mono_jit import Spec, resolve
from mono_jit.templates.kernargs import pack
from mono_jit_vecadd import WIDTH
from mono_jit_vecadd.reference import run

r = resolve("vecadd", Spec(tp=8, ratio=4, topk_width=1024, max_tokens=2))
a, b, out = torch.randn(2 * WIDTH), torch.randn(2 * WIDTH), torch.zeros(2 * WIDTH)
values = {"a": a, "b": b, "out": out, "m": 1}
kernargs = pack(r.meta, values)
run(values)
print(json.dumps({"compiled": r.compiled, "kernargs": len(kernargs), "launch": r.meta.launch.to_json(),
                  "first_row": bool(torch.equal(out[:WIDTH], a[:WIDTH] + b[:WIDTH])),
                  "second_row_untouched": bool(torch.count_nonzero(out[WIDTH:]) == 0)}))
"""


def test_the_example_serves_packs_its_kernargs_and_matches_its_reference(target, cache):
    out = run([sys.executable, "-c", SERVE], target, cache, MONO_JIT_OFFLINE="1")
    assert out.returncode == 0, out.stderr[-3000:]
    served = json.loads(out.stdout)
    assert served["compiled"] is False  # a hit from the prebuild above
    # three tensors (8-byte pointer + i32 length, the next pointer 8-aligned), then m after the last length
    assert served["kernargs"] == 16 + 16 + 12 + 4
    assert served["launch"] == {"grid": [2, 1, 1], "block": [256, 1, 1], "dynamic_lds": 0}
    assert served["first_row"] and served["second_row_untouched"]


@pytest.mark.slow
def test_a_plain_prebuild_builds_the_plugin_only_when_configured(target, cache):
    plain = [str(MONO_JIT), "prebuild", "--max-tokens", "1", "--ratio", "4", "--json"]
    layer = {name for name in LAYER_TEMPLATES if name in _registered(target)}
    out = run(plain, target, cache)
    assert out.returncode == 0, out.stderr[-3000:]
    assert {e["template"] for e in json.loads(out.stdout)["entries"]} == layer
    configured = run(plain, target, cache, MONO_JIT_PREBUILD_TEMPLATES="vecadd")
    assert configured.returncode == 0, configured.stderr[-3000:]
    summary = json.loads(configured.stdout)
    assert {e["template"] for e in summary["entries"]} == layer | {"vecadd"}
    assert summary["compiled"] == 0  # the layer's and vecadd's bucket 1 were built above


def _registered(target: Path) -> set[str]:
    code = "import json; from mono_jit.templates import names; print(json.dumps(names()))"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(target)},
                         capture_output=True, text=True, check=True)
    names = set(json.loads(out.stdout))
    assert "vecadd" in names and "k1" in names
    return names
