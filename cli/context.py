"""The --cache-dir option and the Settings it leads to."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import click

from mono_jit.config import Settings


def cache_dir_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
        help="Writable cache root (default: $MONO_JIT_CACHE_DIR, else the platform cache folder).",
    )(fn)


def settings_for(cache_dir: Path | None) -> Settings:
    """The settings in force, with --cache-dir (when given) as the writable root."""
    environ = dict(os.environ)
    if cache_dir is not None:
        environ["MONO_JIT_CACHE_DIR"] = str(cache_dir)
    return Settings(environ)
