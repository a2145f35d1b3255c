"""mono-jit's Python API: one function per thing the ``mono-jit`` command line does (the CLI's only
face onto the package: it parses arguments, calls one of these and prints the report).

Every function takes ``settings`` (default: ``Settings()`` from the environment) and returns a
report object with ``as_dict()``; a failure it cannot report as data is a one-line MonoJitError
(SpecError for a bad spec or grid, MonoJitError naming an unknown template). Long runs take a
``progress`` (mono_jit.progress.Progress). Nothing here imports torch or FlyDSL until a compile
needs it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from mono_jit.cache import Entry, Store
from mono_jit.cache.gc import GcReport
from mono_jit.cache.stats import count_in

from . import deepseek_v4
from .config import Settings
from .commands.doctor import Checks, cannot_compile_here
from .errors import MonoJitError, ToolchainError
from .commands.explain import Explanation
from .commands.listing import Listing
from .progress import Progress, Silent
from .pipeline.resolve import Resolved, resolve, resolve_many
from .spec import RATIOS, STANDARD_MAX_TOKENS, Spec, deployment_grid
from .templates import Template, all_templates, get
from .commands.verify import VerifyReport

if TYPE_CHECKING:  # these load when used
    from mono_jit.cache.bundle import Exported
    from mono_jit.cache.oci.client import Registry
    from mono_jit.cache.oci.reference import Reference

    from .pipeline.deployment import GridCheck
    from .selfcheck import KernelCheck

__all__ = ["Checks", "Explanation", "Listing", "PrebuildReport", "Resolved", "StatsReport", "VerifyReport",
           "cannot_compile_here", "check_grid", "clear", "default_jobs", "describe_toolchain", "doctor",
           "emulate_extra_missing", "explain", "export", "fill_advice", "find_entry", "gc", "import_bundle",
           "list_entries", "prebuild", "pull", "push", "registry_reference", "resolve", "resolve_many", "selftest",
           "selftest_emulated", "stats", "verify"]


def default_jobs() -> int:
    """Compile workers when not told: the CPUs, at most 8."""
    return max(1, min(os.cpu_count() or 1, 8))


def _settings(settings: Settings | None) -> Settings:
    return settings if settings is not None else Settings()


def _templates(names: Iterable[str | Template] | None) -> list[Template]:
    """The templates named (MonoJitError for an unknown one), or every registered one."""
    if names is None:
        return list(all_templates().values())
    return [name if isinstance(name, Template) else get(name) for name in names]


@dataclass
class PrebuildReport:
    """A prebuild's outcome: counts, each entry and failure, and the image layer if one was asked for."""

    compiled: int
    hits: int
    failures: list[dict]
    entries: list[dict]
    seconds: float
    jobs: int  # distinct keys planned
    cache_dir: str
    fetched: int = 0  # from the registry tier (MONO_JIT_REMOTE), not compiled
    image_layer: str | None = None
    image_layer_added: int | None = None

    @property
    def ok(self) -> bool:
        return not self.failures

    def as_dict(self) -> dict:
        return {**self.__dict__, "failed": len(self.failures)}


def prebuild(templates: Iterable[str | Template] | None = None, *, tp: int = 8,
             max_model_len: int = deepseek_v4.MAX_MODEL_LEN, max_tokens: Iterable[int] = STANDARD_MAX_TOKENS,
             ratios: Iterable[int] = RATIOS, arch: str = "gfx950", jobs: int | None = None, timeout: float = 600.0,
             image_layer: Path | None = None, settings: Settings | None = None,
             progress: Progress | None = None) -> PrebuildReport:
    """Compile the templates (default: the layer's, deployment.default_templates) at every spec of the deployment grid
    into the writable cache; a failed build is in the report, never raised. With MONO_JIT_REMOTE
    set, what its registry holds is fetched and only the rest compiled. With `image_layer`
    and no failure, the run's entries are also published there as a read-only layer any user
    can read (cache/layer.py)."""
    from .pipeline.prebuild import prebuild as run

    _check_timeout(timeout)
    settings, progress = _settings(settings), progress or Silent()
    specs = deployment_grid(tp, max_model_len, max_tokens, ratios, arch)
    chosen = _deployment_templates(templates, settings)
    if image_layer is not None:  # before anything compiles: a compile of the whole grid is minutes
        from mono_jit.cache.layer import check_layer_destination

        check_layer_destination(image_layer)
    summary, planned = run(chosen, specs, settings, jobs=jobs or default_jobs(), timeout=timeout,
                           progress=lambda event, job, detail: progress.finished(event, job.label, detail),
                           on_plan=progress.planned)
    report = PrebuildReport(summary.compiled, summary.hits, summary.failed, summary.entries, round(summary.seconds, 3),
                            len(planned), str(settings.writable_root), summary.fetched)
    count_in(Store(settings), summary.counts)
    if image_layer is not None and report.ok:
        from mono_jit.cache.layer import publish_image_layer

        store = Store(settings)
        entries = [store.lookup(job.key, job.arch) for job in planned]
        missing = [job.label for job, entry in zip(planned, entries) if entry is None]
        if missing:
            raise MonoJitError(f"cannot publish the image layer: {', '.join(missing[:3])} left the cache")
        report.image_layer = str(image_layer)
        report.image_layer_added = publish_image_layer(list({e.key: e for e in entries if e}.values()), image_layer)
    return report


