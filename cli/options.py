"""What every command shares: option parsing (comma lists, template names), verbosity, output
(JSON with a schema, plain text without Python reprs) and the exit codes.

Exit codes: 0 done; 1 the operation failed or a check failed (one line on stderr); 2 a usage
error (a bad option or value, an unknown template), from click.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable

import click

from mono_jit.api import Checks
from mono_jit.config import bounded_seconds
from mono_jit.errors import MonoJitError

SCHEMA_VERSION = 1


# -- verbosity ---------------------------------------------------------------------------------

def verbosity() -> int:
    """-1 with -q, 0 by default, 1 with -v, 2 with -vv (set on the root command)."""
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root() if ctx is not None else None
    return root.obj if root is not None and isinstance(root.obj, int) else 0


def set_verbosity(ctx: click.Context, verbose: int, quiet: bool) -> None:
    """Record the level for the commands and route mono-jit's logging: -q errors only, default
    warnings, -v cache and lock decisions (INFO), -vv everything (DEBUG)."""
    if verbose and quiet:
        raise click.UsageError("-v and -q contradict each other: give one")
    level = -1 if quiet else min(verbose, 2)
    ctx.obj = level
    threshold = {-1: logging.ERROR, 0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG}[level]
    log = logging.getLogger("mono_jit")
    handler = next((h for h in log.handlers if isinstance(h, _Stderr)), None)
    if handler is None:
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("mono-jit: %(message)s"))
        log.addHandler(handler)
    handler.setLevel(threshold)
    log.setLevel(threshold if level > 0 else logging.NOTSET)  # INFO / DEBUG records only when asked for


class _Stderr(logging.Handler):
    """mono-jit's log lines on the current stderr (looked up at each record, as click does)."""

    def emit(self, record: logging.LogRecord) -> None:
        click.echo(self.format(record), err=True)


def say(message: str) -> None:
    """A line of commentary on stdout (totals, notes), left out with -q; data is always printed."""
    if verbosity() >= 0:
        click.echo(message)


def note(message: str) -> None:
    """A line about what this host cannot do, on stderr, left out with -q."""
    if verbosity() >= 0:
        click.echo(f"mono-jit: note: {message}", err=True)


# -- parsing -----------------------------------------------------------------------------------

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
            raise click.BadParameter(f"{value!r}: expected at least one value", param_hint=option)
        return items

    return parse


class Seconds(click.ParamType):
    """A number of seconds, finite, at least `lowest` and at most a day (config.bounded_seconds):
    NaN and inf are refused as any other bad value is."""

    name = "seconds"

    def __init__(self, lowest: float) -> None:
        self.lowest = lowest

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float):
            return value  # the default
        try:
            return bounded_seconds(float(value), self.lowest, given=repr(value))
        except ValueError as exc:
            if "seconds" not in str(exc):  # not a number at all
                exc = ValueError(f"expected a number of seconds, got {value!r}")
            self.fail(str(exc), param, ctx)


def comma_words(value: str | None, option: str) -> tuple[str, ...] | None:
    """'a,b' -> ('a', 'b'); None when the option was not given; a usage error when it names nothing."""
    if value is None:
        return None
    words = tuple(p.strip() for p in value.split(",") if p.strip())
    if not words:
        raise click.BadParameter(f"{value!r}: expected at least one name", param_hint=option)
    return words


def _known_templates(names: tuple[str, ...]) -> tuple[str, ...]:
    """`names` if each is a registered template; the one usage error for an unknown one."""
    from mono_jit.templates import all_templates

    known = all_templates()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise click.BadParameter(f"{unknown[0]!r} is not a registered template; known: {', '.join(sorted(known))}",
                                 param_hint="--template")
    return names


def template_option(required: bool = False, single: bool = False) -> Callable[[Callable], Callable]:
    """--template: a comma list of registered template names (one name with `single`); the
    command gets a tuple of names, or None when the option was not given."""

    def parse(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, ...] | None:
        names = comma_words(value, "--template")
        if names is None:
            if required:  # click 8.2+ accepts a missing option whose default is None as given
                raise click.MissingParameter(ctx=ctx, param=param)
            return None
        _known_templates(names)
        if single and len(names) != 1:
            raise click.BadParameter(f"{value!r}: expected one template name", param_hint="--template")
        return names

    help_text = "Template name." if single else "Comma list of template names."
    return click.option("--template", "templates", callback=parse, default=None, required=required,
                        help=help_text + " (`mono-jit doctor` lists the registered ones.)")


def json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True,
                        help="Print one JSON object on stdout (its 'schema' names its shape).")(fn)


# -- output ------------------------------------------------------------------------------------

def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"{type(value).__name__} is not part of mono-jit's JSON output")


def emit_json(kind: str, data: dict) -> None:
    """`data` as one JSON object with "schema": "mono-jit-<kind>/1" (paths as strings)."""
    click.echo(json.dumps({**_jsonable(data), "schema": f"mono-jit-{kind}/{SCHEMA_VERSION}"}, indent=2,
                          sort_keys=True))


def plain(value: Any) -> str:
    """A value as text for people: 'k=v, k=v', 'a, b', '-' for nothing, paths as paths; never a
    Python repr."""
    if isinstance(value, dict):
        return ", ".join(f"{k}={plain(v)}" for k, v in value.items()) or "-"
    if isinstance(value, (list, tuple)):
        return ", ".join(plain(v) for v in value) or "-"
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def human_bytes(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def report_checks(schema: str, checks: Checks, as_json: bool) -> None:
    """A check report (`doctor`, `selftest`): one JSON object, or a line a check; exit 1 unless
    every check passed."""
    if as_json:
        emit_json(schema, checks.as_dict())
    else:
        for row in checks.rows:
            click.echo(f"{'ok ' if row['ok'] else 'BAD'} {row['check']}: {plain(row['detail'])}")
    if not checks.ok:
        raise SystemExit(1)


# -- errors ------------------------------------------------------------------------------------

def fail(message: str, code: int = 1) -> None:
    click.echo(f"mono-jit: error: {message}", err=True)
    sys.exit(code)


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn MonoJitError and OSError into a one-line error and exit 1 (bad arguments exit 2
    through click), and Ctrl-C into a line saying what was kept and exit 130."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except MonoJitError as exc:
            fail((str(exc).splitlines() or [type(exc).__name__])[0])  # a compile error's FlyDSL tail stays out
        except KeyboardInterrupt:  # Ctrl-C: say what stays, exit as a shell does for SIGINT
            click.echo("\nmono-jit: interrupted: what finished is kept (each entry, bundle or layer entry is published "
                       "whole, by one rename), nothing half-written; run the command again to go on", err=True)
            sys.exit(130)
        except BrokenPipeError:  # the reader went away (`| head`): nothing more to say
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(1)
        except OSError as exc:  # a path the user gave or the cache holds: say which and why
            where = f"{exc.filename}: " if exc.filename else ""
            fail(f"{where}{exc.strerror or exc}")

    return wrapper
