"""Commands over the store: list, inspect, explain, gc, clear, export, import."""

from __future__ import annotations

import re
import time
from pathlib import Path

import click

from mono_jit.build import BuildJob
from mono_jit.cache import Entry, Store
from mono_jit.cache.bundle import export_bundle, import_bundle
from mono_jit.cache.gc import collect
from mono_jit.cache.key import diff
from mono_jit.cache.store import last_used
from mono_jit.errors import MonoJitError, SpecError
from mono_jit.spec import SUPPORTED_ARCHS, Spec
from mono_jit.templates import get
from mono_jit.toolchain import resolve_toolchain

from .context import cache_dir_option, settings_for, store_for
from .options import emit_json, guarded, human_bytes

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def _good(store: Store) -> list[Entry]:
    """The copy each key is served from (a bad copy in one layer never hides a good one)."""
    return list(store.served())


def _summary(entry: Entry) -> dict:
    kernel = entry.meta["kernels"][0]
    return {"key": entry.key, "template": entry.meta["template"], "spec": entry.meta["spec"], "arch": entry.arch,
            "path": str(entry.path), "layer": "writable" if entry.layer.writable else "read-only",
            "bytes": entry.meta["hsaco"]["size"], "vgpr": kernel["vgpr"], "agpr": kernel["agpr"],
            "sgpr": kernel["sgpr"], "lds": kernel["lds"], "scratch": kernel["scratch"],
            "compile_seconds": entry.meta.get("compile_seconds"),
            "last_used": time.strftime("%Y-%m-%d %H:%M", time.localtime(last_used(entry.path)))}


def _status(entry: Entry) -> str:
    """"ok", or "stale" when the installed template's sources differ from those that built it
    (a lookup never reaches it again: gc collects it), or "unknown template"."""
    try:
        installed = get(entry.meta["template"]).source_digest()
    except MonoJitError:
        return "unknown template"
    return "ok" if entry.meta["factors"]["template"]["source_digest"] == installed else "stale"


@click.command(name="list")
@click.option("--template", default=None, help="Only entries of this template.")
@cache_dir_option
@json_option
@guarded
def list_entries(template, cache_dir, as_json):
    """List the cache entries served from every layer (read-only layers first), each "ok" or
    "stale" (built from template sources other than the installed ones); `verify` shows the
    copies that fail verification."""
    rows = [{**_summary(e), "status": _status(e)} for e in _good(store_for(cache_dir))
            if template in (None, e.meta["template"])]
    if as_json:
        emit_json(rows)
        return
    for r in rows:
        spec = " ".join(f"{k}={v}" for k, v in r["spec"].items() if k != "arch")
        status = "" if r["status"] == "ok" else f"  {r['status'].upper()}"
        click.echo(f"{r['key'][:16]}  {r['template']:9} {spec:40} {human_bytes(r['bytes']):>9}  "
                   f"v{r['vgpr']}/a{r['agpr']}/s{r['sgpr']} lds {r['lds']}  {r['layer']}{status}")
    click.echo(f"{len(rows)} entries")


def _find(store: Store, prefix: str) -> Entry:
    if not re.fullmatch(r"[0-9a-f]{4,64}", prefix):
        raise click.BadParameter(f"{prefix!r}: expected a key or a hex prefix of at least 4 characters", param_hint="KEY")
    matches = [e for e in _good(store) if e.key.startswith(prefix)]
    if len(matches) != 1:
        raise MonoJitError(f"key prefix {prefix!r} matches {len(matches)} entries; give more characters")
    return matches[0]


