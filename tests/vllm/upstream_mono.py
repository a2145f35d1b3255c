"""vLLM 0.33's in-tree mono K1 and K2 (`build_mono_k1` / `build_mono_k2`, run on MI355X in
production) as mono-jit template plug-ins, to calibrate the emulator on hardware-proven code.

Nothing of vLLM's or AITER's is copied into the project. `write_plugin(folder, helpers)` lays out,
in a folder of the caller's (a test's tmp folder):

- `aiter/ops/flydsl/kernels/`: links to AITER's `buffer_ops.py` and `dpp_utils.py` in the folder
  `MONO_JIT_AITER_HELPERS` names, and a `kernels_common.kernel_signature` stand-in (the commit
  of those helpers has none) that joins `key + value` with `_`, bools as 0 / 1, which gives
  upstream's kernel symbols;
- per kernel (`KERNELS`), `mono_jit_upstream_<kernel>/`: the template class (a subclass of
  `UpstreamK1` / `UpstreamK2` below, so its source root is that folder) and `kernel.py`, a
  generated `@flyc.jit` launcher: one leading `fx.Tensor` compile placeholder (upstream's
  launchers take only scalars, and FlyDSL compiles without launching only when an argument is a
  CPU tensor), then upstream's parameters, read from vLLM's `layer.py` with `ast`, passed to
  upstream's launcher, which FlyDSL traces inline;
- a `*.dist-info/entry_points.txt` declaring them in the `mono_jit.templates` group.

Put the folder on `sys.path` (compile workers get the caller's) and the templates are found like
any installed plug-in. This module imports neither torch nor FlyDSL.
"""

from __future__ import annotations

import ast
import hashlib
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

from mono_jit.hsaco.resources import Budget
from mono_jit.spec import Spec
from mono_jit.templates import Argument, LaunchShape, Template

HELPERS_ENV = "MONO_JIT_AITER_HELPERS"
HELPER_FILES = ("buffer_ops.py", "dpp_utils.py")
VLLM_MONO = "vllm.models.deepseek_v4.amd.mono"
DIST = "mono_jit_upstream_mono"
BLOCKS, THREADS = 256, 512  # upstream's launch shape (common/plan.py, attention/device.py)
KERNELS = ("k1", "k2")
# sha256 (first 16 hex digits) and size of the builds found byte-identical to FlyDSL's own artifact
# of upstream's unchanged launcher (TP8; same toolchain as ours): docs/emulator.md lists them
DIGESTS = {
    "k1": {Spec(8, 4, 1024, 1): ("ae7685fc77ffe833", 26_896), Spec(8, 4, 1024, 64): ("fd6e55554017f818", 54_680),
           Spec(8, 128, 8192, 1): ("e665dccac90ea488", 26_920)},
    "k2": {Spec(8, 4, 1024, 1): ("35175e987c261f91", 85_072), Spec(8, 128, 8192, 1): ("45f1d42b047e0e91", 85_024),
           Spec(8, 4, 1024, 64): ("ee4f61ee04304aff", 150_552)},
}


def template_name(kernel: str) -> str:
    """The plug-in template's name for upstream's `kernel` ("k1" / "k2")."""
    return f"upstream_{kernel}"


def package_name(kernel: str) -> str:
    return f"mono_jit_upstream_{kernel}"


def kernel_symbol(kernel: str, spec: Spec) -> str:
    """The mangled symbol upstream gives a build of `mono_build(spec)`: `aiter::dsv4_mono_<kernel>_`
    then its key (K1's with the fold flag), then the variant flags it sets (top-k, global keys,
    two hops), each `key + value`."""
    build = mono_build(spec)
    parts = dict(s=spec.max_tokens, tp=spec.tp, r=spec.ratio, tl=0, **({"f": 1} if kernel == "k1" else {}))
    parts.update({flag: value for flag, value in (("k", build["topk"]), ("g", int(build["global_keys"])),
                                                  ("a", 2 * build["two_hop"])) if value})
    name = f"dsv4_mono_{kernel}_" + "_".join(f"{k}{v}" for k, v in parts.items())
    return f"_ZN5aiter{len(name)}{name}E"


