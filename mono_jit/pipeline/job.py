"""One build: a template at a spec, its key, and how a compile result becomes an entry.

A :class:`BuildJob` owns everything about one build (template, spec, factors, key, label), the
way FlashInfer's JitSpec does: one place knows what a build is called and where it lives.
``check`` runs before compiling: the template's launch shape and arguments for the spec are
constants of the right types (templates/checks.py). ``finish`` turns a worker's result into a
published entry after the checks: a code object for the arch, launches with constant shapes
matching the template's, kernargs matching its arguments, and the resource gate.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from mono_jit.cache import Entry, Store, cache_key, key_factors
from mono_jit.cache.digest import sha256
from mono_jit.cache.meta import EntryMeta, HsacoDigest, KernelLaunch, LaunchDims, StoredArgument, build_label
from mono_jit.record import Record
from mono_jit.hsaco.resources import Residency

from .. import __version__
from ..hsaco import resources
from ..errors import CompileError, InvalidCodeObject, TemplateError
from ..spec import Spec
from ..templates import Template, checks

if TYPE_CHECKING:  # workers pulls in multiprocessing, hsaco defines records: both off the cache-hit path
    from ..hsaco.kernel_info import KernelInfo
    from .workers import Outcome


class BuildJob(Record):
    template: Template
    spec: Spec
    factors: dict
    key: str

    @classmethod
    def plan(cls, template: Template, spec: Spec, toolchain_fingerprint: dict,
             source_digest: str | None = None) -> "BuildJob":
        """The job and its key; `source_digest` is the template's, when the caller already has it
        (resolve_many computes it once per template for a whole grid)."""
        if source_digest is None:
            source_digest = template.source_digest()
        factors = key_factors(template.name, source_digest, template.key_spec(spec), spec.arch,
                              toolchain_fingerprint)
        return cls(template, spec, factors, cache_key(factors))

    @property
    def arch(self) -> str:
        return self.spec.arch

    @property
    def label(self) -> str:
        return build_label(self.template.name, self.template.key_spec(self.spec))

    def check(self) -> None:
        """The template's launch shape and arguments for this spec, checked before any compile
        (TemplateError naming the job and what was expected)."""
        checks.launch_shape(self.template, self.spec, self.label)
        checks.arguments(self.template, self.spec, self.label)

    def worker_args(self) -> tuple:
        return (self.template.name, self.spec.as_dict())

    def finish(self, store: Store, outcome: "Outcome") -> Entry:
        """Check a worker's outcome and publish it; CompileError/ResourceError say why not."""
        from ..hsaco.metadata import inspect_code_object

        if outcome.status != "ok":
            raise CompileError(_failure_message(self, outcome.status, outcome.value))
        result = outcome.value
        hsaco: bytes = result["hsaco"]
        try:
            kernels = inspect_code_object(hsaco, self.arch)
        except InvalidCodeObject as exc:
            raise CompileError(f"{self.label}: FlyDSL produced a bad code object: {exc}") from None
        residency = self._check_launches(kernels, result["launches"])
        arguments = self.template.arguments(self.spec)
        for kernel in kernels:
            if kernel.name in residency:
                try:
                    checks.match_kernargs(self.label, arguments, kernel)
                except TemplateError as exc:  # a build the runtime could not pack: the job fails
                    raise CompileError(str(exc)) from None
        shape = self.template.launch_shape(self.spec)
        meta = EntryMeta(
            key=self.key,
            factors=self.factors,
            template=self.template.name,
            spec=self.template.key_spec(self.spec),
            build_spec=self.spec.as_dict(),
            arch=self.arch,
            hsaco=HsacoDigest(len(hsaco), sha256(hsaco).hexdigest()),
            kernels=tuple(kernels),
            launches=tuple(KernelLaunch.from_json(launch) for launch in result["launches"]),
            launch=LaunchDims.of(shape),
            arguments=tuple(StoredArgument.of(a) for a in arguments),
            persistent=self.template.persistent,
            budget=self.template.budget._asdict(),
            residency=residency,
            compile_seconds=round(result["seconds"], 3),
            created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            mono_jit=__version__,
        )
        return store.publish(self.key, self.arch, hsaco, meta)

    def _check_launches(self, kernels: list[KernelInfo], launches: list[dict]) -> dict[str, Residency]:
        """Every launch must match the template's launch shape and pass the resource gate;
        returns each launched kernel's residency."""
        if not launches:
            raise CompileError(f"{self.label}: the launcher launched no kernel")
        shape = self.template.launch_shape(self.spec)
        expected = {"grid": list(shape.grid), "block": list(shape.block), "dynamic_lds": shape.dynamic_lds}
        by_name = {k.name: k for k in kernels}
        residency: dict[str, Residency] = {}
        for launch in launches:
            computed = [f for f in ("grid", "block") if None in launch[f]]
            computed += ["dynamic_lds"] * (launch["dynamic_lds"] is None)
            if computed:
                raise CompileError(
                    f"{self.label}: the launcher's {' and '.join(computed)} of kernel {launch['kernel']!r} is computed "
                    "at run time, not a constant: launch with the template's launch_shape(spec), Python ints fixed "
                    "by the spec (every launch of an entry uses the shape it records)")
            if {field: launch[field] for field in expected} != expected:
                raise CompileError(f"{self.label}: launch {launch} differs from the template's launch shape {expected}")
            kernel = by_name.get(launch["kernel"])
            if kernel is None:
                raise CompileError(f"{self.label}: launched kernel {launch['kernel']!r} is not in the code object")
            residency[kernel.name] = resources.check(
                kernel, block=math.prod(shape.block), grid=math.prod(shape.grid), dynamic_lds=shape.dynamic_lds,
                persistent=self.template.persistent, budget=self.template.budget, what=self.label,
            )
        return residency


def _failure_message(job: BuildJob, status: str, detail: str) -> str:
    """A one-paragraph error naming the template and spec, with FlyDSL's own message."""
    lines = [line for line in str(detail).strip().splitlines() if line.strip()]
    head = lines[0] if lines else status
    tail = "\n".join(lines[1:12])
    return f"{job.label} failed to compile ({status}): {head}" + (f"\n{tail}" if tail else "")
