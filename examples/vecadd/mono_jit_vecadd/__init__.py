"""`vecadd`: out = a + b over the first M rows of [max_tokens, 4096] f32 buffers, an example
mono-jit template plug-in (docs/plugins.md walks through it).

Contract (M = rows this step, 1 <= M <= spec.max_tokens; flat row-major buffers):
  in   a, b   [M, 4096] f32
  out  out    [M, 4096] f32   a + b
  i32  m      rows this step; CTAs of rows >= m write nothing
Specialised by max_tokens only (one CTA per row): the other Spec fields share one build.
"""

from __future__ import annotations

from mono_jit.spec import Spec
from mono_jit.templates import Argument, LaunchShape, Template

WIDTH = 4096  # columns of a row
BLOCK = 256  # threads of a CTA


class VecAddTemplate(Template):
    name = "vecadd"  # the entry point's name
    spec_fields = ("max_tokens",)  # the Spec fields build() reads: the key leaves the others out
    kernel_module = ".kernel"  # relative to this package, as `from . import kernel` would be

    def launch_shape(self, spec: Spec) -> LaunchShape:
        return LaunchShape(grid=(spec.max_tokens, 1, 1), block=(BLOCK, 1, 1))

    def arguments(self, spec: Spec) -> tuple[Argument, ...]:
        rows = f"[M, {WIDTH}]"
        return (
            Argument("a", "tensor", "float32", f"{rows} first addend"),
            Argument("b", "tensor", "float32", f"{rows} second addend"),
            Argument("out", "tensor", "float32", f"{rows} out: a + b"),
            Argument("m", "i32", "int32", "rows this step (1..max_tokens)"),
        )