def _check_timeout(timeout: float) -> None:
    """MonoJitError naming `timeout` unless it is a bounded finite number of seconds (a NaN or inf
    would switch the compile timeout off or overflow the worker pool's wait)."""
    from .config import bounded_seconds

    try:
        bounded_seconds(float(timeout))
    except ValueError as exc:
        raise MonoJitError(f"timeout={timeout!r}: {exc}") from None


def _deployment_templates(templates: Iterable[str | Template] | None, settings: Settings) -> list[Template]:
    """The templates named, else what a plain prebuild builds (deployment.default_templates)."""
    from .pipeline.deployment import default_templates

    return _templates(templates if templates is not None else default_templates(settings))


def check_grid(templates: Iterable[str | Template] | None = None, *, tp: int = 8,
               max_model_len: int = deepseek_v4.MAX_MODEL_LEN, max_tokens: Iterable[int] = STANDARD_MAX_TOKENS,
               ratios: Iterable[int] = RATIOS, arch: str = "gfx950", settings: Settings | None = None) -> GridCheck:
    """Whether the layers here serve every build `prebuild` with the same arguments makes:
    each resolved offline as a serving process would (verified, never compiled or fetched, no
    FlyDSL needed), every miss with its reason. Writes nothing."""
    from .pipeline.deployment import check

    settings = _settings(settings)
    specs = deployment_grid(tp, max_model_len, max_tokens, ratios, arch)
    return check(_deployment_templates(templates, settings), specs, settings)


def verify(*, rebuild: bool = False, jobs: int | None = None, timeout: float = 600.0,
           settings: Settings | None = None, progress: Progress | None = None) -> VerifyReport:
    """Check every copy of every entry in every layer; with `rebuild`, recompile each good one
    and require identical bytes (needs FlyDSL: ToolchainError on a lean host)."""
    from .commands.verify import verify as run

    _check_timeout(timeout)
    settings = _settings(settings)
    if rebuild and cannot_compile_here() is not None:
        raise ToolchainError(f"verify with rebuild recompiles every entry: {cannot_compile_here()}")
    return run(Store(settings), rebuild=rebuild, jobs=jobs or default_jobs(), timeout=timeout,
               progress=progress or Silent())


def explain(template: str | Template, spec: Spec, *, settings: Settings | None = None) -> Explanation:
    """Whether `template` at `spec` hits, by which entry and why (this host's toolchain's, or the
    same build by another toolchain when it has none), and if not, why: the corrupt copy in its
    place, or the kind of miss and the key factors that differ from the nearest entry. Without a
    toolchain here (a lean host), keys are computed with the toolchains in the layers. Writes nothing."""
    from .commands.explain import explain as run
    from .pipeline.toolchain import resolve_toolchain

    settings = _settings(settings)
    template = template if isinstance(template, Template) else get(template)
    store = Store(settings)
    try:
        own, how = resolve_toolchain(settings).fingerprint, "this host's"
    except ToolchainError as exc:
        own = None
        how = f"recorded in the layers ({len(store.recorded_toolchains(spec.arch))}); this host has no toolchain of its own ({exc})"
    return run(store, template, spec, own, how)


