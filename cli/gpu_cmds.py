"""`selftest`: is this GPU able to run the layer's kernels? With --emulate, on a machine with no
GPU: do the cached kernels compute what their references do on an emulated gfx950?"""

from __future__ import annotations

import importlib.util

import click

from mono_jit.cache import Entry, Store
from mono_jit.errors import MonoJitError, SpecError
from mono_jit.health import Checks
from mono_jit.spec import RATIOS, STANDARD_MAX_TOKENS, deployment_grid

from .context import cache_dir_option, settings_for
from .options import comma_ints, emit_json, guarded, json_option, note, plain, print_checks, say, template_option


@click.command()
@cache_dir_option
@click.option("--device", type=int, default=0, show_default=True, help="HIP device index to check.")
@click.option("--no-launch", is_flag=True, help="Only check the device and load the cached kernels.")
@click.option("--emulate", is_flag=True,
              help="No GPU: run the cached kernels on an emulated gfx950 against their references "
                   "(needs the emulate extra).")
@template_option()
@click.option("--tp", type=int, default=8, show_default=True, help="Tensor-parallel size of the kernels launched.")
@click.option("--ratio", callback=comma_ints("--ratio"), default=None,
              help="Compress ratios to launch, e.g. 4,128 (default both).")
@click.option("--max-tokens", callback=comma_ints("--max-tokens"), default=None,
              help="Max-tokens buckets to launch, e.g. 1,8 (default all).")
@json_option
@guarded
def selftest(cache_dir, device, no_launch, emulate, templates, tp, ratio, max_tokens, as_json):
    """Check the GPU (gfx950, enough CUs for the 256-CTA persistent grid, so no CPX / DPX
    partition), load every cached kernel through HIP, then launch each selected kernel of the
    cache (router, keytable and k1 by default, over the deployment's grid) on the device with
    seeded inputs and compare it with its torch reference. The checks come with the package: no
    source checkout is needed. With no GPU, says so and what --emulate would check instead.

    With --emulate (no GPU needed): the same launch checks on an emulated MI355X, and K2 on 8
    emulated ranks sharing peer memory (all four templates by default); one line (or JSON
    object) a kernel, exit 1 if any fails. A kernel missing from the cache is compiled
    first where FlyDSL is installed (set MONO_JIT_OFFLINE=1 to check only what is there). The
    emulator is not an MI355X: see docs/emulator.md for what it proves.
    """
    specs = _grid(tp, ratio, max_tokens)
    if emulate:
        _emulated(cache_dir, templates, specs, as_json)
        return
    checks, runtimes = Checks(), []
    checks.run("hip", lambda: _hip_runtime(runtimes))
    hip = runtimes[0] if runtimes else None
    if hip is None:
        missing = _missing_emulate_extra()
        note("no GPU here (no HIP runtime): the device, the kernel loads and the launch checks were not run; "
             "mono-jit selftest --emulate runs the same launch checks on an emulated gfx950"
             + (f" (it needs the emulate extra: {' and '.join(missing)} not installed)" if missing else ""))
    else:
        checks.run("device", lambda: _device(hip, device))
        checks.run("kernels", lambda: _load_every_kernel(hip, settings_for(cache_dir)))
        if not no_launch and checks.ok:
            checks.run("launch checks", lambda: _launch_checks(cache_dir, templates, specs, device))
    if as_json:
        emit_json("selftest", checks.as_dict())
    else:
        print_checks(checks.rows)
    if not checks.ok:
        raise SystemExit(1)


def _grid(tp: int, ratio: tuple[int, ...] | None, max_tokens: tuple[int, ...] | None) -> list:
    try:
        return deployment_grid(tp, max_tokens_buckets=max_tokens or STANDARD_MAX_TOKENS, ratios=ratio or RATIOS)
    except SpecError as exc:
        raise click.UsageError(str(exc))


def _launch_checks(cache_dir, templates, specs, device: int) -> str:
    """The package's launch checks (mono_jit.selfcheck) on the GPU: a line naming every failure."""
    from mono_jit.selfcheck import DEVICE_TEMPLATES, check_kernels
    from mono_jit.selfcheck.device import DeviceBackend

    results = check_kernels(templates or DEVICE_TEMPLATES, specs, settings_for(cache_dir),
                            backend=lambda: DeviceBackend(device))
    failed = [f"{r.template} {plain(r.spec)}: {r.problem}" for r in results if not r.ok]
    if failed:
        raise MonoJitError(f"{len(failed)} of {len(results)} kernels differ from their references on the device: "
                           + "; ".join(failed))
    return f"{len(results)} kernels match their references on the device"


def _emulated(cache_dir, templates, specs, as_json) -> None:
    from mono_jit.selfcheck import EMULATED_TEMPLATES, check_kernels

    missing = _missing_emulate_extra()
    if missing:
        raise MonoJitError(f"--emulate needs mono-jit's emulate extra: {' and '.join(missing)} not installed")
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


def _missing_emulate_extra() -> list[str]:
    return [name for name in ("numba", "tinygrad") if importlib.util.find_spec(name) is None]


def _hip_runtime(found: list) -> dict:
    """Loads the HIP runtime into `found`; the check's detail is the library's name."""
    from mono_jit.runtime.hip import Hip

    hip = Hip.get()
    found.append(hip)
    return {"library": getattr(hip._lib, "_name", None) or "libamdhip64"}


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


COMMANDS = (selftest,)
