"""`mono-jit explain`: why a spec hits or misses: the entry it hits, the corrupt copy in its
place, or the kind of miss and the key factors that differ from the nearest entry.

A hit is served by this host's toolchain's entry or, when it has none, by the same build of
another toolchain the layers hold (as the resolver serves it). A miss is one of: ``unreadable``
(a copy of the key is there but fails verification or its trust check), ``built by another
toolchain`` (the same build, by a FlyDSL / ld.lld / bitcode other than this host's, refused by
``MONO_JIT_EXACT_TOOLCHAIN=1``), ``built from other template sources`` (the template at this
spec, from template sources other than the installed ones) or ``not in any layer``. The
resolver's miss errors and ``mono-jit explain`` share this one diagnosis; it writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mono_jit.cache import Entry, Store
from mono_jit.cache.key import build_identity, diff

from ..pipeline.job import BuildJob
from ..spec import Spec
from ..templates import Template

UNREADABLE = "unreadable"
OTHER_TOOLCHAIN = "built by another toolchain"
OTHER_SOURCES = "built from other template sources"
NOT_FOUND = "not in any layer"


@dataclass(frozen=True)
class Miss:
    """The kind of a miss (one of the constants above) and a one-line detail."""

    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


def _same_build(job: BuildJob, entry: Entry) -> bool:
    return (entry.arch == job.arch and entry.meta.template == job.template.name
            and entry.meta.spec == job.template.key_spec(job.spec))


def classify(store: Store, jobs: list[BuildJob], bad: list[tuple[Path, str]] | None = None) -> Miss:
    """Why none of `jobs` (one template at one spec, under each toolchain tried) is served:
    `bad` is what a lookup or probe found unusable (else what the store's lookups rejected)."""
    if bad is None:
        bad = [item for job in jobs for item in store.rejected.get(job.key, [])]
        if not bad:
            bad = [item for job in jobs for item in store.probe(job.key, job.arch)[1]]
    if bad:
        path, reason = bad[0]
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        return Miss(UNREADABLE, f"{path}: {reason}{more}")
    if not jobs:
        return Miss(NOT_FOUND, "no toolchain here and none recorded in any layer")
    others = [e for e in store.served() if _same_build(jobs[0], e)]
    identity = build_identity(jobs[0].factors)
    for entry in others:  # the same build by another toolchain: a lookup serves it unless told not to
        if build_identity(entry.meta.factors) == identity:
            names = [name for name, _, _ in diff(jobs[0].factors, entry.meta.factors)]
            refused = "; MONO_JIT_EXACT_TOOLCHAIN=1 refuses it" if store.settings.exact_toolchain else ""
            return Miss(OTHER_TOOLCHAIN, f"entry {entry.key[:16]} at {entry.layer.root} differs in "
                                         f"{', '.join(names)}{refused}")
    for entry in others:
        names = [name for name, _, _ in diff(jobs[0].factors, entry.meta.factors) if name.startswith("template.")]
        if names:
            return Miss(OTHER_SOURCES, f"entry {entry.key[:16]} at {entry.layer.root} differs in {', '.join(names)}")
    roots = ", ".join(str(layer.root) for layer in store.layers) or "no readable layer"
    return Miss(NOT_FOUND, f"searched {roots}")


THIS_TOOLCHAIN = "this host's toolchain"
ANOTHER_TOOLCHAIN = "another toolchain"


def _why_another(own_job: BuildJob | None, bad: list[tuple[Path, str]]) -> str:
    """Why an entry of another toolchain serves: this host has no toolchain, or its own entry
    is missing or unusable."""
    if own_job is None:
        return "this host has no toolchain of its own"
    mine = [(path, reason) for path, reason in bad if path.name == own_job.key]
    if mine:
        return f"this host's toolchain's entry {mine[0][0]} is unusable ({mine[0][1]})"
    return f"this host's toolchain has no entry (key {own_job.key[:16]}); MONO_JIT_EXACT_TOOLCHAIN=1 would refuse it"


@dataclass(frozen=True)
class Explanation:
    """`mono-jit explain`'s answer for one template at one spec."""

    label: str
    key: str | None  # None when no toolchain is known to compute it with
    status: str  # "hit", "corrupt" or "miss"
    path: str | None  # the entry hit, or the corrupt copy
    reason: str | None  # the corrupt copy's fault, or the Miss
    miss_kind: str | None
    nearest: str | None
    differences: list[dict] = field(default_factory=list)  # {factor, wanted, stored}
    toolchain: str = "this host's"  # or how the keys were computed without one
    served_by: str | None = None  # a hit: THIS_TOOLCHAIN or ANOTHER_TOOLCHAIN
    built_by: dict | None = None  # a hit: the toolchain fingerprint of the entry that serves

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def explain(store: Store, template: Template, spec: Spec, own: dict | None, toolchain: str) -> Explanation:
    """Explain `template` at `spec` as a lookup serves it, writing nothing: the entry of this
    host's toolchain `own` (None: it has none), else, unless MONO_JIT_EXACT_TOOLCHAIN, the same
    build by another toolchain the layers hold; `toolchain` says how the keys were computed."""
    jobs: list[BuildJob] = []
    bad: list[tuple[Path, str]] = []
    for fingerprint in store.toolchains_tried(spec.arch, own):
        job = BuildJob.plan(template, spec, fingerprint)
        jobs.append(job)
        entry, unusable = store.probe(job.key, job.arch)
        if entry is not None:
            served_by = THIS_TOOLCHAIN if fingerprint == own else ANOTHER_TOOLCHAIN
            reason = None if fingerprint == own else _why_another(jobs[0] if own is not None else None, bad)
            return Explanation(job.label, job.key, "hit", str(entry.path), reason, None, entry.key, [], toolchain,
                               served_by, fingerprint)
        bad += unusable
    label = jobs[0].label if jobs else f"{template.name}[{spec.label()}]"
    key = jobs[0].key if jobs else None
    corrupt = [(path, reason) for path, reason in bad if path.name in {job.key for job in jobs}]
    if corrupt:
        return Explanation(label, key, "corrupt", str(corrupt[0][0]), corrupt[0][1], None, None, [], toolchain)
    miss = classify(store, jobs, bad)
    candidates = [e for e in store.served() if e.meta.template == template.name and e.arch == spec.arch]
    nearest = None
    differences: list[dict] = []
    if jobs and candidates:
        nearest = min(candidates, key=lambda e: len(diff(jobs[0].factors, e.meta.factors)))
        differences = [{"factor": f, "wanted": w, "stored": s} for f, w, s in diff(jobs[0].factors,
                                                                                   nearest.meta.factors)]
    return Explanation(label, key, "miss", None, miss.detail, miss.kind, nearest.key if nearest else None,
                       differences, toolchain)
