"""Build the package (its wheel's metadata, the sdist and the wheel) through its build backend in
a scratch copy of the checkout, and fail on any deprecation warning the backend gives: setuptools
announces with one (`project.license` as a table, for one) the releases that will stop building
the package. Run by scripts/lint.sh.

    .venv/bin/python scripts/build_warnings.py
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
SKIPPED = (".venv", ".git", "*.egg-info", "__pycache__", ".pytest_cache", ".mypy_cache")
SKIPPED_AT_ROOT = ("build", "dist")  # the backend's output folders; mono_jit/pipeline is source


def skipped(root: Path) -> Callable[[str, list[str]], set[str]]:
    """copytree's ignore for a copy of `root`: SKIPPED anywhere, SKIPPED_AT_ROOT at its top only."""
    anywhere = shutil.ignore_patterns(*SKIPPED)

    def ignore(folder: str, names: list[str]) -> set[str]:
        at_root = set(names) & set(SKIPPED_AT_ROOT) if Path(folder) == root else set()
        return set(anywhere(folder, names)) | at_root

    return ignore


def deprecation(warning: warnings.WarningMessage) -> bool:
    """Whether `warning` announces a deprecation: Python's categories, or a backend's own class
    named so (setuptools' SetuptoolsDeprecationWarning is a UserWarning)."""
    category = warning.category
    return issubclass(category, (DeprecationWarning, PendingDeprecationWarning, FutureWarning)) or any(
        "Deprecat" in cls.__name__ for cls in category.__mro__)


def build_warnings(root: Path) -> list[warnings.WarningMessage]:
    """Every warning the backend gives while building the checkout at `root`, in a scratch copy."""
    import setuptools.build_meta as backend

    with tempfile.TemporaryDirectory() as scratch:
        source, out = Path(scratch) / "source", Path(scratch) / "out"
        shutil.copytree(root, source, ignore=skipped(root))
        out.mkdir()
        here = os.getcwd()
        os.chdir(source)
        try:
            with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(io.StringIO()), \
                    contextlib.redirect_stderr(io.StringIO()):
                warnings.simplefilter("always")
                backend.prepare_metadata_for_build_wheel(str(out))
                backend.build_sdist(str(out))
                backend.build_wheel(str(out))
        finally:
            os.chdir(here)
    return caught


def main() -> int:
    found = {}  # one line per warning, each once (every hook repeats the backend's)
    for warning in filter(deprecation, build_warnings(ROOT)):
        first = next((line.strip() for line in str(warning.message).splitlines() if line.strip()), "")
        found[f"build backend: {warning.category.__name__}: {first}"] = None
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
