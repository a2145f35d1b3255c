"""Ahead-of-time fill of the cache: every template at every spec of a deployment grid.

Jobs are de-duplicated by key (a template that does not read a field compiles once across its
values), hits are counted without compiling, and misses compile on a pool of workers under each
key's lock (so a concurrent prebuild or serving process never compiles the same key twice).
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from mono_jit.cache import Entry, Store
from mono_jit.cache.lock import single_flight

from .build import BuildJob
from .compiler import compile_here
from .config import Settings
from .errors import MonoJitError
from .spec import Spec
from .templates import Template
from .toolchain import compile_environment, resolve_toolchain
from .workers import WorkerPool

# (event, job, detail): event is "hit", "compiled" or "failed".
ProgressCallback = Callable[[str, BuildJob, str], None]


@dataclass
class PrebuildSummary:
    compiled: int = 0
    hits: int = 0
    failed: list[dict] = field(default_factory=list)
    entries: list[dict] = field(default_factory=list)
    seconds: float = 0.0

    def record(self, job: BuildJob, entry: Entry) -> None:
        self.entries.append({"key": job.key, "template": job.template.name,
                             "spec": job.template.key_spec(job.spec), "path": str(entry.path)})

    def hit(self, job: BuildJob, entry: Entry, notify: ProgressCallback) -> None:
        self.hits += 1
        self.record(job, entry)
        notify("hit", job, "")

    def fail(self, job: BuildJob, message: str, notify: ProgressCallback) -> None:
        self.failed.append({"key": job.key, "template": job.template.name,
                            "spec": job.template.key_spec(job.spec), "error": message})
        notify("failed", job, message)

    def as_dict(self) -> dict:
        return {"compiled": self.compiled, "hits": self.hits, "failed": len(self.failed),
                "failures": self.failed, "entries": self.entries, "seconds": round(self.seconds, 3)}


def plan(templates: Iterable[Template], specs: Iterable[Spec], toolchain_fingerprint: dict) -> list[BuildJob]:
    jobs: dict[str, BuildJob] = {}
    for template in templates:
        for spec in specs:
            job = BuildJob.plan(template, spec, toolchain_fingerprint)
            jobs.setdefault(job.key, job)
    return list(jobs.values())


def prebuild(templates: list[Template], specs: list[Spec], settings: Settings, *, jobs: int, timeout: float,
             progress: ProgressCallback | None = None,
             on_plan: Callable[[int], None] | None = None) -> tuple[PrebuildSummary, list[BuildJob]]:
    started = time.perf_counter()
    store = Store(settings)
    toolchain = resolve_toolchain(settings)
    planned = plan(templates, specs, toolchain.fingerprint)
    if on_plan is not None:
        on_plan(len(planned))
    summary = PrebuildSummary()
    notify = progress or (lambda *_: None)
    misses = []
    for job in planned:
        entry = store.lookup(job.key, job.arch)
        if entry is None:
            misses.append(job)
        else:
            summary.hit(job, entry, notify)
    for arch in sorted({job.arch for job in misses}):
        env = compile_environment(toolchain, arch)
        _compile_all([j for j in misses if j.arch == arch], store, settings, env, jobs, timeout, summary, notify)
    summary.seconds = time.perf_counter() - started
    return summary, planned


def _compile_all(pending: list[BuildJob], store: Store, settings: Settings, env: dict[str, str], jobs: int,
                 timeout: float, summary: PrebuildSummary, notify: ProgressCallback) -> None:
    """Compile `pending` on a pool, each under its key's lock, re-checking the store once locked."""
    locks: dict[str, ExitStack] = {}
    by_key = {job.key: job for job in pending}

    def still_missing() -> Iterator[tuple[str, tuple]]:
        # Pulled lazily by the pool: a lock is taken only when a worker is free for the job.
        for job in pending:
            lock = ExitStack()
            try:
                lock.enter_context(single_flight(settings.locks(), job.key, settings.lock_timeout, job.label))
            except MonoJitError as exc:
                summary.fail(job, str(exc), notify)
                continue
            entry = store.lookup(job.key, job.arch)  # another process may have built it meanwhile
            if entry is not None:
                lock.close()
                summary.hit(job, entry, notify)
                continue
            locks[job.key] = lock
            yield job.key, job.worker_args()

    try:
        with WorkerPool(jobs, env, compile_here, timeout) as pool:
            for outcome in pool.run(still_missing()):
                job = by_key[outcome.job_id]
                try:
                    entry = job.finish(store, outcome)
                except MonoJitError as exc:
                    summary.fail(job, str(exc), notify)
                else:
                    summary.compiled += 1
                    summary.record(job, entry)
                    notify("compiled", job, f"{outcome.seconds:.1f}s")
                finally:
                    locks.pop(job.key).close()
    finally:
        for lock in locks.values():
            lock.close()
