"""Commands over the store: list, inspect, explain, gc, clear, export, import (each the face of
one mono_jit.api function)."""

from __future__ import annotations

import re
from pathlib import Path

import click

from mono_jit import api, deepseek_v4
from mono_jit.errors import MonoJitError, SpecError
from mono_jit.spec import SUPPORTED_ARCHS, Spec, deployment_grid

from .context import cache_dir_option, settings_for
from .options import emit_json, guarded, human_bytes, json_option, note, plain, say, template_option


def _counters_line(counters: dict[str, int]) -> str:
    return ", ".join(f"{value} {name}" for name, value in counters.items())


@click.command(name="list")
@template_option()
@cache_dir_option
@json_option
@guarded
def list_entries(templates, cache_dir, as_json):
    """List the cache entries served from every layer (read-only layers first), each "ok" or
    "stale" (built from template sources other than the installed ones), then the total size
    and the hit / miss / compile counters (`mono-jit stats`); `verify` shows the copies that
    fail verification."""
    settings = settings_for(cache_dir)
    listing = api.list_entries(templates, settings=settings)
    counters = api.stats(settings=settings).counters
    lean = api.cannot_compile_here()
    if as_json:
        emit_json("list", {**listing.as_dict(), "counters": counters, "cannot_compile": lean})
        return
    for r in listing.entries:
        spec = " ".join(f"{k}={v}" for k, v in r["spec"].items() if k != "arch")
        status = "" if r["status"] == "ok" else f"  {r['status'].upper()}"
        click.echo(f"{r['key'][:16]}  {r['template']:9} {spec:40} {human_bytes(r['bytes']):>9}  "
                   f"v{r['vgpr']}/a{r['agpr']}/s{r['sgpr']} lds {r['lds']}  {r['layer']}{status}")
    say(f"{len(listing.entries)} entries; {human_bytes(listing.total_bytes)} in {len(listing.layers)} layer(s); "
        f"{_counters_line(counters)}")
    if lean:
        note(lean)


