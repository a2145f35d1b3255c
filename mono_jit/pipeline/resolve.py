"""The runtime's entry point: verified HSACO bytes and metadata for one template and spec.

``resolve`` checks the store (read-only layers, then the writable one); on a miss it takes the
key's lock, checks again and compiles in an isolated worker (the steps of a miss, shared with
prebuild: pipeline/miss.py), so eight ranks starting together compile each key once. When this host's
toolchain has no entry for a build (a ROCm image brings FlyDSL, ld.lld and bitcode of its own; a
lean image has none to fingerprint), the same build by another toolchain the layers hold serves,
verified as any entry, with one log line naming that toolchain; ``MONO_JIT_EXACT_TOOLCHAIN=1``
serves only this host's toolchain's entries.
``MONO_JIT_OFFLINE=1`` makes a miss an error naming the exact prebuild command that fills its
key; a miss that cannot compile says which kind it is (commands/explain.py: not in any layer, built by
another toolchain, unreadable). With ``MONO_JIT_REMOTE`` set, a miss asks that registry first,
under the key's lock (even offline; see mono_jit/cache/oci/tier.py). A writable store counts
hits, misses and compiles in memory, written once at process exit (cache/stats.py, `mono-jit
stats`). A disk error (full, read-only, a file in the way) is a one-line MonoJitError naming
the path and what to do. Compile workers are fresh interpreters (pipeline/workers.py), so a caller's script
needs no ``if __name__ == "__main__"`` guard. Inside a CUDA/HIP
graph capture it raises before touching the disk. ``resolve_many`` resolves a runner's whole
grid with one settings / store / toolchain resolution.

A hit imports neither torch, FlyDSL, MLIR nor the compile side (compiler, workers, the lock,
pipeline/miss.py), nor the code object records (hsaco/metadata.py: a load checks the ELF header only), and not
glob, hashlib, logging, shutil or uuid either (tests/pipeline/test_warm_load.py, bench/warm_load.py).
Every record a hit defines (Spec, the entry's metadata, the store's Entry, the template's
declarations, the toolchain, Resolved) is a Record (mono_jit/record.py), or a plain class
(Counters, mutable; the schema's shapes, internal): Python 3.11 generates and compiles a
dataclass's methods when the class is defined, and a NamedTuple's ``__new__``: with 23 records
they cost a fresh process's first hit 3 ms in 17 (tests/pipeline/test_warm_load.py wants none of either).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING

from mono_jit.cache import Entry, Store
from mono_jit.cache.stats import Counters, count_in
from mono_jit.cache.store import info
from mono_jit.record import Record

from .job import BuildJob
from ..config import Settings
from ..errors import CaptureError, MonoJitError, OfflineMiss, ToolchainError
from ..spec import Spec
from ..templates import Template, get
from .toolchain import Toolchain, resolve_toolchain

if TYPE_CHECKING:
    from mono_jit.cache.meta import EntryMeta

    from .miss import Misses


class Resolved(Record):
    entry: Entry
    compiled: bool  # True when this call compiled it

    @property
    def hsaco(self) -> bytes:
        return self.entry.hsaco

    @property
    def meta(self) -> EntryMeta:
        return self.entry.meta


def capturing() -> bool:
    """True inside a CUDA/HIP graph capture on the current stream (only if torch is loaded)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
    except Exception:
        return False


def max_model_len_for(spec: Spec) -> int:
    """A --max-model-len whose grid holds `spec`: HCA's top-k width is roundup(ceil(len / 128),
    128), so width x 128 gives it back exactly; CSA's width does not depend on it (the default)."""
    from .. import deepseek_v4

    return spec.topk_width * deepseek_v4.HCA_RATIO if spec.ratio == deepseek_v4.HCA_RATIO else deepseek_v4.MAX_MODEL_LEN


