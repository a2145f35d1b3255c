"""A built-in template's Build made from its kernel function and its own declarations: the kernel's
signature is the only place its parameters are written (the launcher takes them from it, then a
stream), the launch shape is the template's `launch_shape(spec)` and the compile placeholders
come from `arguments(spec)`. `checks.match_build` holds the kernel's parameters to arguments() by
name and kind.

FlyDSL traces a launcher by calling it with its parameters by keyword (`JitFunction._trace`) and
reads them from `inspect.signature`, which honours `__signature__`; its AST rewrite keeps the
function's `__dict__` when it rebuilds one (`ASTRewriter._install_code`, `functools.update_wrapper`).
A placeholder's size and a scalar's value do not enter the code object: only the dtypes and
kinds are traced (every built-in's code object was compared both ways, byte for byte).
"""

import inspect
from typing import Any, Callable

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch

from ..spec import Spec
from .base import Argument, Build, LaunchShape, Template


def launcher(kernel_function: Callable, shape: LaunchShape) -> Any:
    """`kernel_function` as a FlyDSL kernel and its @flyc.jit launcher: the kernel's parameters,
    then `stream`, launched as `shape` says (grid, block, dynamic LDS bytes)."""
    kernel_parameters = inspect.signature(kernel_function, eval_str=True).parameters.values()
    stream_parameter = inspect.Parameter("stream", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                         default=fx.Stream(None), annotation=fx.Stream)
    kernel = flyc.kernel(kernel_function)

    def launch(stream: fx.Stream, **arguments):
        kernel(**arguments).launch(grid=shape.grid, block=shape.block, smem=shape.dynamic_lds, stream=stream)

    launch.__signature__ = inspect.Signature([*kernel_parameters, stream_parameter])  # type: ignore[attr-defined]
    return flyc.jit(launch)


def placeholders(arguments: tuple[Argument, ...]) -> tuple:
    """The compile placeholders of `arguments`, in order: a one-element CPU tensor of each tensor's
    dtype (FlyDSL compiles without launching when a placeholder is a CPU tensor), 1 for a scalar."""
    return tuple(torch.empty(1, dtype=getattr(torch, a.dtype)) if a.kind == "tensor" else 1 for a in arguments)


def template_build(template: Template, spec: Spec, kernel_function: Callable) -> Build:
    """The Build of `template` at `spec` whose launcher runs `kernel_function` once (every built-in)."""
    return Build(launcher(kernel_function, template.launch_shape(spec)), placeholders(template.arguments(spec)))
