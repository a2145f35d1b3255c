"""A built-in template's Build made from its kernel and its arguments(): the kernel's signature is
the only place its parameters are written, the launcher takes them from it (then a stream), and
the compile placeholders come from arguments(). `checks.match_build` holds the kernel's
parameters to arguments() by name and kind.

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

from .base import Argument, Build
from .geometry import CTAS, THREADS

Dims = tuple[int, int, int]


def launcher(kernel_function: Callable, *, grid: Dims, block: Dims, lds: int | None = None) -> Any:
    """`kernel_function` as a FlyDSL kernel and its @flyc.jit launcher: the kernel's parameters,
    then `stream`, launched on `grid` x `block` with `lds` bytes of dynamic LDS."""
    kernel_parameters = inspect.signature(kernel_function, eval_str=True).parameters.values()
    stream_parameter = inspect.Parameter("stream", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                         default=fx.Stream(None), annotation=fx.Stream)
    kernel = flyc.kernel(kernel_function)

    def launch(stream: fx.Stream = fx.Stream(None), **arguments):
        kernel(**arguments).launch(grid=grid, block=block, smem=lds, stream=stream)

    launch.__signature__ = inspect.Signature([*kernel_parameters, stream_parameter])  # type: ignore[attr-defined]
    return flyc.jit(launch)


def placeholders(arguments: tuple[Argument, ...]) -> tuple:
    """The compile placeholders of `arguments`, in order: a one-element CPU tensor of each tensor's
    dtype (FlyDSL compiles without launching when a placeholder is a CPU tensor), 1 for a scalar."""
    return tuple(torch.empty(1, dtype=getattr(torch, a.dtype)) if a.kind == "tensor" else 1 for a in arguments)


def kernel_build(kernel_function: Callable, arguments: tuple[Argument, ...], *, grid: Dims, block: Dims,
                 lds: int | None = None) -> Build:
    """The Build of a template whose launcher runs `kernel_function` once (every built-in)."""
    return Build(launcher(kernel_function, grid=grid, block=block, lds=lds), placeholders(arguments))


def persistent_build(kernel_function: Callable, arguments: tuple[Argument, ...], lds: int) -> Build:
    """The Build of a persistent kernel (K1, K2): one CTA of THREADS threads on each of the CTAS
    CUs, with `lds` bytes of LDS pinned."""
    return kernel_build(kernel_function, arguments, grid=(CTAS, 1, 1), block=(THREADS, 1, 1), lds=lds)