def prebuild_command(template: str, spec: Spec) -> str:
    """The `mono-jit prebuild` command whose grid holds exactly this template's build at `spec`."""
    return (f"mono-jit prebuild --template {template} --tp {spec.tp} --ratio {spec.ratio} "
            f"--max-model-len {max_model_len_for(spec)} --max-tokens {spec.max_tokens} --arch {spec.arch}")


def build_elsewhere(command: str) -> str:
    """Where a host that cannot compile gets a missing entry from: `command` run on a build
    machine, then the result shipped here."""
    return (f"run {command} on a build machine (FlyDSL and ld.lld, no GPU needed), then ship the cache here: "
            "mono-jit export there and mono-jit import here, or an image layer on MONO_JIT_CACHE_PATH")


def _capture_error(what: str) -> CaptureError:
    return CaptureError(
        f"mono-jit resolve({what}) was called during a graph capture: resolve every kernel in the eager warm-up step"
    )


class _Session:
    """What every resolve of one call shares: settings, store, the toolchain (resolved once) and,
    without a toolchain, the fingerprints recorded in the layers (read once)."""

    def __init__(self, settings: Settings | None, store: Store | None) -> None:
        self.settings = settings or Settings()
        # The registry tier (MONO_JIT_REMOTE) may fill a miss even offline, so it needs the
        # writable layer; offline without it, nothing is written.
        self.remote = None
        if self.settings.remote is not None:
            from .miss import registry_tier

            self.remote = registry_tier(self.settings)
        self.store = store or Store(self.settings, read_only=bool(self.settings.offline) and self.remote is None)
        try:
            self.toolchain: Toolchain | None = resolve_toolchain(self.settings)
            self.unavailable: ToolchainError | None = None
        except ToolchainError as exc:
            self.toolchain, self.unavailable = None, exc
        self.counts = Counters()
        self._misses: Misses | None = None
        self._by_key: dict[str, Resolved] = {}
        self._digests: dict[int, tuple[Template, str]] = {}  # id -> (template, its source digest)

    def misses(self) -> Misses:
        """The steps of a miss (mono_jit/pipeline/miss.py), set up at the session's first miss."""
        if self._misses is None:
            from .miss import Misses  # only a miss needs it: the lock, the workers, the compiler

            self._misses = Misses(self.settings, self.store, self.toolchain, self.remote, self.counts)
        return self._misses

    def plan(self, template: Template, spec: Spec, fingerprint: dict) -> BuildJob:
        """The job, with each template's source digest computed once per session."""
        known = self._digests.get(id(template))
        if known is None:
            known = self._digests[id(template)] = (template, template.source_digest())
        return BuildJob.plan(template, spec, fingerprint, known[1])

    def resolve(self, template: Template, spec: Spec) -> Resolved:
        if self.toolchain is None:
            return self._without_toolchain(template, spec)
        job = self.plan(template, spec, self.toolchain.fingerprint)
        done = self._by_key.get(job.key)
        if done is None:
            done = self._by_key[job.key] = self._resolve_job(job)
        return done

    def _resolve_job(self, job: BuildJob) -> Resolved:
        store, settings, spec = self.store, self.settings, job.spec
        entry = store.lookup(job.key, job.arch)
        if entry is not None:
            self.counts.hits += 1
            info(__name__, "hit %s: %s", job.label, entry.path)
            return Resolved(entry, compiled=False)
        served = self._other_toolchain(job.template, spec)
        if served is not None:
            return served
        self.counts.misses += 1
        info(__name__, "miss %s (key %s)%s", job.label, job.key[:16], "" if settings.offline else ": compiling")
        if settings.offline and self.remote is None:
            raise _offline_miss(store, self._tried(job))
        filled = self.misses().fill(job, may_compile=not settings.offline, then=self._then())
        if filled is None:
            raise _offline_miss(store, self._tried(job))
        entry, compiled = filled
        if compiled:
            info(__name__, "compiled %s: %s", job.label, entry.path)
        return Resolved(entry, compiled=compiled)

    def _then(self) -> str:
        """What a miss does when the registry tier has no copy, for the tier's line."""
        return "MONO_JIT_OFFLINE=1: not compiling it" if self.settings.offline else "compiling it here"

    def _tried(self, job: BuildJob) -> list[BuildJob]:
        """`job` and the same build under each toolchain a lookup tried after it, for a miss's
        diagnosis."""
        tried = self.store.toolchains_tried(job.arch, job.factors["toolchain"])
        next(tried)  # this host's own: `job`
        return [job, *(self.plan(job.template, job.spec, fingerprint) for fingerprint in tried)]

    def _other_toolchain(self, template: Template, spec: Spec) -> Resolved | None:
        """The same build (template, sources, spec, arch, options) by another toolchain the
        layers hold, verified as any load is: its key is computed from this build's factors and
        that toolchain's fingerprint, so its stored factors match this build's but for the
        toolchain. Tried in the lookup's order after this host's own (the caller tried that)."""
        own = None if self.toolchain is None else self.toolchain.fingerprint
        tried = self.store.toolchains_tried(spec.arch, own)
        if own is not None:
            next(tried)
        for fingerprint in tried:
            job = self.plan(template, spec, fingerprint)
            done = self._by_key.get(job.key)
            if done is not None:
                return done
            entry = self.store.lookup(job.key, job.arch)
            if entry is not None:
                self.counts.hits += 1
                _announce(fingerprint, own, job, entry)
                done = self._by_key[job.key] = Resolved(entry, compiled=False)
                return done
        return None

    def _without_toolchain(self, template: Template, spec: Spec) -> Resolved:
        """No toolchain to fingerprint here (a serving host without FlyDSL or ld.lld): look the
        spec up under each toolchain that built entries in the layers; nothing can be compiled."""
        served = self._other_toolchain(template, spec) or self._fetch_without_toolchain(template, spec)
        if served is not None:
            return served
        self.counts.misses += 1
        from ..commands.explain import classify  # only a miss needs it

        jobs = [self.plan(template, spec, fingerprint) for fingerprint in self.store.toolchains_tried(spec.arch, None)]
        raise ToolchainError(
            f"{template.name} [{spec.label()}] is in no cache layer under any recorded toolchain "
            f"({classify(self.store, jobs)}), and it cannot be compiled here: {self.unavailable}; "
            + build_elsewhere(prebuild_command(template.name, spec)))

    def record_counts(self) -> None:
        """Add this session's hits, misses and compiles to the writable layer's counters, in
        memory: the process writes them once, at exit (cache/stats.py), never on a lookup."""
        count_in(self.store, self.counts)


    def _fetch_without_toolchain(self, template: Template, spec: Spec) -> Resolved | None:
        """With no toolchain here, the registry tier's entry under a toolchain its manifest
        records (fetched under the key's lock), or None."""
        if self.remote is None:
            return None
        for fingerprint in self.remote.fingerprints(spec.arch):
            job = self.plan(template, spec, fingerprint)
            if not self.remote.lists(job.key):
                continue
            filled = self.misses().fill(job, may_compile=False, then=self._then())
            if filled is not None:
                done = self._by_key[job.key] = Resolved(filled[0], compiled=False)
                return done
        return None


