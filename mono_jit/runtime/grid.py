"""The deployment grid: the kernels one rank's runner needs, resolved and loaded in one go
before any capture.

A layer runs K1 (by max-tokens bucket) and K2 (by compress ratio, key-table width and bucket);
the grid is every such build of the deployment. `load_grid` resolves each from the cache (a hit
loads; a miss compiles once per host, single flight, unless offline mode makes it an error) and
hands each to the backend. It raises on the first build it cannot provide, with the reason;
the runner turns that into an all-rank fallback.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ..config import Settings
from ..pipeline.deployment import LAYER_TEMPLATES, builds
from ..spec import STANDARD_MAX_TOKENS, Spec, deployment_grid
from ..templates import get
from .backends import Backend, Kernel


@dataclass(frozen=True)
class GridEntry:
    """One (template, spec) of the grid; `spec` carries the fields the template ignores too."""

    template: str
    spec: Spec

    @property
    def bucket(self) -> int:
        return self.spec.max_tokens


def layer_grid(tp: int, hca_width: int, templates: Iterable[str] = LAYER_TEMPLATES,
               buckets: Iterable[int] = STANDARD_MAX_TOKENS, arch: str = "gfx950") -> list[GridEntry]:
    """Every build the layer's launches need: the deployment's grid, one per distinct build of
    each template, as prebuild builds it."""
    specs = deployment_grid(tp, max_tokens_buckets=buckets, arch=arch, hca_width=hca_width)
    return [GridEntry(template.name, spec) for template, spec in builds([get(n) for n in templates], specs)]


def load_grid(grid: list[GridEntry], backend: Backend,
              settings: Settings | None = None) -> dict[GridEntry, Kernel]:
    """Each build, resolved (hip: from the cache, the whole grid in one `resolve_many`) and
    loaded by the backend."""
    templates = {name: get(name) for name in {build.template for build in grid}}
    if not backend.needs_cache:
        return {b: backend.load(templates[b.template], b.spec, None, None) for b in grid}
    from ..pipeline.resolve import resolve_many

    resolved = resolve_many([(templates[b.template], b.spec) for b in grid], settings=settings)
    return {b: backend.load(templates[b.template], b.spec, r.meta, r.hsaco) for b, r in zip(grid, resolved)}
