"""Parsing and output helpers shared by the commands."""

from __future__ import annotations

import json
import sys
from typing import Any, Callable

import click

from mono_jit.errors import MonoJitError


def comma_ints(option: str) -> Callable[[click.Context, click.Parameter, str | None], tuple[int, ...] | None]:
    """A click callback: '1,2,4' -> (1, 2, 4), with a usage error naming the option."""

    def parse(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, ...] | None:
        if value is None:
            return None
        try:
            items = tuple(int(part) for part in value.split(",") if part.strip())
        except ValueError:
            raise click.BadParameter(f"{value!r}: expected a comma list of integers, e.g. 1,2,4", param_hint=option)
        if not items:
            raise click.BadParameter("expected at least one value", param_hint=option)
        return items

    return parse


def comma_words(value: str | None) -> tuple[str, ...] | None:
    return None if value is None else tuple(p.strip() for p in value.split(",") if p.strip())


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def fail(message: str, code: int = 1) -> None:
    click.echo(f"mono-jit: error: {message}", err=True)
    sys.exit(code)


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn MonoJitError into a one-line error and exit 1 (bad arguments exit 2 through click)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except MonoJitError as exc:
            fail(str(exc))

    return wrapper


def human_bytes(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"