_ANNOUNCED: set[str] = set()  # the toolchains this process has said it serves entries of


def _announce(fingerprint: dict, own: dict | None, job: BuildJob, entry: Entry) -> None:
    """One INFO line a process (per serving toolchain) naming the toolchain that built the
    entries it serves in place of its own's."""
    from .toolchain import describe

    built_by = describe(fingerprint)
    if built_by in _ANNOUNCED:
        return
    _ANNOUNCED.add(built_by)
    import logging

    why = ("this host has no toolchain of its own" if own is None else
           f"this host's toolchain ({describe(own)}) has none; MONO_JIT_EXACT_TOOLCHAIN=1 serves only its own")
    logging.getLogger(__name__).info("mono-jit serves kernels built by another toolchain (%s), %s from %s first: %s",
                                     built_by, job.label, entry.layer.root, why)


def _offline_miss(store: Store, tried: list[BuildJob]) -> OfflineMiss:
    """A miss offline mode forbids compiling (`tried`: this host's job, then the same build under
    each other toolchain looked up): which kind of miss, and the command that fills it."""
    from ..commands.explain import classify  # only a miss needs it

    job = tried[0]
    return OfflineMiss(
        f"{job.label} [{job.spec.label()}] is not in the cache (key {job.key[:16]}): "
        f"{classify(store, tried)}; MONO_JIT_OFFLINE=1 forbids compiling it; "
        f"fill it with: {prebuild_command(job.template.name, job.spec)}  (mono-jit explain shows why it missed)"
    )


