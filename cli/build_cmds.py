"""`prebuild` (fill the cache for a deployment) and `verify` (check entries, prove determinism):
the faces of mono_jit.api.prebuild and mono_jit.api.verify."""

from __future__ import annotations

from pathlib import Path

import click

from mono_jit import api, deepseek_v4
from mono_jit.errors import SpecError
from mono_jit.spec import RATIOS, STANDARD_MAX_TOKENS, SUPPORTED_ARCHS

from .context import cache_dir_option, settings_for
from .options import Seconds, comma_ints, emit_json, guarded, json_option, note, say, template_option, verbosity
from .progress import Reporter

jobs_option = click.option("--jobs", "-j", type=click.IntRange(min=1), default=api.default_jobs,
                           show_default="CPUs, at most 8", help="Compile worker processes.")
timeout_option = click.option("--timeout", type=Seconds(lowest=1), default=600.0, show_default=True,
                              help="Seconds one compile may take before its worker is killed.")


@click.command()
@click.option("--tp", type=int, default=8, show_default=True, help="Tensor-parallel size.")
@click.option("--max-model-len", type=int, default=deepseek_v4.MAX_MODEL_LEN, show_default=True,
              help="Max context; sets the HCA top-k width roundup(ceil(len / 128), 128).")
@click.option("--max-tokens", callback=comma_ints("--max-tokens"), default=None,
              help=f"Comma list of max-tokens buckets [default: {','.join(map(str, STANDARD_MAX_TOKENS))}].")
@click.option("--ratio", callback=comma_ints("--ratio"), default=None,
              help="Comma list of compress ratios, 4 (CSA) and/or 128 (HCA) [default: 4,128].")
@template_option()
@click.option("--arch", type=click.Choice(SUPPORTED_ARCHS), default="gfx950", show_default=True)
@jobs_option
@timeout_option
@click.option("--image-layer", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Also copy the built entries into this folder as a read-only cache layer any user can read "
                   "(folders 0755, files 0444): serve it with MONO_JIT_CACHE_PATH. A folder that exists must be "
                   "your own, writable by nobody else and not sticky: its mode is left as it is.")
@click.option("--check", is_flag=True,
              help="Build nothing: resolve every build of this grid offline from the cache layers, as a serving "
                   "process would (no FlyDSL needed), print each miss and why; exit 1 on any miss.")
@cache_dir_option
@json_option
@guarded
@click.pass_context
def prebuild(ctx, tp, max_model_len, max_tokens, ratio, templates, arch, jobs, timeout, image_layer, check, cache_dir,
             as_json):
    """Compile every kernel a deployment needs into the cache (no GPU needed).

    Defaults build DeepSeek-V4-Pro at TP8 with a 1M context for gfx950: the decode layer's
    templates (k1, k2) at every ratio and max-tokens bucket; plug-ins and stand-alone templates
    only when named or in MONO_JIT_PREBUILD_TEMPLATES. A second run is all hits. Exits 1 if any
    build failed. With --image-layer, the entries are also published into that folder for a
    container image's serving user (README, "Image layers"). With --check, nothing is built:
    the same grid is looked up offline (a serving image's build-time guard).
    """
    settings = settings_for(cache_dir)
    grid = dict(tp=tp, max_model_len=max_model_len, max_tokens=max_tokens or STANDARD_MAX_TOKENS,
                ratios=ratio or RATIOS, arch=arch, settings=settings)
    if check:
        _check(ctx, templates, grid, as_json)
        return
    try:
        with Reporter("prebuild", transient=as_json) as progress:
            report = api.prebuild(templates, jobs=jobs, timeout=timeout, image_layer=image_layer, progress=progress,
                                  **grid)
    except SpecError as exc:
        raise click.UsageError(str(exc))
    if settings.offline and report.compiled:
        note(f"MONO_JIT_OFFLINE=1 keeps lookups (resolve, serving) from compiling, not prebuild: {report.compiled} "
             f"build{'s' if report.compiled != 1 else ''} compiled here")
    if as_json:
        emit_json("prebuild", report.as_dict())
    else:
        fetched = f", {report.fetched} fetched from the registry" if report.fetched else ""
        say(f"{report.jobs} builds: {report.compiled} compiled, {report.hits} hits{fetched}, {len(report.failures)} "
            f"failed in {report.seconds:.1f} s -> {report.cache_dir}")
        if report.image_layer is not None:
            say(f"image layer {report.image_layer}: {report.image_layer_added} entries added")
    if not report.ok:
        raise SystemExit(1)


def _check(ctx: click.Context, templates: tuple[str, ...] | None, grid: dict, as_json: bool) -> None:
    """prebuild --check: the grid resolved offline, each miss printed with why, exit 1 on any."""
    building = [f"--{name.replace('_', '-')}" for name in ("jobs", "timeout", "image_layer")
                if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT]
    if building:
        raise click.UsageError(f"--check builds nothing: {', '.join(building)} does not apply to it")
    try:
        report = api.check_grid(templates, **grid)
    except SpecError as exc:
        raise click.UsageError(str(exc))
    if as_json:
        emit_json("prebuild-check", report.as_dict())
    else:
        for row in report.rows:
            if not row["hit"]:
                click.echo(f"miss {row['label']}\n     why: {row['reason']}")
            elif verbosity() > 0:
                click.echo(f"hit  {row['label']}: {row['path']}")
        summary = report.as_dict()
        say(f"{summary['builds']} builds: {summary['hits']} hits, {summary['misses']} misses "
            "(looked up offline; nothing compiled, fetched or written)")
    if not report.ok:
        raise SystemExit(1)


@click.command()
@click.option("--rebuild", is_flag=True, help="Recompile every entry and require identical bytes (determinism).")
@jobs_option
@timeout_option
@cache_dir_option
@json_option
@guarded
def verify(rebuild, jobs, timeout, cache_dir, as_json):
    """Check every entry (size, sha256, ELF header, key); with --rebuild also recompile and compare.

    Exits 1 if any entry is bad or a rebuild differs. Bad entries in the writable layer are
    reported here and quarantined at their next load. A rebuild can differ with both code objects
    sound: FlyDSL 0.5.0's LLVM emits k2 at max_tokens 64 (ratio 128) in two variants, one
    commutative operand order apart, depending on the compiling process's memory layout.
    """
    with Reporter("verify --rebuild", transient=as_json) as progress:
        report = api.verify(rebuild=rebuild, jobs=jobs, timeout=timeout, settings=settings_for(cache_dir),
                            progress=progress)
    if as_json:
        emit_json("verify", report.as_dict())
    else:
        for row in report.rows:
            status = "ok" if row["ok"] else "BAD"
            extra = " (rebuilt identical)" if row["identical"] else (row["error"] or "")
            click.echo(f"{status:4} {row['key'][:16]} {row['label'] or row['path']}  {extra}")
        say(f"{len(report.rows) - report.bad} good, {report.bad} bad")
    if report.bad:
        raise SystemExit(1)


COMMANDS = (prebuild, verify)