def helpers_problem() -> str | None:
    """Why the AITER helpers cannot be used (a test's skip reason), or None."""
    folder = os.environ.get(HELPERS_ENV)
    if not folder:
        return f"{HELPERS_ENV} is unset: point it at a folder holding AITER's {' and '.join(HELPER_FILES)}"
    missing = [f for f in HELPER_FILES if not (Path(folder) / f).is_file()]
    if missing:
        return f"{HELPERS_ENV}={folder} lacks {', '.join(missing)}"
    return None


def vllm_mono_dir() -> Path:
    """The installed vLLM's mono package folder (found without importing vLLM)."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("vllm is not installed")
    return Path(spec.origin).parent / "models" / "deepseek_v4" / "amd" / "mono"


def upstream_parameters(layer_py: Path, kernel: str = "k1") -> list[tuple[str, str]]:
    """(name, annotation) of `build_mono_<kernel>`'s launcher parameters, in order, stream excluded."""
    tree = ast.parse(layer_py.read_text())
    build = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == f"build_mono_{kernel}")
    launch = next(n for n in ast.walk(build) if isinstance(n, ast.FunctionDef) and n.name == "launch")
    out = [(a.arg, ast.unparse(a.annotation)) for a in launch.args.args if a.arg != "stream"]
    assert all(kind in ("Int64", "Int32") for _, kind in out), out
    return out


def mono_build(spec: Spec) -> dict[str, Any]:
    """`layer.MonoBuild`'s fields for a non-hash layer past layer 0: the bucket's rows, the TP and
    ratio; top-k 0 (the model's) on CSA, the width with global keys on HCA; two hops from vLLM's
    TWO_HOP_ROWS rows; fold on; hash routing and timeline off."""
    hca = spec.ratio == 128
    return dict(tokens=spec.max_tokens, tp=spec.tp, ratio=spec.ratio, topk=spec.topk_width if hca else 0,
                global_keys=hca, two_hop=spec.max_tokens >= 42, fold=True, hash_route=False, timeline=False)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


KERNEL = '''"""Generated by tests/vllm/upstream_mono.py: vLLM's build_mono_{kernel} launcher behind one
fx.Tensor compile placeholder (nothing of vLLM's copied). The digests below put upstream's sources
and the AITER helpers in this file's bytes, so in the template's cache key."""

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch
from flydsl.expr.typing import Int32, Int64
from {vllm}.layer import MonoBuild, build_mono_{kernel}
from upstream_mono import mono_build

from mono_jit.templates import Build

UPSTREAM_SOURCES = {sources!r}
HELPERS = {helpers!r}


def build(spec):
    upstream = build_mono_{kernel}(MonoBuild(**mono_build(spec)))

    @flyc.jit
    def launch_upstream_{kernel}(anchor: fx.Tensor, {params}, stream: fx.Stream = fx.Stream(None)):
        upstream({names}, stream=stream)

    return Build(launch_upstream_{kernel}, (torch.empty(1, dtype=torch.uint8),) + (0,) * {count})
'''

INIT = '''"""Generated by tests/vllm/upstream_mono.py: the upstream_{kernel} template, rooted in this folder."""

from upstream_mono import {base}


class {base}Template({base}):
    source_files = ("__init__.py", "kernel.py")
    kernel_module = ".kernel"
'''


def _write_aiter(folder: Path, helpers: Path) -> None:
    kernels = folder / "aiter" / "ops" / "flydsl" / "kernels"
    kernels.mkdir(parents=True)
    for package in (kernels, *kernels.parents[:3]):
        (package / "__init__.py").write_text("")
    for name in HELPER_FILES:
        (kernels / name).symlink_to((helpers / name).resolve())
    (kernels / "kernels_common.py").write_text(
        '"""A stand-in for AITER\'s kernel_signature (tests/vllm/upstream_mono.py)."""\n\n\n'
        "def kernel_signature(**params):\n"
        "    return '_'.join(f'{k}{int(v) if isinstance(v, bool) else v}' for k, v in params.items())\n")


