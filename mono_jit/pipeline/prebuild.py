"""Ahead-of-time fill of the cache: every template at every spec of a deployment grid.

Jobs are de-duplicated by key (a template that does not read a field compiles once across its
values), hits are counted without compiling, and misses take the steps of a miss (pipeline/miss.py): each
key's lock (so a concurrent prebuild or serving process never compiles the same key twice), a
second look, the registry tier when MONO_JIT_REMOTE names one (what it holds is fetched, not
compiled), then a pool of compile workers.
While this run holds any lock it only tries locks (a busy key is tried again later) and waits
for one only when it holds none, so two prebuilds ordering keys differently never deadlock. A
disk error fails its job with a one-line reason; a full or read-only disk stops the run cleanly.
A template whose own code fails while its jobs are planned (its sources, its launch shape or
arguments for a spec) fails those jobs, each with the reason; the other templates build.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from mono_jit.cache import Entry, Store
from mono_jit.cache.fs import FULL_DISK, disk_problem
from mono_jit.cache.lock import KeyLock
from mono_jit.cache.meta import build_label
from mono_jit.cache.stats import Counters

from .job import BuildJob
from ..config import Settings
from ..errors import MonoJitError
from .miss import Misses, registry_tier
from ..spec import Spec
from ..templates import Template
from .toolchain import resolve_toolchain
from .workers import Outcome


@dataclass(frozen=True)
class PlanFailure:
    """A template at a spec that could not be planned: the template's code raised (a missing
    source file, a launch shape that is not constant, ...). It fails as a job, with no key."""

    template: Template
    spec: Spec
    label: str
    fields: dict
    error: str
    key: None = None


# (event, job, detail): event is "hit", "fetched" (from the registry tier), "compiled" or "failed".
ProgressCallback = Callable[[str, "BuildJob | PlanFailure", str], None]


@dataclass
class PrebuildSummary:
    compiled: int = 0
    hits: int = 0
    fetched: int = 0
    failed: list[dict] = field(default_factory=list)
    entries: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    counts: Counters = field(default_factory=Counters)  # for the writable layer's counters (api.prebuild adds them)

    def record(self, job: BuildJob, entry: Entry) -> None:
        self.entries.append({"key": job.key, "template": job.template.name,
                             "spec": job.template.key_spec(job.spec), "path": str(entry.path)})

    def hit(self, job: BuildJob, entry: Entry, notify: ProgressCallback) -> None:
        self.hits += 1
        self.record(job, entry)
        notify("hit", job, "")

    def fetch(self, job: BuildJob, entry: Entry, notify: ProgressCallback) -> None:
        self.fetched += 1
        self.record(job, entry)
        notify("fetched", job, "")

    def fail(self, job: BuildJob | PlanFailure, message: str, notify: ProgressCallback) -> None:
        fields = job.fields if isinstance(job, PlanFailure) else job.template.key_spec(job.spec)
        self.failed.append({"key": job.key, "template": job.template.name, "spec": fields, "error": message})
        notify("failed", job, message)

    def as_dict(self) -> dict:
        return {"compiled": self.compiled, "hits": self.hits, "fetched": self.fetched, "failed": len(self.failed),
                "failures": self.failed, "entries": self.entries, "seconds": round(self.seconds, 3)}


def _plan_failure(template: Template, spec: Spec, exc: Exception) -> PlanFailure:
    try:
        fields = template.key_spec(spec)
    except Exception:  # a template's own key_spec may be what failed
        fields = spec.as_dict()
    label = build_label(template.name, fields)
    error = str(exc) if isinstance(exc, MonoJitError) else f"{label}: {type(exc).__name__} while planning: {exc}"
    return PlanFailure(template, spec, label, fields, error)


def plan(templates: Iterable[Template], specs: Iterable[Spec],
         toolchain_fingerprint: dict) -> tuple[list[BuildJob], list[PlanFailure]]:
    """The jobs, one per distinct key, each checked before compiling; and the (template, spec)
    pairs whose planning raised, one per distinct label. One template's failure is its own."""
    specs = list(specs)
    jobs: dict[str, BuildJob] = {}
    failures: dict[str, PlanFailure] = {}
    for template in templates:
        try:
            digest, broken = template.source_digest(), None
        except Exception as exc:  # a plug-in's sources: whatever it raises fails its jobs only
            digest, broken = "", exc
        for spec in specs:
            try:
                if broken is not None:
                    raise broken
                job = BuildJob.plan(template, spec, toolchain_fingerprint, digest)
                job.check()
            except Exception as exc:
                failure = _plan_failure(template, spec, exc)
                failures.setdefault(failure.label, failure)
            else:
                jobs.setdefault(job.key, job)
    return list(jobs.values()), list(failures.values())


