"""mono-jit: the DeepSeek-V4-Pro mono decode layer as a JIT kernel service with an on-disk cache.

The runner's entry points are here: :class:`Spec` / :func:`deployment_grid` (what to build) and
:func:`resolve` / :func:`resolve_many` (verified HSACO bytes, compiling on a miss). Everything
the ``mono-jit`` command line does is one function of :mod:`mono_jit.api` (prebuild, verify,
explain, list_entries, find_entry, gc, clear, export, import_bundle, doctor, stats, push, pull,
selftest), which the CLI only parses arguments for and prints.

Importing this package imports neither torch, FlyDSL nor the cache: the API loads on first use
of one of its names (the vLLM plug-in imports the package in every vLLM process).
"""

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
