"""`selftest`: is this GPU able to run the layer's kernels? With --emulate, on a machine with no
GPU: do the cached kernels compute what their references do on an emulated gfx950?"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import click

from mono_jit.cache import Entry, Store
from mono_jit.errors import MonoJitError, SpecError
from mono_jit.health import Checks

from mono_jit.spec import RATIOS, STANDARD_MAX_TOKENS, deployment_grid

from .context import cache_dir_option, settings_for
from .options import comma_ints, emit_json, guarded, json_option, plain, print_checks, say, template_option

SOURCE_TESTS = Path(__file__).resolve().parent.parent / "tests"  # a source checkout's tests/


@click.command()
@cache_dir_option
@click.option("--device", type=int, default=0, show_default=True, help="HIP device index to check.")
@click.option("--tests", "tests_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder of mono-jit's tests whose gfx950 launch tests to run (default: the source checkout's).")
@click.option("--no-launch", is_flag=True, help="Only check the device and load the cached kernels.")
@click.option("--emulate", is_flag=True,
              help="No GPU: run the cached kernels on an emulated gfx950 against their references "
                   "(needs the emulate extra).")
@template_option()
@click.option("--tp", type=int, default=8, show_default=True, help="Tensor-parallel size (with --emulate).")
@click.option("--ratio", callback=comma_ints("--ratio"), default=None,
              help="Compress ratios to check, e.g. 4,128 (with --emulate; default both).")
@click.option("--max-tokens", callback=comma_ints("--max-tokens"), default=None,
              help="Max-tokens buckets to check, e.g. 1,8 (with --emulate; default all).")
@json_option
@guarded
def selftest(cache_dir, device, tests_dir, no_launch, emulate, templates, tp, ratio, max_tokens, as_json):
    """Check the GPU (gfx950, enough CUs for the 256-CTA persistent grid, so no CPX / DPX
    partition), load every cached kernel through HIP, then run each template's gfx950 launch
    tests against its torch reference on the device (pytest -m gfx950).

    With --emulate (no GPU needed): each selected kernel of the cache (router, keytable and k1
    by default, over the deployment's grid) runs on an emulated MI355X with seeded inputs and is
    compared with its torch reference; one line (or JSON object) a kernel, exit 1 if any fails.
    A kernel missing from the cache is compiled first where FlyDSL is installed (set
    MONO_JIT_OFFLINE=1 to check only what is there). The emulator is not an MI355X: see
    docs/emulator.md for what it proves.
    """
    if emulate:
        _emulated(cache_dir, templates, tp, ratio, max_tokens, as_json)
        return
    checks = Checks()
    hip = checks.run("hip", _hip_runtime)
    if hip is not None:
        checks.run("device", lambda: _device(hip, device))
        checks.run("kernels", lambda: _load_every_kernel(hip, settings_for(cache_dir)))
        if not no_launch:
            checks.run("launch tests", lambda: _launch_tests(tests_dir or SOURCE_TESTS))
    if as_json:
        emit_json("selftest", checks.as_dict())
    else:
        print_checks(checks.rows)
    if not checks.ok:
        raise SystemExit(1)


def _emulated(cache_dir, templates, tp, ratio, max_tokens, as_json) -> None:
    from mono_jit.selfcheck import EMULATED_TEMPLATES, check_kernels

    try:
        specs = deployment_grid(tp, max_tokens_buckets=max_tokens or STANDARD_MAX_TOKENS, ratios=ratio or RATIOS)
    except SpecError as exc:
        raise click.UsageError(str(exc))
    missing = [name for name in ("numba", "tinygrad") if importlib.util.find_spec(name) is None]
    if missing:
        raise MonoJitError(f"--emulate needs the emulate extra (pip install 'mono-jit[emulate]'): "
                           f"{' and '.join(missing)} not installed")
    progress = None if as_json else (lambda what: say(f"emulating {what} ..."))
    results = check_kernels(templates or EMULATED_TEMPLATES, specs, settings_for(cache_dir), progress=progress)
    if as_json:
        emit_json("selftest", {"emulated": True, "ok": all(r.ok for r in results),
                               "kernels": [r.as_dict() for r in results]})
    else:
        for r in results:
            figure = f"{r.measure} {r.error:.3g} (bound {r.bound:.3g})" if r.ok else r.problem
            say(f"{'ok  ' if r.ok else 'FAIL'} {r.template} {plain(r.spec)}: {figure}; "
                f"{r.wave_instructions:,} wave-instructions, {r.bytes_read:,} bytes read, {r.seconds:.1f} s")
        failed = sum(not r.ok for r in results)
        say(f"{len(results) - failed} of {len(results)} kernels match their references on the emulator")
    if not all(r.ok for r in results):
        raise SystemExit(1)


def _hip_runtime():
    from mono_jit.runtime.hip import Hip

    return Hip.get()


def _device(hip, index: int) -> dict:
    import torch

    from mono_jit.runtime.runner import BLOCKS

    if not torch.cuda.is_available() or getattr(torch.version, "hip", None) is None:
        raise MonoJitError("torch has no ROCm device: the launch tests need a ROCm build of torch")
    arch = torch.cuda.get_device_properties(index).gcnArchName.split(":")[0]
    cus = hip.compute_units(index)
    if arch != "gfx950":
        raise MonoJitError(f"device {index} is {arch}: the kernels are built for gfx950 (MI355X)")
    if cus < BLOCKS:
        raise MonoJitError(f"device {index} has {cus} CUs: a persistent launch needs {BLOCKS} resident CTAs "
                           "(a CPX / DPX partition or a CU mask would hang it); use SPX mode")
    return {"arch": arch, "compute_units": cus}


def _load_every_kernel(hip, settings) -> dict:
    loaded, bad = 0, []
    for entry in Store(settings).entries():
        if not isinstance(entry, Entry):
            bad.append(str(entry[0]))
            continue
        for launch in entry.meta["launches"]:
            hip.load(entry.hsaco, launch["kernel"])
            loaded += 1
    if bad:
        raise MonoJitError(f"{len(bad)} cache entries failed verification: {', '.join(bad[:3])}")
    return {"loaded": loaded}


def _launch_tests(folder: Path) -> str:
    if not (folder / "test_gpu.py").is_file():
        raise MonoJitError(f"no launch tests at {folder}: pass --tests with a source checkout's tests/ folder")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gfx950", "-rs", str(folder)],
                         capture_output=True, text=True)
    summary = (run.stdout.strip().splitlines() or ["no output"])[-1]
    if run.returncode != 0 or "passed" not in summary:  # all skipped: no device test ran
        raise MonoJitError(f"gfx950 launch tests: {summary}")
    return summary


COMMANDS = (selftest,)
