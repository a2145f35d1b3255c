"""Ahead-of-time fill of the cache: every template at every spec of a deployment grid.

Jobs are de-duplicated by key (a template that does not read a field compiles once across its
values), hits are counted without compiling, and misses compile on a pool of workers under each
key's lock (so a concurrent prebuild or serving process never compiles the same key twice).
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Callable, Iterable

from mono_jit.cache import Entry, Store
from mono_jit.cache.lock import single_flight

from .build import BuildJob, failure_message
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
    planned = plan(templates, specs, toolchain.fingerprint())
    if on_plan is not None:
        on_plan(len(planned))
    summary = PrebuildSummary()
    notify = progress or (lambda *_: None)
    misses = []
    for job in planned:
        entry = store.lookup(job.key, job.arch)
        if entry is None:
            misses.append(job)
            continue
        summary.hits += 1
        summary.record(job, entry)
        notify("hit", job, "")
    for arch in sorted({job.arch for job in misses}):
        env = compile_environment(toolchain, arch)
        _compile_all([j for j in misses if j.arch == arch], store, settings, env, jobs, timeout, summary, notify)
    summary.seconds = time.perf_counter() - started
    return summary, planned


def _compile_all(pending: list[BuildJob], store: Store, settings: Settings, env: dict[str, str], jobs: int,
                 timeout: float, summary: PrebuildSummary, notify: ProgressCallback) -> None:
    locks: dict[str, ExitStack] = {}
    by_key = {job.key: job for job in pending}
    queue = list(pending)

    def fail(job: BuildJob, message: str) -> None:
        summary.failed.append({"key": job.key, "template": job.template.name,
                               "spec": job.template.key_spec(job.spec), "error": message})
        notify("failed", job, message)

    with WorkerPool(jobs, env, compile_here, timeout) as pool:
        while queue or pool.busy():
            while queue and pool.has_idle():
                job = queue.pop(0)
                lock = ExitStack()
                try:
                    lock.enter_context(single_flight(settings.locks(), job.key, settings.lock_timeout, job.label))
                except MonoJitError as exc:
                    fail(job, str(exc))
                    continue
                entry = store.lookup(job.key, job.arch)  # another process may have built it meanwhile
                if entry is not None:
                    lock.close()
                    summary.hits += 1
                    summary.record(job, entry)
                    notify("hit", job, "")
                    continue
                locks[job.key] = lock
                pool.submit(job.key, job.worker_args())
            for outcome in pool.wait():
                job = by_key[outcome.job_id]
                try:
                    if outcome.status != "ok":
                        fail(job, failure_message(job, outcome.status, outcome.value))
                        continue
                    try:
                        entry = job.finish(store, outcome.value)
                    except MonoJitError as exc:
                        fail(job, str(exc))
                        continue
                    summary.compiled += 1
                    summary.record(job, entry)
                    notify("compiled", job, f"{outcome.seconds:.1f}s")
                finally:
                    locks.pop(job.key).close()
