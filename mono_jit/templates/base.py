"""The template protocol: a named FlyDSL kernel family specialised by a Spec.

A template states which Spec fields it reads (its cache key leaves the others out, so two
values of an unread field share one build), the source files whose digest enters the key, its
launch shape as a function of the spec, its runtime arguments, and how to build the FlyDSL
launcher with compile placeholders. Building imports FlyDSL and torch; everything else on this
class does not, so the runtime can key and load entries without them.
"""

from __future__ import annotations

import importlib
import os
import time
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

from mono_jit.cache.digest import sha256

from ..resources import Budget
from ..spec import Spec

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # mono_jit/
# What every built-in template's build imports from mono_jit besides its own package (checked
# against the real imports by tests/test_source_digest.py).
COMMON_SOURCES = ("errors.py", "hsaco.py", "model.py", "resources.py", "spec.py", "templates/_dsl.py",
                  "templates/base.py")


_source_digests: dict[tuple, str] = {}  # (package dir, files, their stat signatures) -> digest


@dataclass(frozen=True)
class LaunchShape:
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_lds: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Argument:
    """One launcher argument, in order: a 1-D tensor (pointer + i32 length) or an i32 scalar."""

    name: str
    kind: str  # "tensor" or "i32"
    dtype: str  # torch dtype name for tensors, "int32" for scalars
    doc: str

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class WorkBuffer:
    """A device buffer the runner owns for a template's launches of one build (one per rank).

    `zeroed_once`: zeroed when allocated and never written by the host again (sync areas whose
    epochs the kernel advances); otherwise scratch whose contents no launch relies on."""

    name: str  # the argument it is passed as
    dtype: str  # torch dtype name
    elements: int
    zeroed_once: bool = False


@dataclass(frozen=True)
class Build:
    """What Template.build returns: the @flyc.jit launcher and the placeholders to compile it with."""

    launcher: Any
    placeholders: tuple


class Template(ABC):
    """A kernel family. Subclasses set the class attributes and implement the methods."""

    name: ClassVar[str]
    spec_fields: ClassVar[tuple[str, ...]]
    # Every file (relative to the mono_jit package) a build imports: the template's own modules
    # and what they import from mono_jit, transitively. Their digest is part of the key, so an
    # edit to any of them (a width in model.py, a residency figure in resources.py) is a new key.
    source_files: ClassVar[tuple[str, ...]]
    persistent: ClassVar[bool] = False
    budget: ClassVar[Budget] = Budget()
    kernel_module: ClassVar[str]  # module (relative to this package) with build(spec) -> Build
    # Whether the runner may serve a layer with it; a template that builds and tests but cannot
    # finish a layer yet says why in `not_serving`, and a runner whose grid needs it declines.
    serves: ClassVar[bool] = True
    not_serving: ClassVar[str] = ""

    def source_digest(self, package_dir: Path = PACKAGE_DIR) -> str:
        """sha256 over (path, bytes) of every source file. Memoised per process by the files'
        stat signatures (size, mtime, inode), so a grid of keys reads and hashes each template's
        sources once, and an edited file is read again. A file modified in the last two seconds
        is never memoised (an edit within the clock's granularity could keep its mtime)."""
        files = sorted(set(self.source_files))
        folder = os.fspath(package_dir)
        stamp = []
        for rel in files:
            st = os.stat(os.path.join(folder, rel))
            stamp.append((st.st_size, st.st_mtime_ns, st.st_ino))
        memo_key = (folder, tuple(files), tuple(stamp))
        digest = _source_digests.get(memo_key)
        if digest is None:
            hasher = sha256()
            for rel in files:
                hasher.update(rel.encode() + b"\0" + (package_dir / rel).read_bytes() + b"\0")
            digest = hasher.hexdigest()
            if max((mtime for _, mtime, _ in stamp), default=0) < time.time_ns() - 2_000_000_000:
                _source_digests[memo_key] = digest
        return digest

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
        module = importlib.import_module(self.kernel_module, __package__)
        return module.build(spec)