@click.command()
@click.argument("key")
@cache_dir_option
@json_option
@guarded
def inspect(key, cache_dir, as_json):
    """Show one entry: spec, factors, code-object figures and residency on an MI355X CU."""
    entry = _find(store_for(cache_dir), key)
    if as_json:
        emit_json({**entry.meta, "path": str(entry.path)})
        return
    meta = entry.meta
    click.echo(f"key        {entry.key}\npath       {entry.path}\ntemplate   {meta['template']}  spec {meta['spec']}")
    click.echo(f"hsaco      {meta['hsaco']['size']} B  sha256 {meta['hsaco']['sha256']}")
    click.echo(f"launch     grid {meta['launch']['grid']} block {meta['launch']['block']} "
               f"dynamic LDS {meta['launch']['dynamic_lds']}  persistent {meta['persistent']}")
    for k in meta["kernels"]:
        click.echo(f"kernel     {k['name']}: VGPR {k['vgpr']} AGPR {k['agpr']} SGPR {k['sgpr']} LDS {k['lds']} B "
                   f"scratch {k['scratch']} B spills {k['vgpr_spills']}+{k['sgpr_spills']} wave {k['wavefront_size']} "
                   f"kernarg {k['kernarg_size']} B")
        res = meta["residency"].get(k["name"])
        if res:
            click.echo(f"residency  {res['waves_per_cta']} waves/CTA, {res['waves_per_simd']} per SIMD, "
                       f"{res['regs_per_wave']} regs/wave, {res['ctas_per_cu']} CTA(s) per CU fit")
    click.echo(f"budget     {meta['budget']}  compiled in {meta['compile_seconds']} s on {meta['created']}")
    for name, value in sorted(meta["factors"]["toolchain"].items()):
        click.echo(f"toolchain  {name} = {value}")


@click.command()
@click.option("--template", required=True, help="Template name.")
@click.option("--tp", type=int, default=8, show_default=True)
@click.option("--ratio", type=int, default=4, show_default=True)
@click.option("--topk-width", type=int, default=None, help="Default: 1024 for ratio 4, 8192 for 128.")
@click.option("--max-tokens", type=int, default=1, show_default=True)
@click.option("--arch", type=click.Choice(SUPPORTED_ARCHS), default="gfx950", show_default=True)
@cache_dir_option
@json_option
@guarded
def explain(template, tp, ratio, topk_width, max_tokens, arch, cache_dir, as_json):
    """Say whether a spec hits, and if not, which key factors differ from the nearest entry."""
    width = topk_width if topk_width is not None else (1024 if ratio == 4 else 8192)
    try:
        spec = Spec(tp, ratio, width, max_tokens, arch)
    except SpecError as exc:
        raise click.UsageError(str(exc))
    settings = settings_for(cache_dir)
    store = Store(settings)
    job = BuildJob.plan(get(template), spec, resolve_toolchain(settings).fingerprint)
    hit = store.lookup(job.key, arch)
    candidates = [e for e in _good(store) if e.meta["template"] == template]
    nearest = min(candidates, key=lambda e: len(diff(job.factors, e.meta["factors"])), default=None)
    differences = [] if nearest is None else diff(job.factors, nearest.meta["factors"])
    report = {"key": job.key, "hit": hit is not None, "nearest": nearest.key if nearest else None,
              "differences": [{"factor": f, "wanted": w, "stored": s} for f, w, s in differences]}
    if as_json:
        emit_json(report)
        return
    if hit is not None:
        click.echo(f"hit: {job.label} is entry {job.key[:16]} at {hit.path}")
    elif nearest is None:
        click.echo(f"miss: no {template} entry at all; run mono-jit prebuild --template {template}")
    else:
        click.echo(f"miss: {job.label} wants key {job.key[:16]}; nearest entry {nearest.key[:16]} differs in:")
        for factor, wanted, stored in differences:
            click.echo(f"  {factor}: wanted {wanted!r}, stored {stored!r}")


_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?$", re.IGNORECASE)
_AGE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")


def _parse_size(ctx, param, value):
    if value is None:
        return None
    match = _SIZE.match(value.strip())
    if not match:
        raise click.BadParameter(f"{value!r}: expected a size such as 500M or 2G", param_hint="--max-size")
    return int(float(match.group(1)) * 1024 ** "BKMGT".index((match.group(2) or "B").upper()))


