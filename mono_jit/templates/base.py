"""The template protocol: a named FlyDSL kernel family specialised by a Spec.

A template states which Spec fields it reads (its cache key leaves the others out, so two
values of an unread field share one build), its launch shape as a function of the spec, its
runtime arguments, and how to build the FlyDSL launcher with compile placeholders; the files its
build reads, whose digest enters the key, are found from its imports (sources.py). Building
imports FlyDSL and torch; everything else on this class does not, so the runtime can key and
load entries without them.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

from mono_jit.record import Record

from ..errors import KernargError
from ..hsaco.resources import Budget
from ..spec import Spec
from . import sources

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # mono_jit/: the built-ins' source root


class LaunchShape(Record):
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_lds: int = 0

    def as_dict(self) -> dict:
        return self._asdict()


class Argument(Record):
    """One launcher argument, in order: a 1-D tensor (pointer + i32 length), an i32 scalar, or an
    i64 scalar (a raw device address or byte count, as kernels written for another host pass).

    `unbounded`: a tensor the kernel reaches only through 64-bit global addresses from its
    pointer, never through a buffer resource bounded by the i32 length (a KV cache may pass
    2 GiB): a tensor of any size packs, and its length slot holds 0."""

    name: str
    kind: str  # "tensor", "i32" or "i64"
    dtype: str  # torch dtype name for tensors, "int32" / "int64" for scalars
    doc: str
    unbounded: bool = False

    def as_dict(self) -> dict:
        return self._asdict()

    @classmethod
    def tensor(cls, name: str, dtype: str, doc: str, unbounded: bool = False) -> "Argument":
        return cls(name, "tensor", dtype, doc, unbounded)

    @classmethod
    def i32(cls, name: str, doc: str) -> "Argument":
        return cls(name, "i32", "int32", doc)

    @classmethod
    def i64(cls, name: str, doc: str) -> "Argument":
        return cls(name, "i64", "int64", doc)


class WorkBuffer(Record):
    """A device buffer the runner owns for a template's launches of one build (one per rank).

    `zeroed_once`: zeroed when allocated and never written by the host again (sync areas whose
    epochs the kernel advances); otherwise scratch whose contents no launch relies on, which
    the runner shares between the template's builds (one allocation, the largest).
    `peers`: a buffer every TP rank stores into (the in-kernel all-reduces): allocated as peer
    memory (uncached, zeroed once, IPC-shared), with every rank's address of it passed as the
    int64 argument named here, indexed by TP rank."""

    name: str  # the argument it is passed as
    dtype: str  # torch dtype name
    elements: int
    zeroed_once: bool = False
    peers: str = ""


class Build(Record):
    """What Template.build returns: the @flyc.jit launcher and the placeholders to compile it with."""

    launcher: Any
    placeholders: tuple


def check_names(template: str, names: Sequence[str], values: Mapping[str, Any]) -> None:
    """Raise a KernargError naming each declared argument `values` lacks and each name it holds
    that `names` (the template's arguments, in order) does not declare."""
    missing = [name for name in names if name not in values]
    unknown = [name for name in values if name not in names]
    if missing or unknown:
        raise KernargError(f"{template}: missing arguments {missing}, unknown arguments {unknown}")


def in_order(template: str, names: Sequence[str], values: Mapping[str, Any]) -> tuple:
    """`values` (argument name -> value) as the positional tuple a launcher takes (FlyDSL's, or
    one that stands in for it), in the order `names` gives: the template's arguments() states the
    order once, and every caller that launches positionally derives it from there."""
    check_names(template, names, values)
    return tuple(values[name] for name in names)


class Template(ABC):
    """A kernel family. Subclasses set the class attributes and implement the methods
    (docs/plugins.md is the contract; templates/checks.py checks it at registration)."""

    name: ClassVar[str]
    spec_fields: ClassVar[tuple[str, ...]]
    # Files a build reads that its imports do not show (a data file, a module imported by name),
    # relative to the folder of the top-level package that defines the class; a plug-in's option.
    # The modules the build imports are found without it (`sources`).
    source_files: ClassVar[tuple[str, ...] | None] = None
    persistent: ClassVar[bool] = False
    budget: ClassVar[Budget] = Budget()
    # Module with build(spec) -> Build; a leading '.' is relative to the class's package, as in
    # a relative import written in the module that defines the class.
    kernel_module: ClassVar[str]
    # Module with run(arguments, spec): the kernel contract in torch, what the runtime's
    # reference backend launches (relative to the class's package, as kernel_module).
    reference_module: ClassVar[str] = ".reference"

    @classmethod
    def package(cls) -> str:
        """The package that defines the class (the module itself when it is a package)."""
        module = sys.modules[cls.__module__]
        return cls.__module__ if hasattr(module, "__path__") else cls.__module__.rpartition(".")[0]

    @classmethod
    def source_root(cls) -> Path:
        """The folder `source_files` are relative to: that of the class's top-level package (or,
        for a top-level module, the folder holding it). ValueError when there is none."""
        top = cls.__module__.partition(".")[0]
        module = sys.modules[top]
        file = getattr(module, "__file__", None)
        if file:
            return Path(file).resolve().parent
        folders = list(getattr(module, "__path__", ()))
        if len(folders) != 1:
            raise ValueError(f"the top-level package {top!r} is a namespace package over {len(folders)} folders: "
                             "source_files cannot be placed; give it an __init__.py")
        return Path(folders[0]).resolve()

    @classmethod
    def kernel_module_name(cls) -> str:
        """kernel_module as an absolute module name."""
        return importlib.util.resolve_name(cls.kernel_module, cls.package())

    @classmethod
    def reference_module_name(cls) -> str:
        """reference_module as an absolute module name."""
        return importlib.util.resolve_name(cls.reference_module, cls.package())

    @classmethod
    def sources(cls, package_dir: Path | None = None) -> dict[str, str]:
        """Every file a build reads (name in the key -> path), under `package_dir` (default: the
        class's source root): the modules of the class's top-level package that the class's
        module and its kernel module import, transitively (templates/sources.py), and
        `source_files`. An edit to any of them (a width in deepseek_v4.py, a module added to k2/
        and imported) is a new key."""
        return sources.files_read(*cls._source_query(package_dir))

    def source_digest(self, package_dir: Path | None = None) -> str:
        """sha256 over (name, bytes) of `sources()`: the key's part for the template's code.
        Memoised per process by the files' stat signatures (size, mtime, inode), so a grid of
        keys reads and hashes each template's sources once, and an edited file is read again. A
        file modified in the last two seconds is never memoised (an edit within the clock's
        granularity could keep its mtime)."""
        return sources.digest(*self._source_query(package_dir))

    @classmethod
    def _source_query(cls, package_dir: Path | None) -> tuple[str, str, tuple[str, ...], tuple[str, ...]]:
        root = os.fspath(cls.source_root() if package_dir is None else package_dir)
        starts = (cls.__module__, cls.kernel_module_name())
        return cls.__module__.partition(".")[0], root, starts, tuple(sorted(set(cls.source_files or ())))

    def key_spec(self, spec: Spec) -> dict[str, object]:
        """The spec as the key sees it: only the fields this template reads."""
        return spec.project(self.spec_fields)

    @abstractmethod
    def launch_shape(self, spec: Spec) -> LaunchShape:
        ...

    @abstractmethod
    def arguments(self, spec: Spec) -> tuple[Argument, ...]:
        ...

    def work_buffers(self, spec: Spec) -> tuple[WorkBuffer, ...]:
        """The runner-owned buffers among the arguments, sized from the template's layout."""
        return ()

    def build(self, spec: Spec) -> Build:
        """Trace-ready launcher and placeholders (imports FlyDSL and torch)."""
        return importlib.import_module(self.kernel_module_name()).build(spec)
