"""The --cache-dir option and the Settings / Store it leads to."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import click

from mono_jit.cache import Store
from mono_jit.config import Settings


def cache_dir_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
        help="Writable cache root (default: $MONO_JIT_CACHE_DIR, else the platform cache folder).",
    )(fn)


def settings_for(cache_dir: Path | None) -> Settings:
    environ = dict(os.environ)
    if cache_dir is not None:
        environ["MONO_JIT_CACHE_DIR"] = str(cache_dir)
    return Settings(environ)


def store_for(cache_dir: Path | None) -> Store:
    return Store(settings_for(cache_dir))
