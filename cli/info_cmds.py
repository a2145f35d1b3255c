"""`doctor` (toolchain and cache health), `stats` (hit / miss / compile counters and sizes) and
`config` (every setting with its source)."""

from __future__ import annotations

import click

from mono_jit import api
from mono_jit.config import Settings

from .context import cache_dir_option, settings_for
from .options import emit_json, guarded, human_bytes, json_option, plain, report_checks, say


@click.command()
@click.option("--deep", is_flag=True, help="Also re-hash FlyDSL's installed files against its RECORD (slow).")
@cache_dir_option
@json_option
@guarded
def doctor(deep, cache_dir, as_json):
    """Check the toolchain (FlyDSL, ld.lld, device bitcode), the cache roots and their entries.
    On a host without FlyDSL the toolchain check says it serves hits only. Exits 1 if a check fails."""
    checks = api.doctor(deep=deep, settings=settings_for(cache_dir))
    report_checks("doctor", checks, as_json)


@click.command()
@click.option("--zero", is_flag=True, help="Reset the counters (the entries stay).")
@cache_dir_option
@json_option
@guarded
def stats(zero, cache_dir, as_json):
    """Show the cache's hit / miss / compile counters (every process that used this writable
    cache, since it was created or last zeroed) and what each layer holds, as `ccache -s` does.
    Offline lookups and read-only stores count nothing (offline writes nothing)."""
    report = api.stats(zero=zero, settings=settings_for(cache_dir))
    if as_json:
        emit_json("stats", report.as_dict())
        return
    counters = report.counters
    lookups = counters["hits"] + counters["misses"]
    rate = f" ({100 * counters['hits'] / lookups:.1f}% hits)" if lookups else ""
    click.echo(f"since        {report.since or 'the cache was created'}")
    click.echo(f"lookups      {lookups}{rate}")
    for name in ("hits", "misses", "compiled", "failed"):
        click.echo(f"  {name:10} {counters[name]}")
    click.echo(f"entries      {report.entries} ({human_bytes(report.total_bytes)})")
    for layer in report.layers:
        kind = "writable" if layer["writable"] else "read-only"
        click.echo(f"  {kind:10} {layer['root']}: {layer['entries']} entries, {human_bytes(layer['bytes'])}")
    if zero:
        say("counters zeroed")
    if not report.recorded:
        say("this store writes nothing (offline or read-only): its lookups are not counted")


@click.command()
@json_option
@guarded
def config(as_json):
    """Show every setting in force, the variable that sets it and where its value came from."""
    rows = [{"name": s.name, "env": s.env, "value": s.value, "source": s.source, "help": s.help}
            for s in Settings().items()]
    removed = api.worker_env_removed()
    rows.append({"name": "worker_env_removed", "env": "FLYDSL_*, ARCH, COMPILE_ONLY, HSA_OVERRIDE_GFX_VERSION",
                 "value": [f"{k}={v}" for k, v in removed.items()], "source": "env" if removed else "default",
                 "help": "variables here that compile workers run without (they change FlyDSL's output)"})
    if as_json:
        emit_json("config", {"settings": rows})
        return
    for r in rows:
        click.echo(f"{r['name']:20} {plain(r['value']):50} [{r['source']}: {r['env']}]  {r['help']}")


COMMANDS = (doctor, stats, config)