def fill_advice(template: str, spec: Spec) -> str:
    """What fills a missing entry of `template` at `spec`: 'run <the prebuild command whose grid
    holds it>', or on a host that cannot compile, where to run it and how to ship the result."""
    from .pipeline.resolve import build_elsewhere, prebuild_command

    fill = prebuild_command(template, spec)
    return f"run {fill}" if cannot_compile_here() is None else build_elsewhere(fill)


def list_entries(templates: Iterable[str] | None = None, *, settings: Settings | None = None) -> Listing:
    """The served entries (read-only layers first), of the named templates only when given,
    each "ok" or "stale", and each layer's size."""
    from .commands.listing import listing

    return listing(Store(_settings(settings)), tuple(templates) if templates is not None else None)


def find_entry(prefix: str, *, settings: Settings | None = None) -> Entry:
    """The one served entry whose key starts with `prefix` (KeyPrefixError otherwise)."""
    from .commands.listing import find

    return find(Store(_settings(settings)), prefix)


def gc(*, max_size: int | None = None, older_than: float | None = None, dry_run: bool = False,
       settings: Settings | None = None) -> GcReport:
    """Evict writable entries unused for `older_than` seconds, then least recently used ones
    down to `max_size` bytes, then what killed runs left; with neither, only the leftovers."""
    from mono_jit.cache.gc import collect

    return collect(Store(_settings(settings)), max_bytes=max_size, older_than=older_than, dry_run=dry_run)


def clear(*, settings: Settings | None = None) -> int:
    """Remove every copy in the writable layer (read-only layers are never touched); how many."""
    store = Store(_settings(settings))
    paths = [item.path if isinstance(item, Entry) else item[0] for item in store.entries()]
    doomed = [p for p in paths if p.is_relative_to(store.writable.root)]
    for path in doomed:
        store.remove(path)
    return len(doomed)


def export(bundle: Path, *, templates: Iterable[str] | None = None, settings: Settings | None = None) -> Exported:
    """Write the served entries (of the named templates only, when given) to the tar(.gz)
    `bundle` with a manifest of checksums, reproducibly; returns its manifest and sha256."""
    from mono_jit.cache.bundle import export_bundle

    names = None if templates is None else set(templates)
    entries = [e for e in Store(_settings(settings)).served()
               if names is None or e.meta.template in names]
    return export_bundle(bundle, entries)


def describe_toolchain(fingerprint: dict) -> str:
    """A toolchain fingerprint in one short line (digests cut), as the resolver's log names it."""
    from .pipeline.toolchain import describe

    return describe(fingerprint)


def worker_env_removed() -> dict[str, str]:
    """The variables of this environment that compile workers run without (they would change
    FlyDSL's output: toolchain.removed_variables), for `mono-jit config`."""
    from .pipeline.toolchain import removed_variables

    return removed_variables()


def import_bundle(bundle: Path, *, sha256: str | None = None, settings: Settings | None = None) -> dict:
    """Check a bundle whole (its sha256 when given, paths, sizes, checksums, every entry as a
    load would), then publish its entries: {'imported', 'present'}, and 'differing' (the "arch/key"
    of each present entry whose code object is not the bundle's; kept as it is) when one is."""
    from mono_jit.cache.bundle import import_bundle as run

    return run(Store(_settings(settings)), bundle, sha256)


def doctor(*, deep: bool = False, settings: Settings | None = None) -> Checks:
    """Toolchain, cache and template health checks (mono_jit.commands.doctor)."""
    from .commands.doctor import doctor as run

    return run(_settings(settings), deep)


@dataclass
class StatsReport:
    """Lookups counted in the writable layer since `since` (None: since it was created), and
    what the layers hold now."""

    counters: dict[str, int]
    since: str | None
    entries: int
    total_bytes: int
    layers: list[dict] = field(default_factory=list)
    recorded: bool = True  # False when this store writes nothing (offline, or no writable root)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def stats(*, zero: bool = False, settings: Settings | None = None) -> StatsReport:
    """The hit / miss / compile counters of the writable layer (merged from every process's
    increments) and the size of every layer; with `zero`, reset the counters first."""
    from mono_jit.cache import stats as counters

    from .commands.listing import listing

    settings = _settings(settings)
    store = Store(settings, read_only=bool(settings.offline))
    writable = store.writable.writable
    if zero and not writable:
        raise MonoJitError(f"cannot zero the counters: the writable cache {store.writable.root} is read-only here")
    totals = counters.merge(store.writable.base, zero=zero) if writable else counters.read(store.writable.base)
    held = listing(store)
    return StatsReport(totals.counters.as_dict(), totals.since, len(held.entries), held.total_bytes, held.layers,
                       writable)