def write_plugin(folder: Path, helpers: Path) -> None:
    """Lay the plug-ins of both kernels and the AITER package out in `folder` (see the module docstring)."""
    _write_aiter(folder, helpers)
    mono = vllm_mono_dir()
    sources = hashlib.sha256(b"".join(_digest(p).encode() for p in sorted(mono.rglob("*.py")))).hexdigest()
    for kernel in KERNELS:
        params = upstream_parameters(mono / "layer.py", kernel)
        package = folder / package_name(kernel)
        package.mkdir()
        (package / "__init__.py").write_text(INIT.format(kernel=kernel, base=f"Upstream{kernel.upper()}"))
        (package / "kernel.py").write_text(KERNEL.format(
            kernel=kernel, vllm=VLLM_MONO, sources=sources, helpers={n: _digest(helpers / n) for n in HELPER_FILES},
            params=", ".join(f"{n}: {t}" for n, t in params), names=", ".join(n for n, _ in params),
            count=len(params)))
    dist = folder / f"{DIST}-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST}\nVersion: 0\n")
    (dist / "entry_points.txt").write_text("[mono_jit.templates]\n" + "".join(
        f"{template_name(k)} = {package_name(k)}:Upstream{k.upper()}Template\n" for k in KERNELS))


class UpstreamMono(Template):
    """vLLM 0.33's K1 or K2 (`kernel`) at a spec (`mono_build`); its arguments are upstream's
    launcher's, every one an Int64 device address (or byte stride) or an Int32, as vLLM's
    mono/runner.py fills them."""

    kernel = ""
    spec_fields = ("tp", "ratio", "topk_width", "max_tokens")
    persistent = True

    def launch_shape(self, spec: Spec) -> LaunchShape:
        return LaunchShape(grid=(BLOCKS, 1, 1), block=(THREADS, 1, 1))

    def arguments(self, spec: Spec) -> tuple[Argument, ...]:
        return tuple(Argument.i64(n, "upstream's Int64") if t == "Int64" else Argument.i32(n, "upstream's Int32")
                     for n, t in upstream_parameters(vllm_mono_dir() / "layer.py", self.kernel))


class UpstreamK1(UpstreamMono):
    kernel = "k1"
    name = template_name(kernel)
    budget = Budget(scratch_bytes=8, spills=1)  # upstream's s64: one VGPR spilled to 8 B of scratch


class UpstreamK2(UpstreamMono):
    kernel = "k2"
    name = template_name(kernel)
    # upstream's widest: s1 r4 spills 9 VGPR + 112 SGPR to 40 B of scratch, s1 r128 12 + 126 to 52 B,
    # s8 r4 13 + 211, s8 r128 17 + 233, s64 r4 66 + 99 to 180 B
    budget = Budget(scratch_bytes=256, spills=256)


@contextmanager
def prebuilt(builds: dict[str, Iterable[Spec]], folder: Path, cache: Path, helpers: Path
             ) -> Iterator[dict[tuple[str, Spec], Any]]:
    """Upstream's kernels prebuilt (`builds`: kernel -> specs) as any installed plug-in is (the
    plug-ins laid out in `folder` and put on sys.path; mono-jit's compile workers, kernarg and
    resource checks, its cache in `cache`): {(kernel, spec): cache entry} of every upstream build
    that cache holds. The plug-ins are known inside the block only."""
    import pytest
    from cache_settings import settings_at

    from mono_jit.cache import Store
    from mono_jit.pipeline.prebuild import prebuild
    from mono_jit.templates import get, registry

    write_plugin(folder, helpers)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(folder))
        for attr in ("_registry", "_added", "_failed"):
            patch.setattr(registry, attr, dict(getattr(registry, attr)))
        settings = settings_at(cache)
        for kernel, specs in builds.items():
            summary, _ = prebuild([get(template_name(kernel))], list(specs), settings, jobs=1, timeout=1800)
            assert not summary.failed, summary.failed
        kernel_of = {template_name(k): k for k in KERNELS}
        try:
            yield {(kernel_of[e.meta.template], Spec.from_dict(e.meta.spec)): e for e in Store(settings).entries()
                   if e.meta.template in kernel_of}  # the cache may hold other templates' builds
        finally:
            for module in [m for m in sys.modules if m.startswith("mono_jit_upstream_")]:
                sys.modules.pop(module)
