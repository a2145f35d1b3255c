"""`mono-jit selftest`'s launch checks, shipped with the package: every selected kernel of the
cache run with seeded inputs against its torch reference, on the GPU (`selftest`) or on an
emulated gfx950 (`selftest --emulate`, so that a build machine with no GPU checks an image's
kernels before it ships). The same worlds and comparisons drive the test suite."""

from __future__ import annotations

import functools
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ..config import Settings
from ..emulator.errors import EmulatorError
from ..errors import MonoJitError
from ..spec import Spec
from ..templates import get

if TYPE_CHECKING:
    from ..runtime.backends import Backend

EMULATED_TEMPLATES = ("router", "keytable", "k1", "k2")
DEVICE_TEMPLATES = ("router", "keytable", "k1")  # K2 needs 8 GPUs and their peer memory: emulated only


@dataclass
class KernelCheck:
    """One kernel's emulated launch against its reference."""

    template: str
    spec: dict[str, Any]
    ok: bool
    error: float | None  # the case's figure of merit (see `measure`), None if it did not run
    bound: float | None
    measure: str
    problem: str | None  # why it failed, None when ok
    wave_instructions: int
    bytes_read: int
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_kernels(templates: Iterable[str], specs: Iterable[Spec], settings: Settings, seed: int = 0,
                  progress: Callable[[str], None] | None = None,
                  backend: Callable[[], Backend] | None = None) -> list[KernelCheck]:
    """Each distinct (template, spec) of the selection, resolved from the cache and launched on
    the emulator (or on a fresh `backend()` each: the GPU's) against its reference; a failure is
    recorded, never raised."""
    from .cases import CASES
    from .emulated import RanksLaunch, emulated_launcher

    names, specs = list(templates), list(specs)
    allowed = DEVICE_TEMPLATES if backend else EMULATED_TEMPLATES
    unknown = [n for n in names if n not in allowed]
    if unknown:
        why = " (K2 needs 8 GPUs: its launch check runs on 8 emulated ranks, with --emulate)" if backend else ""
        raise MonoJitError(f"selftest launches {', '.join(allowed)}; not {', '.join(unknown)}{why}")
    results = []
    for name in names:
        tpl, seen = get(name), set()
        for spec in specs:
            key = repr(sorted(tpl.key_spec(spec).items()))
            if key in seen:
                continue
            seen.add(key)
            if progress:
                progress(f"{name} {spec.label()}")
            launcher = (RanksLaunch if name == "k2" else
                        functools.partial(emulated_launcher, backend=backend() if backend else None))
            results.append(_one(name, spec, settings, seed, CASES[name], launcher))
    return results


def _one(name: str, spec: Spec, settings: Settings, seed: int, case, emulated_launcher) -> KernelCheck:
    start = time.perf_counter()
    error = bound = None
    measure, problem, launch = "", None, None
    try:
        launch = emulated_launcher(name, spec, settings)
        result = case(spec, launch, seed)
        error, bound, measure = result.error, result.bound, result.what
    except AssertionError as mismatch:
        problem = _summary(mismatch) or "an output differs from the reference"
    except Exception as failure:
        # mono-jit's own errors (a miss, a failed compile) are one line already; an emulator fault,
        # hang or refusal (the kernel did not run right), or anything else, is named with its kind
        own = isinstance(failure, MonoJitError) and not isinstance(failure, EmulatorError)
        problem = str(failure) if own else f"{type(failure).__name__}: {failure}"
    report = getattr(getattr(launch, "backend", None), "last_report", None)  # the launch ran, even if it disagreed
    return KernelCheck(name, spec.as_dict(), problem is None, error, bound, measure, problem,
                       report.wave_instructions if report else 0, report.bytes_read if report else 0,
                       round(time.perf_counter() - start, 3))


def _summary(mismatch: AssertionError) -> str:
    """torch's multi-line comparison message as one line."""
    return "; ".join(line.strip() for line in str(mismatch).splitlines() if line.strip())
