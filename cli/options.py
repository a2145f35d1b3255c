"""Parsing and output helpers shared by the commands."""

from __future__ import annotations

import json
import os
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


def comma_words(value: str | None, option: str) -> tuple[str, ...] | None:
    """'a,b' -> ('a', 'b'); None when the option was not given; a usage error when it names nothing."""
    if value is None:
        return None
    words = tuple(p.strip() for p in value.split(",") if p.strip())
    if not words:
        raise click.BadParameter(f"{value!r}: expected at least one name", param_hint=option)
    return words


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def fail(message: str, code: int = 1) -> None:
    click.echo(f"mono-jit: error: {message}", err=True)
    sys.exit(code)


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn MonoJitError and OSError into a one-line error and exit 1 (bad arguments exit 2
    through click)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except MonoJitError as exc:
            fail(str(exc))
        except BrokenPipeError:  # the reader went away (`| head`): nothing more to say
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(1)
        except OSError as exc:  # a path the user gave or the cache holds: say which and why
            where = f"{exc.filename}: " if exc.filename else ""
            fail(f"{where}{exc.strerror or exc}")

    return wrapper


class Checks:
    """Named checks run in order, each ok with its detail or failed with its error, then printed
    one a line or as JSON; a failed check makes the command exit 1."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def run(self, name: str, fn: Callable[[], Any]) -> Any:
        try:
            detail = fn()
        except (MonoJitError, OSError) as exc:
            self.rows.append({"check": name, "ok": False, "detail": str(exc)})
            return None
        self.rows.append({"check": name, "ok": True, "detail": detail})
        return detail

    def report(self, as_json: bool) -> None:
        ok = all(row["ok"] for row in self.rows)
        if as_json:
            emit_json({"ok": ok, "checks": self.rows})
        else:
            for row in self.rows:
                click.echo(f"{'ok ' if row['ok'] else 'BAD'} {row['check']}: {row['detail']}")
        if not ok:
            raise SystemExit(1)


def human_bytes(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"
