"""A miss, written once: the steps every caller that fills a missing key takes, in this order,
the way FlashInfer's ``JitSpec.build_and_load`` keeps a build's steps in one place:

1. look up the key in the layers (the caller's first look, a hit or a miss, is counted there);
2. take the key's lock: ``resolve`` waits for it (`locked`: one key, nothing else held); a
   prebuild's pool opens it (`open_lock`) and only tries it while the run holds another lock,
   waiting only when it holds none (so two runs never wait for each other);
3. look up again, under the lock: another process may have filled it meanwhile (`recheck`);
4. fetch it from the registry tier (``MONO_JIT_REMOTE``), verified and published (`recheck`);
5. compile it in a fresh worker (`pool`; ``verify --rebuild`` compiles on the same pool);
6. check and publish the result (`publish`, BuildJob.finish), offered to the registry when
   ``MONO_JIT_REMOTE_PUSH`` allows;
7. count compiles and failures in the run's counters, with its hits and misses (cache/stats.py).

Nothing here is imported on a cache hit: the lock, the workers and the compiler load on a miss.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from mono_jit.cache import Entry, Store
from mono_jit.cache.stats import Counters

from .job import BuildJob
from ..config import Settings
from ..errors import MonoJitError
from .toolchain import Toolchain, compile_environment

if TYPE_CHECKING:
    from mono_jit.cache.lock import KeyLock
    from mono_jit.cache.oci.tier import RemoteTier

    from .workers import Outcome, WorkerPool


def registry_tier(settings: Settings) -> RemoteTier | None:
    """The registry tier of MONO_JIT_REMOTE for one run, or None when it is not set."""
    if settings.remote is None:
        return None
    from mono_jit.cache.oci.tier import RemoteTier

    return RemoteTier(settings)


def compile_pool(toolchain: Toolchain, arch: str, jobs: int, timeout: float) -> WorkerPool:
    """`jobs` fresh compile workers for `arch`, in the toolchain's clean environment."""
    from .compile import compile_here, load_compiler
    from .workers import WorkerPool

    return WorkerPool(jobs, compile_environment(toolchain, arch), compile_here, timeout, load_compiler)


class Misses:
    """The misses of one run (a resolve session, a prebuild): the store they fill, the settings
    (lock folder and timeout, shared roots), this host's toolchain (None: nothing compiles
    here), the registry tier and the run's counters."""

    def __init__(self, settings: Settings, store: Store, toolchain: Toolchain | None,
                 remote: RemoteTier | None, counts: Counters) -> None:
        self.settings, self.store, self.toolchain, self.remote, self.counts = settings, store, toolchain, remote, counts
        self._lock_dir: Path | None = None

    def lock_dir(self) -> Path:
        """The lock folder, created and trust-checked once a run."""
        if self._lock_dir is None:
            from mono_jit.cache.lock import prepare_lock_dir

            self._lock_dir = prepare_lock_dir(self.settings.locks(), bool(self.settings.allow_shared_roots))
        return self._lock_dir

    def open_lock(self, job: BuildJob) -> KeyLock:
        """The key's lock file, opened, not taken (KeyLock.try_acquire / acquire take it)."""
        from mono_jit.cache.lock import KeyLock

        return KeyLock(self.lock_dir(), job.key, job.label)

    @contextmanager
    def locked(self, job: BuildJob) -> Iterator[None]:
        """Hold the key's lock for the body, waiting for it (LockTimeout past the lock timeout)."""
        from mono_jit.cache.lock import single_flight

        with single_flight(self.lock_dir(), job.key, float(self.settings.lock_timeout),  # type: ignore[arg-type]
                           job.label, bool(self.settings.allow_shared_roots)):
            yield

    def recheck(self, job: BuildJob, then: str = "compiling it here") -> tuple[Entry | None, bool]:
        """Under the key's lock: (the entry another process published meanwhile, else the
        registry tier's verified copy, published here, else None; whether it was fetched).
        `then` ends the tier's line saying it has none: what the caller does next."""
        entry = self.store.lookup(job.key, job.arch)
        if entry is not None or self.remote is None:
            return entry, False
        entry = self.remote.fetch(self.store, job.key, job.arch, job.label, then)
        return entry, entry is not None

    def pool(self, arch: str, jobs: int, timeout: float) -> WorkerPool:
        """Compile workers for `arch` with this host's toolchain."""
        if self.toolchain is None:
            raise MonoJitError(f"no toolchain here to compile {arch} code with")
        return compile_pool(self.toolchain, arch, jobs, timeout)

    def publish(self, job: BuildJob, outcome: Outcome) -> Entry:
        """A worker's outcome checked and published (CompileError / ResourceError say why not),
        counted, and offered to the registry tier."""
        try:
            entry = job.finish(self.store, outcome)
        except (MonoJitError, OSError):
            self.counts.failed += 1
            raise
        self.counts.compiled += 1
        if self.remote is not None:
            self.remote.offer(entry, job.label)
        return entry

    def fill(self, job: BuildJob, *, may_compile: bool, then: str = "compiling it here") -> tuple[Entry, bool] | None:
        """One key's miss with its lock waited for: (the entry, whether this call compiled it),
        or None when no other process nor the registry had it and `may_compile` is False."""
        with self.locked(job):
            entry, _ = self.recheck(job, then)
            if entry is not None:
                return entry, False
            if not may_compile:
                return None
            try:
                job.check()
            except MonoJitError:
                self.counts.failed += 1
                raise
            with self.pool(job.arch, 1, float(self.settings.compile_timeout)) as pool:  # type: ignore[arg-type]
                (outcome,) = pool.run([(job.key, job.worker_args())])
            return self.publish(job, outcome), True
