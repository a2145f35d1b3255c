"""The ``mono-jit`` command line (installed as ``mono_jit.cli``)."""

from .main import main

__all__ = ["main"]
