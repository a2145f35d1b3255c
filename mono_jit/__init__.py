"""mono-jit: the DeepSeek-V4-Pro mono decode layer as a JIT kernel service with an on-disk cache.

The runner's entry points are here: :class:`Spec` / :func:`deployment_grid` (what to build) and
:func:`resolve` / :func:`resolve_many` (verified HSACO bytes, compiling on a miss). Everything
the ``mono-jit`` command line does is one function of :mod:`mono_jit.api` (prebuild, verify,
explain, list_entries, find_entry, gc, clear, export, import_bundle, doctor, stats), which the
CLI only parses arguments for and prints.

Importing this package imports neither torch, FlyDSL nor the cache: the API loads on first use
of one of its names (the vLLM plug-in imports the package in every vLLM process).
"""

import sys
import types

from .errors import MonoJitError
from .spec import STANDARD_MAX_TOKENS, Spec, deployment_grid

__version__ = "0.1.0"

_API = ("Resolved", "resolve", "resolve_many")

__all__ = ["MonoJitError", "STANDARD_MAX_TOKENS", "Spec", "__version__", "deployment_grid", "api", *_API]


def __getattr__(name: str) -> object:
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'mono_jit' has no attribute {name!r}")


class _Package(types.ModuleType):
    """The package module: `resolve` always means the function. Importing a submodule binds it
    on its package, and `mono_jit.resolve` is also a module: without this, `from mono_jit import
    resolve` would get the module once anything had imported it (reach the module with
    `from mono_jit.resolve import ...`)."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in _API and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
