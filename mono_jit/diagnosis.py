"""Why a spec hits or misses: the entry it hits, the corrupt copy in its place, or the kind of
miss and the key factors that differ from the nearest entry.

A miss is one of: ``unreadable`` (a copy of the key is there but fails verification or its
trust check), ``built by another toolchain`` (the template at this spec is cached, built by a
FlyDSL / ld.lld / bitcode other than this host's), ``built from other template sources`` (the
same, from template sources other than the installed ones) or ``not in any layer``. The
resolver's miss errors and ``mono-jit explain`` share this one diagnosis; it writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mono_jit.cache import Entry, Store
from mono_jit.cache.key import diff

from .build import BuildJob
from .spec import Spec
from .templates import Template

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
    return (entry.arch == job.arch and entry.meta["template"] == job.template.name
            and entry.meta["spec"] == job.template.key_spec(job.spec))


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
    for kind, factor in ((OTHER_TOOLCHAIN, "toolchain"), (OTHER_SOURCES, "template")):
        for entry in others:
            names = [name for name, _, _ in diff(jobs[0].factors, entry.meta["factors"])
                     if name.split(".")[0] == factor]
            if names:
                return Miss(kind, f"entry {entry.key[:16]} at {entry.layer.root} differs in {', '.join(names)}")
    roots = ", ".join(str(layer.root) for layer in store.layers) or "no readable layer"
    return Miss(NOT_FOUND, f"searched {roots}")


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

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def explain(store: Store, template: Template, spec: Spec, fingerprints: list[dict], toolchain: str) -> Explanation:
    """Explain `template` at `spec` under each toolchain fingerprint in `fingerprints` (this
    host's, or those recorded in the layers on a host without one), writing nothing."""
    jobs = [BuildJob.plan(template, spec, fingerprint) for fingerprint in fingerprints]
    label = jobs[0].label if jobs else f"{template.name}[{spec.label()}]"
    bad: list[tuple[Path, str]] = []
    for job in jobs:
        entry, unusable = store.probe(job.key, job.arch)
        if entry is not None:
            return Explanation(label, job.key, "hit", str(entry.path), None, None, entry.key, [], toolchain)
        bad += unusable
    key = jobs[0].key if jobs else None
    corrupt = [(path, reason) for path, reason in bad if path.name in {job.key for job in jobs}]
    if corrupt:
        return Explanation(label, key, "corrupt", str(corrupt[0][0]), corrupt[0][1], None, None, [], toolchain)
    miss = classify(store, jobs, bad)
    candidates = [e for e in store.served() if e.meta["template"] == template.name and e.arch == spec.arch]
    nearest = None
    differences: list[dict] = []
    if jobs and candidates:
        nearest = min(candidates, key=lambda e: len(diff(jobs[0].factors, e.meta["factors"])))
        differences = [{"factor": f, "wanted": w, "stored": s} for f, w, s in diff(jobs[0].factors,
                                                                                   nearest.meta["factors"])]
    return Explanation(label, key, "miss", None, miss.detail, miss.kind, nearest.key if nearest else None,
                       differences, toolchain)
