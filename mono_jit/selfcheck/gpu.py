"""`selftest` on a GPU: the device (gfx950, enough CUs for the 256-CTA persistent grid), every
cached kernel loaded through HIP, then the package's launch checks on the device; each a row of
Checks. Without a HIP runtime the first check fails saying so, and nothing else runs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..cache import Entry, Store
from ..config import Settings
from ..errors import MonoJitError
from ..commands.doctor import Checks
from ..spec import Spec

if TYPE_CHECKING:
    from ..runtime.hip import Hip


def check_gpu(settings: Settings, templates: tuple[str, ...] | None, specs: list[Spec], device: int,
              launch: bool) -> Checks:
    """The rows hip, device, kernels and (with `launch`, when the others passed) launch checks."""
    checks = Checks()
    runtimes: list[Hip] = []
    checks.run("hip", lambda: hip_runtime(runtimes))
    if not runtimes:
        return checks
    hip = runtimes[0]
    checks.run("device", lambda: device_fits(hip, device))
    checks.run("kernels", lambda: load_every_kernel(hip, settings))
    if launch and checks.ok:
        checks.run("launch checks", lambda: launch_checks(settings, templates, specs, device))
    return checks


def hip_runtime(found: list) -> dict:
    """Loads the HIP runtime into `found`; the check's detail is the library's name."""
    from ..runtime.hip import Hip

    hip = Hip.get()
    found.append(hip)
    return {"library": getattr(hip._lib, "_name", None) or "libamdhip64"}


def device_fits(hip: Any, index: int) -> dict:
    """Device `index` is a gfx950 with every CU a persistent launch needs (SPX mode)."""
    import torch

    from ..runtime.runner import BLOCKS

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


def load_every_kernel(hip: Any, settings: Settings) -> dict:
    """Every kernel of every verified entry loaded through HIP; a bad entry fails the check."""
    loaded, bad = 0, []
    for entry in Store(settings).entries():
        if not isinstance(entry, Entry):
            bad.append(str(entry[0]))
            continue
        for launch in entry.meta.launches:
            hip.load(entry.hsaco, launch.kernel)
            loaded += 1
    if bad:
        raise MonoJitError(f"{len(bad)} cache entries failed verification: {', '.join(bad[:3])}")
    return {"loaded": loaded}


def launch_checks(settings: Settings, templates: tuple[str, ...] | None, specs: list[Spec], device: int) -> str:
    """The package's launch checks on the GPU: a line naming every failure."""
    from . import DEVICE_TEMPLATES, check_kernels
    from .device import DeviceBackend

    results = check_kernels(templates or DEVICE_TEMPLATES, specs, settings, backend=lambda: DeviceBackend(device))
    failed = [f"{r.template} {', '.join(f'{k}={v}' for k, v in r.spec.items())}: {r.problem}"
              for r in results if not r.ok]
    if failed:
        raise MonoJitError(f"{len(failed)} of {len(results)} kernels differ from their references on the device: "
                           + "; ".join(failed))
    return f"{len(results)} kernels match their references on the device"