def prebuild(templates: list[Template], specs: list[Spec], settings: Settings, *, jobs: int, timeout: float,
             progress: ProgressCallback | None = None,
             on_plan: Callable[[int], None] | None = None) -> tuple[PrebuildSummary, list[BuildJob]]:
    """Fill the cache with every template at every spec; a failed build is recorded in the
    summary, never raised, and counted in `summary.counts`. MonoJitError (one line) when the
    run cannot start at all."""
    started = time.perf_counter()
    try:
        store = Store(settings)
        toolchain = resolve_toolchain(settings)
    except OSError as exc:
        raise MonoJitError(disk_problem(exc, "cannot open the cache", settings.writable_root)) from None
    summary = PrebuildSummary()
    run = Misses(settings, store, toolchain, registry_tier(settings), summary.counts)
    planned, unplannable = plan(templates, specs, toolchain.fingerprint)
    if on_plan is not None:
        on_plan(len(planned) + len(unplannable))
    notify = progress or (lambda *_: None)
    for failure in unplannable:
        summary.fail(failure, failure.error, notify)
    missing = []
    for job in planned:
        entry = store.lookup(job.key, job.arch)
        if entry is None:
            missing.append(job)
        else:
            summary.hit(job, entry, notify)
    if missing:
        try:
            run.lock_dir()
        except OSError as exc:
            raise MonoJitError(disk_problem(exc, "cannot create the lock folder", settings.locks())) from None
        batch = _Batch(run, summary, notify)
        for arch in sorted({job.arch for job in missing}):
            batch.compile([j for j in missing if j.arch == arch], arch, jobs, timeout)
    summary.counts.hits += summary.hits
    summary.counts.misses += len(missing) + len(unplannable)
    summary.counts.failed = len(summary.failed)  # publish counted its own; a plan, lock or disk failure is one too
    summary.seconds = time.perf_counter() - started
    return summary, planned


class _Batch:
    """Fills missing jobs (pipeline/miss.py's steps) with a pool, each under its key's lock, looked up
    again and asked of the registry tier once locked. `held` maps the key of every job in
    flight to its lock."""

    def __init__(self, run: Misses, summary: PrebuildSummary, notify: ProgressCallback) -> None:
        self.run, self.store = run, run.store
        self.lock_timeout = float(run.settings.lock_timeout)  # type: ignore[arg-type]
        self.summary, self.notify = summary, notify
        self.held: dict[str, KeyLock] = {}
        self.halted: str | None = None  # why no further job starts (a full or read-only disk)

    def compile(self, pending: list[BuildJob], arch: str, jobs: int, timeout: float) -> None:
        by_key = {job.key: job for job in pending}
        try:
            with self.run.pool(arch, jobs, timeout) as pool:
                for outcome in pool.run(self._dispatch(pending)):
                    self._finish(by_key[outcome.job_id], outcome)
        finally:
            for lock in self.held.values():
                lock.close()
            self.held.clear()

    def _dispatch(self, pending: list[BuildJob]) -> Iterator[tuple[str, tuple] | None]:
        """Worker arguments of each job still missing once locked; None while every remaining
        key is locked elsewhere and this run holds a lock (never wait holding one)."""
        waiting = deque(pending)
        while waiting and self.halted is None:
            found = self._next_free(waiting)
            if found is not None:
                job, lock = found
            elif self.held:
                yield None
                continue
            elif not waiting:  # every remaining job failed to open its lock (recorded as it failed)
                break
            else:
                job = waiting.popleft()
                waited = self._wait_for(job)
                if waited is None:
                    continue
                lock = waited
            try:  # another process may have built it meanwhile, or the registry tier holds it
                entry, fetched = self.run.recheck(job)
            except OSError as exc:
                lock.close()
                self._disk_failure(job, exc, "cannot write it into the cache", self.store.writable.root)
                continue
            if entry is not None:
                lock.close()
                (self.summary.fetch if fetched else self.summary.hit)(job, entry, self.notify)
                continue
            self.held[job.key] = lock
            yield job.key, job.worker_args()
        for job in waiting:
            self.summary.fail(job, f"{job.label} not attempted: {self.halted}", self.notify)

    def _next_free(self, waiting: deque[BuildJob]) -> tuple[BuildJob, KeyLock] | None:
        """The first waiting job whose lock is free, taken without waiting (busy ones go to the back)."""
        for _ in range(len(waiting)):
            job = waiting.popleft()
            lock = self._open(job)
            if lock is None:
                continue
            if lock.try_acquire():
                return job, lock
            lock.close()
            waiting.append(job)
        return None

    def _wait_for(self, job: BuildJob) -> KeyLock | None:
        """The lock of `job`, waited for (bounded) while this run holds no other; None if failed."""
        lock = self._open(job)
        if lock is None:
            return None
        try:
            lock.acquire(self.lock_timeout)
        except MonoJitError as exc:
            self.summary.fail(job, str(exc), self.notify)
            return None
        return lock

    def _open(self, job: BuildJob) -> KeyLock | None:
        try:
            return self.run.open_lock(job)
        except MonoJitError as exc:
            self.summary.fail(job, str(exc), self.notify)
        except OSError as exc:
            self._disk_failure(job, exc, "cannot open its lock", self.run.lock_dir())
        return None

    def _finish(self, job: BuildJob, outcome: Outcome) -> None:
        """Publish one worker's outcome and record it, then release the key's lock."""
        try:
            entry = self.run.publish(job, outcome)
        except MonoJitError as exc:
            self.summary.fail(job, str(exc), self.notify)
        except OSError as exc:
            self._disk_failure(job, exc, "cannot write it into the cache", self.store.writable.root)
        else:
            self.summary.compiled += 1
            self.summary.record(job, entry)
            self.notify("compiled", job, f"{outcome.seconds:.1f}s")
        finally:
            self.held.pop(job.key).close()

    def _disk_failure(self, job: BuildJob, exc: OSError, doing: str, where: Path) -> None:
        """Record a disk error as the job's one-line failure; a full or read-only disk halts the run."""
        message = disk_problem(exc, f"{job.label}: {doing}", where)
        self.summary.fail(job, message, self.notify)
        if exc.errno in FULL_DISK and self.halted is None:
            self.halted = f"the run stopped at '{exc.strerror or os.strerror(exc.errno)}' (see the first failure)"
