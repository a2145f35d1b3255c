"""`prebuild` (fill the cache for a deployment) and `verify` (check entries, prove determinism)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from mono_jit import model
from mono_jit.build import BuildJob
from mono_jit.cache import Entry, Store
from mono_jit.cache.layer import publish_image_layer
from mono_jit.compiler import compile_here
from mono_jit.config import Settings
from mono_jit.errors import MonoJitError, SpecError
from mono_jit.prebuild import prebuild as run_prebuild
from mono_jit.spec import RATIOS, STANDARD_MAX_TOKENS, SUPPORTED_ARCHS, deployment_grid
from mono_jit.templates import all_templates, get
from mono_jit.toolchain import compile_environment, resolve_toolchain
from mono_jit.workers import WorkerPool

from .context import cache_dir_option, settings_for, store_for
from .options import comma_ints, comma_words, emit_json, guarded


def _default_jobs() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


@click.command()
@click.option("--tp", type=int, default=8, show_default=True, help="Tensor-parallel size.")
@click.option("--max-model-len", type=int, default=model.MAX_MODEL_LEN, show_default=True,
              help="Max context; sets the HCA top-k width roundup(ceil(len / 128), 128).")
@click.option("--max-tokens", callback=comma_ints("--max-tokens"), default=None,
              help=f"Comma list of max-tokens buckets [default: {','.join(map(str, STANDARD_MAX_TOKENS))}].")
@click.option("--ratio", callback=comma_ints("--ratio"), default=None,
              help="Comma list of compress ratios, 4 (CSA) and/or 128 (HCA) [default: 4,128].")
@click.option("--template", "template_names", default=None,
              help="Comma list of templates [default: every registered template].")
@click.option("--arch", type=click.Choice(SUPPORTED_ARCHS), default="gfx950", show_default=True)
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=_default_jobs, show_default="CPUs, at most 8",
              help="Compile worker processes.")
@click.option("--timeout", type=click.FloatRange(min=1), default=600.0, show_default=True,
              help="Seconds one compile may take before its worker is killed.")
@click.option("--image-layer", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Also copy the built entries into this folder as a read-only cache layer any user can read "
                   "(folders 0755, files 0444): serve it with MONO_JIT_CACHE_PATH.")
@cache_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON summary on stdout.")
@guarded
def prebuild(tp, max_model_len, max_tokens, ratio, template_names, arch, jobs, timeout, image_layer, cache_dir,
             as_json):
    """Compile every kernel a deployment needs into the cache (no GPU needed).

    Defaults build DeepSeek-V4-Pro at TP8 with a 1M context for gfx950: every template at every
    ratio and max-tokens bucket. A second run is all hits. Exits 1 if any build failed. With
    --image-layer, the entries are also published into that folder for a container image's
    serving user (README, "Image layers").
    """
    try:
        specs = deployment_grid(tp, max_model_len, max_tokens or STANDARD_MAX_TOKENS, ratio or RATIOS, arch)
    except SpecError as exc:
        raise click.UsageError(str(exc))
    names = comma_words(template_names, "--template")
    try:
        templates = [get(n) for n in names] if names else list(all_templates().values())
    except MonoJitError as exc:
        raise click.BadParameter(str(exc), param_hint="--template")
    settings = settings_for(cache_dir)
    console = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=as_json) as bar:
        task = bar.add_task("prebuild", total=None)

        def progress(event: str, job: BuildJob, detail: str) -> None:
            bar.update(task, advance=1, description=f"{event} {job.label}")
            if event == "failed":
                console.print(f"[red]failed[/red] {escape(detail)}", soft_wrap=True)  # one line, markup-free
            elif not console.is_terminal:  # no bar off a TTY (a docker build log): one line a job
                done = bar.tasks[0].completed
                console.print(f"[{done:.0f}/{bar.tasks[0].total or '?'}] {event} {escape(job.label)}", soft_wrap=True,
                              markup=False)

        summary, planned = run_prebuild(templates, specs, settings, jobs=jobs, timeout=timeout, progress=progress,
                                        on_plan=lambda count: bar.update(task, total=count))
    layer = {}
    if image_layer is not None and not summary.failed:
        store = Store(settings)
        entries = [store.lookup(job.key, job.arch) for job in planned]
        missing = [job.label for job, entry in zip(planned, entries) if entry is None]
        if missing:
            raise MonoJitError(f"cannot publish the image layer: {', '.join(missing[:3])} left the cache")
        added = publish_image_layer(list({e.key: e for e in entries}.values()), image_layer)
        layer = {"image_layer": str(image_layer), "image_layer_added": added}
    if as_json:
        emit_json({**summary.as_dict(), "cache_dir": str(settings.writable_root), "jobs": len(planned), **layer})
    else:
        click.echo(f"{len(planned)} builds: {summary.compiled} compiled, {summary.hits} hits, "
                   f"{len(summary.failed)} failed in {summary.seconds:.1f} s -> {settings.writable_root}")
        if layer:
            click.echo(f"image layer {image_layer}: {layer['image_layer_added']} entries added")
    if summary.failed:
        raise SystemExit(1)


def _rebuild_hashes(entries: list[Entry], settings: Settings, jobs: int, timeout: float) -> dict[str, str]:
    """Recompile each entry's template and spec in workers; {key: sha256 of the new bytes, or error}."""
    toolchain = resolve_toolchain(settings)
    out: dict[str, str] = {}
    by_arch: dict[str, list[Entry]] = {}
    for entry in entries:
        by_arch.setdefault(entry.arch, []).append(entry)
    for arch, group in by_arch.items():
        items = [(entry.key, (entry.meta["template"], entry.meta["build_spec"])) for entry in group]
        with WorkerPool(jobs, compile_environment(toolchain, arch), compile_here, timeout) as pool:
            for outcome in pool.run(items):
                out[outcome.job_id] = (hashlib.sha256(outcome.value["hsaco"]).hexdigest()
                                       if outcome.status == "ok" else f"error: {outcome.value}")
    return out


