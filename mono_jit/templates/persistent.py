"""What K1 and K2, the persistent kernels, share as templates: one CTA of 512 threads on each of
the 256 CUs, all resident at once (their stages wait on each other's flags), no scratch and no
spills."""

from __future__ import annotations

from typing import ClassVar

from ..hsaco.resources import Budget
from ..spec import Spec
from .base import LaunchShape, Template
from .geometry import CTAS, THREADS


class PersistentTemplate(Template):
    """A persistent kernel's template; a subclass sets `pinned_lds` (the LDS its kernel pins)."""

    kernel_module = ".kernel"
    persistent = True
    budget = Budget(scratch_bytes=0, spills=0)
    pinned_lds: ClassVar[int]

    def launch_shape(self, spec: Spec) -> LaunchShape:
        return LaunchShape(grid=(CTAS, 1, 1), block=(THREADS, 1, 1), dynamic_lds=self.pinned_lds)