def _parse_age(ctx, param, value):
    if value is None:
        return None
    match = _AGE.match(value.strip())
    if not match:
        raise click.BadParameter(f"{value!r}: expected an age such as 12h, 30d or 2w", param_hint="--older-than")
    return float(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[match.group(2)]


@click.command()
@click.option("--max-size", callback=_parse_size, default=None, help="Keep the writable layer under this size (e.g. 2G).")
@click.option("--older-than", callback=_parse_age, default=None, help="Remove entries unused for this long (e.g. 30d).")
@click.option("--dry-run", is_flag=True, help="Only say what would be removed.")
@cache_dir_option
@json_option
@guarded
def gc(max_size, older_than, dry_run, cache_dir, as_json):
    """Evict least-recently-used entries of the writable layer by age and/or total size, and
    remove what killed runs left (temporary folders older than an hour; quarantined entries but
    the newest few). With neither --max-size nor --older-than, only those leftovers go."""
    report = collect(store_for(cache_dir), max_bytes=max_size, older_than=older_than, dry_run=dry_run)
    if as_json:
        emit_json({**report.as_dict(), "dry_run": dry_run})
    else:
        verb = "would remove" if dry_run else "removed"
        click.echo(f"{verb} {len(report.removed)} entries ({human_bytes(report.freed_bytes)}); "
                   f"kept {report.kept} ({human_bytes(report.kept_bytes)})")
        for path in report.leftovers:
            click.echo(f"{verb} leftover {path}")


@click.command()
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@cache_dir_option
@json_option
@guarded
def clear(yes, cache_dir, as_json):
    """Remove every entry of the writable layer (read-only layers are never touched)."""
    if as_json and not yes:
        raise click.UsageError("clear --json cannot ask for confirmation: add --yes")
    store = store_for(cache_dir)
    paths = [item.path if isinstance(item, Entry) else item[0] for item in store.entries()]
    doomed = [p for p in paths if p.is_relative_to(store.writable.root)]
    if not yes:
        click.confirm(f"remove {len(doomed)} entries from {store.writable.root}?", abort=True)
    for path in doomed:
        store.remove(path)
    if as_json:
        emit_json({"removed": len(doomed)})
    else:
        click.echo(f"removed {len(doomed)} entries")


@click.command(name="export")
@click.argument("bundle", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--template", default=None, help="Only entries of this template.")
@cache_dir_option
@json_option
@guarded
def export_cmd(bundle, template, cache_dir, as_json):
    """Write cache entries to a tar bundle (.tar or .tar.gz) with a manifest of checksums."""
    entries = [e for e in _good(store_for(cache_dir)) if template in (None, e.meta["template"])]
    manifest = export_bundle(bundle, entries)
    if as_json:
        emit_json({"bundle": str(bundle), "entries": manifest["entries"], "files": len(manifest["files"])})
    else:
        click.echo(f"exported {manifest['entries']} entries to {bundle}")


def _parse_sha256(ctx, param, value):
    if value is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", value):
        raise click.BadParameter(f"{value!r}: expected 64 hex digits (sha256sum of the bundle)", param_hint="--sha256")
    return value


@click.command(name="import")
@click.argument("bundle", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--sha256", "expected_sha256", callback=_parse_sha256, default=None,
              help="Refuse the bundle unless its sha256 is this (a bundle is only as trustworthy as its source).")
@cache_dir_option
@json_option
@guarded
def import_cmd(bundle, expected_sha256, cache_dir, as_json):
    """Verify a bundle whole (paths, sizes, checksums, entries as a load would), then publish its entries."""
    counts = import_bundle(store_for(cache_dir), bundle, expected_sha256)
    if as_json:
        emit_json(counts)
    else:
        click.echo(f"imported {counts['imported']} entries ({counts['present']} already present)")


COMMANDS = (list_entries, inspect, explain, gc, clear, export_cmd, import_cmd)
