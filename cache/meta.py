"""meta.json as one typed record: what the builder writes, the store verifies and readers use.

:class:`EntryMeta` is the entry format. ``to_json`` gives the object the builder publishes
(``meta_bytes`` of it is meta.json); ``from_json`` checks a parsed meta.json against its schema
(schema.py, the type of every field) and returns the record, or raises :class:`MetaError`
naming the first bad field. Fields a newer writer adds are ignored by ``from_json``; a published
entry's own bytes (``Entry.meta_json``) are what export and import copy, so nothing is rewritten.
"""

from __future__ import annotations

from typing import Any, Mapping

from mono_jit.errors import MonoJitError
from mono_jit.hsaco.kernel_info import KernelArg, KernelInfo
from mono_jit.record import Record
from mono_jit.hsaco.resources import Residency

from .schema import meta_problem

META_SCHEMA = 1  # meta.json's "schema": a reader refuses any other



def build_label(template: str, fields: Mapping[str, object]) -> str:
    """A build as every report names it: ``template(field=value, ...)``, `fields` being the spec
    fields the template reads."""
    return f"{template}({', '.join(f'{k}={v}' for k, v in fields.items())})"

class MetaError(MonoJitError, ValueError):
    """A parsed meta.json that does not fit the entry format; the message names the field."""


class HsacoDigest(Record):
    """The code object's size and sha256 (hex), as meta.json records them."""

    size: int
    sha256: str


class LaunchDims(Record):
    """A launch's grid, block and dynamic LDS bytes (the same for every launch of an entry)."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_lds: int

    def to_json(self) -> dict[str, Any]:
        return {"grid": list(self.grid), "block": list(self.block), "dynamic_lds": self.dynamic_lds}

    @classmethod
    def of(cls, shape: Any) -> "LaunchDims":
        """The dimensions of a template's LaunchShape."""
        return cls(shape.grid, shape.block, shape.dynamic_lds)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "LaunchDims":
        return cls(_dim3(data["grid"]), _dim3(data["block"]), data["dynamic_lds"])


class KernelLaunch(Record):
    """One launch the launcher makes: the kernel's name and its dimensions."""

    kernel: str
    dims: LaunchDims

    def to_json(self) -> dict[str, Any]:
        return {"kernel": self.kernel, **self.dims.to_json()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "KernelLaunch":
        return cls(data["kernel"], LaunchDims.from_json(data))


class StoredArgument(Record):
    """One launcher argument as recorded: a tensor (pointer + i32 extent), an i32 or an i64.
    `unbounded`: a tensor the kernel reaches through 64-bit addresses only (its extent slot is 0)."""

    name: str
    kind: str  # "tensor", "i32" or "i64"
    dtype: str
    doc: str
    unbounded: bool = False

    def to_json(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def of(cls, argument: Any) -> "StoredArgument":
        """The record of a template's declared Argument."""
        return cls(argument.name, argument.kind, argument.dtype, argument.doc, argument.unbounded)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "StoredArgument":
        return cls(data["name"], data["kind"], data["dtype"], data["doc"], bool(data.get("unbounded", False)))


class EntryMeta(Record):
    """Everything meta.json records about one entry."""

    key: str
    factors: Mapping[str, Any]  # the cache key's factors, hashed as stored (key.py)
    template: str
    spec: Mapping[str, object]  # the fields the template reads (str / int values)
    build_spec: Mapping[str, object]  # the whole spec it was built from
    arch: str
    hsaco: HsacoDigest
    kernels: tuple[KernelInfo, ...]
    launches: tuple[KernelLaunch, ...]
    launch: LaunchDims
    arguments: tuple[StoredArgument, ...]
    persistent: bool
    budget: Mapping[str, int]
    residency: Mapping[str, Residency]  # per launched kernel
    compile_seconds: float
    created: str  # UTC, ISO 8601
    mono_jit: str | None = None  # the version that built it (absent in the oldest entries)
    schema: int = META_SCHEMA

    @property
    def toolchain(self) -> dict[str, str]:
        """The toolchain fingerprint among the factors."""
        return dict(self.factors["toolchain"])

    @property
    def source_digest(self) -> str:
        """The template sources' digest among the factors."""
        return str(self.factors["template"]["source_digest"])

    @property
    def label(self) -> str:
        """``template(field=value, ...)`` of the spec fields the template reads."""
        return build_label(self.template, self.spec)

    def to_json(self) -> dict[str, Any]:
        """The object meta.json holds (lists for tuples, as JSON has them)."""
        data: dict[str, Any] = {
            "schema": self.schema,
            "key": self.key,
            "factors": self.factors,
            "template": self.template,
            "spec": dict(self.spec),
            "build_spec": dict(self.build_spec),
            "arch": self.arch,
            "hsaco": self.hsaco._asdict(),
            "kernels": [_kernel_json(kernel) for kernel in self.kernels],
            "launches": [launch.to_json() for launch in self.launches],
            "launch": self.launch.to_json(),
            "arguments": [argument.to_json() for argument in self.arguments],
            "persistent": self.persistent,
            "budget": dict(self.budget),
            "residency": {name: r.as_dict() for name, r in self.residency.items()},
            "compile_seconds": self.compile_seconds,
            "created": self.created,
        }
        if self.mono_jit is not None:
            data["mono_jit"] = self.mono_jit
        return data

    @classmethod
    def from_json(cls, data: Any) -> "EntryMeta":
        """The record of a parsed meta.json; MetaError if its schema version or a field is wrong."""
        version = data.get("schema") if isinstance(data, dict) else None
        if version != META_SCHEMA:
            raise MetaError(f"meta.json schema {version!r} is not {META_SCHEMA}")
        problem = meta_problem(data)
        if problem is not None:
            raise MetaError(f"meta.json is malformed: {problem}")
        return cls(
            key=data["key"], factors=data["factors"], template=data["template"], spec=data["spec"],
            build_spec=data["build_spec"], arch=data["arch"],
            hsaco=HsacoDigest(data["hsaco"]["size"], data["hsaco"]["sha256"]),
            kernels=tuple(_kernel(k) for k in data["kernels"]),
            launches=tuple(KernelLaunch.from_json(launch) for launch in data["launches"]),
            launch=LaunchDims.from_json(data["launch"]),
            arguments=tuple(StoredArgument.from_json(a) for a in data["arguments"]),
            persistent=data["persistent"], budget=data["budget"],
            residency={name: Residency(**{f: r[f] for f in _RESIDENCY_FIELDS}) for name, r in data["residency"].items()},
            compile_seconds=data["compile_seconds"], created=data["created"],
            mono_jit=data["mono_jit"] if isinstance(data.get("mono_jit"), str) else None,
        )


_RESIDENCY_FIELDS = Residency._fields


def _dim3(values: list[int]) -> tuple[int, int, int]:
    x, y, z = values
    return (x, y, z)


def _kernel_json(kernel: KernelInfo) -> dict[str, Any]:
    data = kernel.as_dict()
    data["args"] = [a._asdict() for a in kernel.args]
    data["reqd_workgroup_size"] = list(kernel.reqd_workgroup_size)
    return data


def _kernel(data: Mapping[str, Any]) -> KernelInfo:
    """A kernel's record (the schema has checked every field but the optional required size)."""
    fields = {name: data[name] for name in KernelInfo._fields if name in data}
    fields["args"] = tuple(KernelArg(a["offset"], a["size"], a["value_kind"]) for a in data["args"])
    required = fields.get("reqd_workgroup_size", ())
    fields["reqd_workgroup_size"] = tuple(required) if isinstance(required, list) else ()
    return KernelInfo(**fields)