def _key_prefix(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{4,64}", value):
        raise click.BadParameter(f"{value!r}: expected a key or a hex prefix of at least 4 characters", param_hint="KEY")
    return value


@click.command()
@click.argument("key", callback=_key_prefix)
@cache_dir_option
@json_option
@guarded
def inspect(key, cache_dir, as_json):
    """Show one entry: spec, factors, code-object figures and residency on an MI355X CU."""
    entry = api.find_entry(key, settings=settings_for(cache_dir))
    lean = api.cannot_compile_here()
    if as_json:
        emit_json("inspect", {**entry.meta.to_json(), "meta_schema": entry.meta.schema, "path": str(entry.path),
                              "cannot_compile": lean})
        return
    meta, launch = entry.meta, entry.meta.launch
    click.echo(f"key        {entry.key}\npath       {entry.path}\ntemplate   {meta.template}  "
               f"spec {plain(dict(meta.spec))}")
    click.echo(f"hsaco      {meta.hsaco.size} B  sha256 {meta.hsaco.sha256}")
    click.echo(f"launch     grid {'x'.join(map(str, launch.grid))} block {'x'.join(map(str, launch.block))} "
               f"dynamic LDS {launch.dynamic_lds} B  persistent {plain(meta.persistent)}")
    for k in meta.kernels:
        click.echo(f"kernel     {k.name}: VGPR {k.vgpr} AGPR {k.agpr} SGPR {k.sgpr} LDS {k.lds} B "
                   f"scratch {k.scratch} B spills {k.vgpr_spills}+{k.sgpr_spills} wave {k.wavefront_size} "
                   f"kernarg {k.kernarg_size} B")
        res = meta.residency.get(k.name)
        if res:
            click.echo(f"residency  {res.waves_per_cta} waves/CTA, {res.waves_per_simd} per SIMD, "
                       f"{res.regs_per_wave} regs/wave, {res.ctas_per_cu} CTA(s) per CU fit")
    click.echo(f"budget     {plain(dict(meta.budget))}  compiled in {meta.compile_seconds} s on {meta.created}")
    for name, value in sorted(meta.toolchain.items()):
        click.echo(f"toolchain  {name} = {plain(value)}")
    if lean:
        note(f"{lean} (verify --rebuild cannot recompile this entry here)")


@click.command()
@template_option(required=True, single=True)
@click.option("--tp", type=int, default=8, show_default=True, help="Tensor-parallel size.")
@click.option("--ratio", type=int, default=4, show_default=True, help="Compress ratio: 4 (CSA) or 128 (HCA).")
@click.option("--max-model-len", type=int, default=deepseek_v4.MAX_MODEL_LEN, show_default=True,
              help="Max context; sets the HCA top-k width roundup(ceil(len / 128), 128), as prebuild does.")
@click.option("--topk-width", type=int, default=None, hidden=True,
              help="The top-k width itself (an older spelling; --max-model-len is the vocabulary).")
@click.option("--max-tokens", type=int, default=1, show_default=True, help="One max-tokens bucket.")
@click.option("--arch", type=click.Choice(SUPPORTED_ARCHS), default="gfx950", show_default=True)
@cache_dir_option
@json_option
@guarded
def explain(templates, tp, ratio, max_model_len, topk_width, max_tokens, arch, cache_dir, as_json):
    """Say whether a spec hits and which entry serves it (this host's toolchain's, or the same
    build by another toolchain when it has none); if not, whether its entry is corrupt or which
    kind of miss it is (not in any layer, built by another toolchain, unreadable) and which key
    factors differ from the nearest entry. Takes prebuild's options, one value each."""
    try:
        (spec,) = deployment_grid(tp, max_model_len, [max_tokens], [ratio], arch)
        if topk_width is not None:
            spec = Spec(tp, ratio, topk_width, max_tokens, arch)
    except SpecError as exc:
        raise click.UsageError(str(exc))
    (template,) = templates
    report = api.explain(template, spec, settings=settings_for(cache_dir))
    if as_json:
        emit_json("explain", report.as_dict())
        return
    if report.status == "hit":
        click.echo(f"hit: {report.label} is entry {report.key[:16]} at {report.path}")
        if report.served_by != "this host's toolchain":
            built_by = api.describe_toolchain(report.built_by)
            click.echo(f"served by the entry of another toolchain ({built_by}): {report.reason}")
    elif report.status == "corrupt":
        click.echo(f"corrupt: {report.label}: the entry at {report.path} fails verification ({report.reason}); "
                   "the next load sets it aside and compiles it again (a read-only layer's copy is skipped)")
    else:
        click.echo(f"miss ({report.miss_kind}): {report.label}: {report.reason}")
        if report.nearest is None:
            click.echo(f"no {template} entry at all; {api.fill_advice(template, spec)}")
        else:
            click.echo(f"nearest entry {report.nearest[:16]} differs in:")
            for row in report.differences:
                click.echo(f"  {row['factor']}: wanted {plain(row['wanted'])}, stored {plain(row['stored'])}")
    if report.toolchain != "this host's" and report.status != "hit":  # a hit needs no toolchain here
        note(f"keys computed with the toolchains {report.toolchain}")


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
    report = api.gc(max_size=max_size, older_than=older_than, dry_run=dry_run, settings=settings_for(cache_dir))
    if as_json:
        emit_json("gc", {**report.as_dict(), "dry_run": dry_run})
        return
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
    settings = settings_for(cache_dir)
    if not yes:
        click.confirm(f"remove every entry from {settings.writable_root}?", abort=True)
    removed = api.clear(settings=settings)
    if as_json:
        emit_json("clear", {"removed": removed})
    else:
        click.echo(f"removed {removed} entries")


@click.command(name="export")
@click.argument("bundle", type=click.Path(dir_okay=False, path_type=Path))
@template_option()
@cache_dir_option
@json_option
@guarded
def export_cmd(bundle, templates, cache_dir, as_json):
    """Write cache entries to a tar bundle (.tar or .tar.gz) with a manifest of checksums.

    The same cache always makes the same bundle, byte for byte; its sha256 is printed, for
    `mono-jit import --sha256` to pin."""
    if not bundle.parent.is_dir():
        raise MonoJitError(f"{bundle}: expected a file in an existing folder; {bundle.parent} is not one")
    exported = api.export(bundle, templates=templates, settings=settings_for(cache_dir))
    manifest = exported.manifest
    if as_json:
        emit_json("export", {"bundle": str(bundle), "entries": manifest["entries"], "files": len(manifest["files"]),
                             "sha256": exported.sha256})
    else:
        click.echo(f"exported {manifest['entries']} entries to {bundle}")
        click.echo(f"sha256 {exported.sha256}  (pin it: mono-jit import --sha256 {exported.sha256} {bundle.name})")


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
    """Verify a bundle whole (paths, sizes, checksums, entries as a load would), then publish its entries.

    An entry already present is kept; one whose code-object bytes differ from the bundle's is
    named in a warning line (and in --json's 'differing' list, there only when one differs)."""
    counts = api.import_bundle(bundle, sha256=expected_sha256, settings=settings_for(cache_dir))
    for name in counts.get("differing", []):
        click.echo(f"mono-jit: warning: {name}: the bundle's entry has this key but different code-object bytes "
                   "than the one present: kept the present one; the two build machines disagree (`mono-jit verify "
                   "--rebuild` on each says which one is not deterministic)", err=True)
    if as_json:
        emit_json("import", counts)
    else:
        click.echo(f"imported {counts['imported']} entries ({counts['present']} already present)")


COMMANDS = (list_entries, inspect, explain, gc, clear, export_cmd, import_cmd)