@click.command()
@click.option("--rebuild", is_flag=True, help="Recompile every entry and require identical bytes (determinism).")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=_default_jobs, show_default="CPUs, at most 8")
@click.option("--timeout", type=click.FloatRange(min=1), default=600.0, show_default=True)
@cache_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@guarded
def verify(rebuild, jobs, timeout, cache_dir, as_json):
    """Check every entry (size, sha256, ELF header, key); with --rebuild also recompile and compare.

    Exits 1 if any entry is bad or a rebuild differs. Bad entries in the writable layer are
    reported here and quarantined at their next load.
    """
    store = store_for(cache_dir)
    good: dict[str, Entry] = {}
    results = []
    for item in store.entries():
        if isinstance(item, Entry):
            good[item.key] = item
            results.append({"key": item.key, "template": item.meta["template"], "ok": True})
        else:
            path, reason = item
            results.append({"key": path.name, "ok": False, "error": reason})
    if rebuild and good:
        fresh = _rebuild_hashes(list(good.values()), store.settings, jobs, timeout)
        for row in results:
            if row["ok"]:
                row["rebuilt_sha256"] = fresh.get(row["key"])
                row["identical"] = row["rebuilt_sha256"] == good[row["key"]].meta["hsaco"]["sha256"]
                row["ok"] = row["identical"]
                if not row["identical"]:
                    row["error"] = f"rebuilt bytes differ ({row['rebuilt_sha256']})"
    bad = [r for r in results if not r["ok"]]
    if as_json:
        emit_json({"entries": results, "bad": len(bad), "rebuild": rebuild})
    else:
        for row in results:
            status = "ok" if row["ok"] else "BAD"
            extra = " (rebuilt identical)" if row.get("identical") else row.get("error", "")
            click.echo(f"{status:4} {row['key'][:16]} {row.get('template', '?'):10} {extra}")
        click.echo(f"{len(results) - len(bad)} good, {len(bad)} bad")
    if bad:
        raise SystemExit(1)


COMMANDS = (prebuild, verify)
