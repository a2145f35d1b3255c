"""The runtime's entry point: verified HSACO bytes and metadata for one template and spec.

``resolve`` checks the store (read-only layers, then the writable one); on a miss it takes the
key's lock, checks again and compiles in an isolated worker, so eight ranks starting together
compile each key once. A process with no toolchain to fingerprint (no FlyDSL or ld.lld, as on
a lean serving image) looks the spec up under the toolchains recorded in the layers instead. ``MONO_JIT_OFFLINE=1`` makes a miss an error naming the prebuild command.
Inside a CUDA/HIP graph capture it raises before touching the disk. It imports neither torch
nor FlyDSL (a compile happens in a worker process).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from mono_jit.cache import Entry, Store

from .build import BuildJob
from .config import Settings
from .errors import CaptureError, OfflineMiss, ToolchainError
from .spec import Spec
from .templates import Template, get
from .toolchain import compile_environment, resolve_toolchain


@dataclass(frozen=True)
class Resolved:
    entry: Entry
    compiled: bool  # True when this call compiled it

    @property
    def hsaco(self) -> bytes:
        return self.entry.hsaco

    @property
    def meta(self) -> dict:
        return self.entry.meta


def _capturing() -> bool:
    """True inside a CUDA/HIP graph capture on the current stream (only if torch is loaded)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
    except Exception:
        return False


def prebuild_command(job: BuildJob) -> str:
    spec = job.spec
    return (f"mono-jit prebuild --template {job.template.name} --tp {spec.tp} --ratio {spec.ratio} "
            f"--max-tokens {spec.max_tokens}")


def compile_job(job: BuildJob, store: Store, env: dict[str, str], timeout: float) -> Entry:
    """Compile one job in a fresh worker and publish it (the caller holds the key's lock)."""
    from .compiler import compile_here  # the miss path only: a hit never loads the compile side
    from .workers import WorkerPool

    with WorkerPool(1, env, compile_here, timeout) as pool:
        (outcome,) = pool.run([(job.key, job.worker_args())])
    return job.finish(store, outcome)


def _resolve_without_toolchain(template: Template, spec: Spec, store: Store, unavailable: ToolchainError) -> Resolved:
    """No toolchain to fingerprint here (a serving host without FlyDSL or ld.lld): look the spec
    up under each toolchain that built entries in the layers; nothing can be compiled."""
    for fingerprint in store.recorded_toolchains(spec.arch):
        job = BuildJob.plan(template, spec, fingerprint)
        entry = store.lookup(job.key, job.arch)
        if entry is not None:
            return Resolved(entry, compiled=False)
    raise ToolchainError(
        f"{template.name} [{spec.label()}] is in no cache layer under any recorded toolchain, and it cannot "
        f"be compiled here: {unavailable}"
    )


def resolve(template: str | Template, spec: Spec, *, settings: Settings | None = None,
            store: Store | None = None) -> Resolved:
    if _capturing():
        raise CaptureError(
            f"mono-jit resolve({template if isinstance(template, str) else template.name}, {spec.label()}) "
            "was called during a graph capture: resolve every kernel in the eager warm-up step"
        )
    settings = settings or Settings()
    store = store or Store(settings)
    template = get(template) if isinstance(template, str) else template
    try:
        toolchain = resolve_toolchain(settings)
    except ToolchainError as unavailable:
        return _resolve_without_toolchain(template, spec, store, unavailable)
    job = BuildJob.plan(template, spec, toolchain.fingerprint)
    entry = store.lookup(job.key, job.arch)
    if entry is not None:
        return Resolved(entry, compiled=False)
    if settings.offline:
        raise OfflineMiss(
            f"{job.label} [{spec.label()}] is not in the cache (key {job.key[:16]}) and MONO_JIT_OFFLINE=1; "
            f"fill it with: {prebuild_command(job)}  (mono-jit explain shows why it missed)"
        )
    from mono_jit.cache.lock import single_flight  # filelock: only a miss needs it

    with single_flight(settings.locks(), job.key, settings.lock_timeout, job.label):
        entry = store.lookup(job.key, job.arch)
        if entry is not None:
            return Resolved(entry, compiled=False)
        env = compile_environment(toolchain, spec.arch)
        return Resolved(compile_job(job, store, env, settings.compile_timeout), compiled=True)