def registry_reference(text: str) -> Reference:
    """An OCI reference (REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST]) parsed; RemoteError saying
    what was expected."""
    from mono_jit.cache.oci.reference import parse_reference

    from .errors import RemoteError

    try:
        return parse_reference(text)
    except ValueError as exc:
        raise RemoteError(str(exc)) from None


def _registry(ref: str | Reference, settings: Settings, insecure: bool) -> Registry:
    from mono_jit.cache.oci.client import Registry  # imports oras: only push and pull need it

    ref = registry_reference(ref) if isinstance(ref, str) else ref
    plain = insecure or ref.registry in settings.remote_insecure  # type: ignore[operator]
    return Registry(ref, insecure=plain, timeout=float(settings.remote_timeout))  # type: ignore[arg-type]


def push(ref: str | Reference, *, templates: Iterable[str] | None = None, replace: bool = False,
         insecure: bool = False, settings: Settings | None = None) -> dict:
    """Push the served entries (of the named templates only, when given) to the registry as one
    OCI artifact: a blob per entry REF does not list yet, one manifest listing them (with
    `replace`, only these). Plain HTTP with `insecure` or when MONO_JIT_REMOTE_INSECURE names
    the registry. Returns {added, uploaded, bytes, already_listed, listed, manifest_written}."""
    from mono_jit.cache.oci.transfer import push as push_entries

    settings = _settings(settings)
    names = None if templates is None else set(templates)
    entries = [e for e in Store(settings).served() if names is None or e.meta.template in names]
    return push_entries(_registry(ref, settings, insecure), entries, replace=replace)


def pull(ref: str | Reference, *, image_layer: Path | None = None, insecure: bool = False,
         settings: Settings | None = None) -> dict:
    """Fetch the entries REF lists that the layers lack, verify each as a load does, and publish
    them (into the writable cache, or into the read-only `image_layer`) only when all passed.
    Returns {fetched, bytes, present, other_arch, other_arches, target}."""
    from mono_jit.cache.oci.transfer import pull as pull_entries

    settings = _settings(settings)
    store = Store(settings, read_only=image_layer is not None)  # into an image layer: no writable cache made
    return pull_entries(_registry(ref, settings, insecure), store, image_layer)


def selftest(*, device: int = 0, launch: bool = True, templates: Iterable[str] | None = None,
             specs: Iterable[Spec] | None = None, settings: Settings | None = None) -> Checks:
    """Check the GPU (gfx950, every CU a persistent launch needs), load every cached kernel
    through HIP, then (with `launch`) run the package's launch checks of the selected templates
    (default: mono_jit.selfcheck.EMULATED_TEMPLATES) at `specs` (default: the TP8 deployment
    grid) on the device. Without a HIP runtime the 'hip' check fails saying so and nothing else runs."""
    from .selfcheck.gpu import check_gpu

    chosen = list(specs) if specs is not None else deployment_grid()
    return check_gpu(_settings(settings), None if templates is None else tuple(templates), chosen, device, launch)


def emulate_extra_missing() -> list[str]:
    """The packages of mono-jit's emulate extra that are not installed ([] when selftest_emulated can run)."""
    import importlib.util

    return [name for name in ("numba", "tinygrad") if importlib.util.find_spec(name) is None]


def selftest_emulated(*, templates: Iterable[str] | None = None, specs: Iterable[Spec] | None = None,
                      settings: Settings | None = None,
                      progress: Callable[[str], None] | None = None) -> list[KernelCheck]:
    """`selftest`'s launch checks on an emulated gfx950 (no GPU needed), one result a kernel; a
    kernel missing from the cache is compiled first where FlyDSL is installed. MonoJitError when
    the emulate extra is not installed. `progress` is told each kernel before it runs."""
    from .selfcheck import EMULATED_TEMPLATES, check_kernels

    missing = emulate_extra_missing()
    if missing:
        raise MonoJitError(f"--emulate needs mono-jit's emulate extra: {' and '.join(missing)} not installed")
    chosen = list(specs) if specs is not None else deployment_grid()
    return check_kernels(tuple(templates) if templates is not None else EMULATED_TEMPLATES, chosen,
                         _settings(settings), progress=progress)