def _disk_error(exc: OSError, settings: Settings | None) -> MonoJitError:
    """A disk error as one line naming the path (else the writable root) and what to do."""
    from mono_jit.cache.fs import disk_problem  # only a failed write needs it

    root = (settings or Settings()).writable_root
    return MonoJitError(disk_problem(exc, "mono-jit could not use its cache", root))


def resolve(template: str | Template, spec: Spec, *, settings: Settings | None = None,
            store: Store | None = None) -> Resolved:
    """Verified bytes and metadata of one template at one spec (a hit loads, a miss compiles)."""
    return resolve_many([(template, spec)], settings=settings, store=store)[0]


def resolve_many(pairs: Iterable[tuple[str | Template, Spec]], *, settings: Settings | None = None,
                 store: Store | None = None) -> list[Resolved]:
    """``resolve`` for every (template, spec) pair, in order, sharing one Settings, Store and
    toolchain resolution: what a runner calls for its whole deployment grid before any capture.

    Each pair is verified as ``resolve`` verifies it (size, sha256, key, ELF header); pairs whose
    keys coincide (a template that does not read a field) share one load and one Resolved. A miss
    compiles as ``resolve`` does (single flight, or OfflineMiss when offline); the first failure
    raises. With a warm cache it imports neither FlyDSL, torch nor the compile side.
    """
    pairs = list(pairs)
    session = _open(pairs, settings, store)
    try:
        return [session.resolve(get(t) if isinstance(t, str) else t, spec) for t, spec in pairs]
    except OSError as exc:
        raise _disk_error(exc, settings) from None
    finally:
        session.record_counts()


def resolve_each(pairs: Iterable[tuple[str | Template, Spec]], *, settings: Settings | None = None,
                 store: Store | None = None) -> list[Resolved | MonoJitError]:
    """``resolve_many`` that goes on past a failure: each pair's Resolved, or the one-line
    MonoJitError that pair raised (an offline miss, no toolchain to compile with, a disk error),
    in order. What a whole-grid check reports, so one run names every miss."""
    pairs = list(pairs)
    session = _open(pairs, settings, store)
    results: list[Resolved | MonoJitError] = []
    try:
        for t, spec in pairs:
            try:
                results.append(session.resolve(get(t) if isinstance(t, str) else t, spec))
            except MonoJitError as exc:
                results.append(exc)
            except OSError as exc:
                results.append(_disk_error(exc, settings))
    finally:
        session.record_counts()
    return results


def _open(pairs: list[tuple[str | Template, Spec]], settings: Settings | None, store: Store | None) -> _Session:
    """The session a batch of pairs shares; CaptureError inside a graph capture, a disk error as
    one line."""
    if capturing():
        what = ", ".join(f"{t if isinstance(t, str) else t.name}, {s.label()}" for t, s in pairs[:2])
        raise _capture_error(what + (f", ... ({len(pairs)} pairs)" if len(pairs) > 2 else ""))
    try:
        return _Session(settings, store)
    except OSError as exc:
        raise _disk_error(exc, settings) from None
