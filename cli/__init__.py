"""The ``mono-jit`` command line (installed as ``mono_jit.cli``)."""

try:
    from .main import main
except KeyboardInterrupt:  # Ctrl-C while the commands' modules import (a few tenths of a second)
    import sys

    sys.stderr.write("\nmono-jit: interrupted before it began: nothing was done\n")
    raise SystemExit(130) from None

__all__ = ["main"]
