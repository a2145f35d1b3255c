"""mono-jit: the DeepSeek-V4-Pro mono decode layer as a JIT kernel service with an on-disk cache.

Public entry points: :class:`Spec` / :func:`deployment_grid` (what to build), :func:`resolve`
(verified HSACO bytes for one template and spec, compiling on a miss) and the ``mono-jit`` CLI.
Importing this package imports neither torch nor FlyDSL: a serving process with a warm cache
needs neither.
"""

from .errors import MonoJitError
from .spec import STANDARD_MAX_TOKENS, Spec, deployment_grid

__version__ = "0.1.0"

__all__ = ["MonoJitError", "STANDARD_MAX_TOKENS", "Spec", "__version__", "deployment_grid", "resolve"]


def __getattr__(name: str):
    # resolve() pulls in the cache and toolchain modules; keep `import mono_jit` cheap. Importing
    # the submodule binds the package's `resolve` to the module: rebind it to the function, or
    # `from mono_jit import resolve` (the README's snippet) would get the module.
    if name == "resolve":
        from .resolve import resolve

        globals()["resolve"] = resolve
        return resolve
    raise AttributeError(f"module 'mono_jit' has no attribute {name!r}")
