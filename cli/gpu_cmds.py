"""`selftest`: is this GPU able to run the layer's kernels? With --emulate, on a machine with no
GPU: do the cached kernels compute what their references do on an emulated gfx950?"""

from __future__ import annotations

import click

from mono_jit import api
from mono_jit.config import Settings
from mono_jit.errors import SpecError
from mono_jit.spec import RATIOS, STANDARD_MAX_TOKENS, deployment_grid

from .context import cache_dir_option, settings_for
from .options import comma_ints, emit_json, guarded, json_option, note, plain, report_checks, say, template_option


@click.command()
@cache_dir_option
@click.option("--device", type=int, default=0, show_default=True, help="HIP device index to check.")
@click.option("--no-launch", is_flag=True, help="Only check the device and load the cached kernels.")
@click.option("--emulate", is_flag=True,
              help="No GPU: run the cached kernels on an emulated gfx950 against their references "
                   "(needs the emulate extra).")
@template_option()
@click.option("--tp", type=int, default=8, show_default=True, help="Tensor-parallel size of the kernels launched.")
@click.option("--ratio", callback=comma_ints("--ratio"), default=None,
              help="Compress ratios to launch, e.g. 4,128 (default both).")
@click.option("--max-tokens", callback=comma_ints("--max-tokens"), default=None,
              help="Max-tokens buckets to launch, e.g. 1,8 (default all).")
@json_option
@guarded
def selftest(cache_dir, device, no_launch, emulate, templates, tp, ratio, max_tokens, as_json):
    """Check the GPU (gfx950, enough CUs for the 256-CTA persistent grid, so no CPX / DPX
    partition), load every cached kernel through HIP, then launch each selected kernel of the
    cache (router, keytable and k1 by default, over the deployment's grid) on the device with
    seeded inputs and compare it with its torch reference. The checks come with the package: no
    source checkout is needed. With no GPU, says so and what --emulate would check instead.

    With --emulate (no GPU needed): the same launch checks on an emulated MI355X, and K2 on 8
    emulated ranks sharing peer memory (all four templates by default); one line (or JSON
    object) a kernel, exit 1 if any fails. A kernel missing from the cache is compiled
    first where FlyDSL is installed (set MONO_JIT_OFFLINE=1 to check only what is there). The
    emulator is not an MI355X: see docs/emulator.md for what it proves.
    """
    try:
        specs = deployment_grid(tp, max_tokens_buckets=max_tokens or STANDARD_MAX_TOKENS, ratios=ratio or RATIOS)
    except SpecError as exc:
        raise click.UsageError(str(exc))
    settings = settings_for(cache_dir)
    if emulate:
        _emulated(templates, specs, settings, as_json)
        return
    checks = api.selftest(device=device, launch=not no_launch, templates=templates, specs=specs, settings=settings)
    if not checks.rows[0]["ok"]:  # the hip check: no HIP runtime here
        missing = api.emulate_extra_missing()
        note("no GPU here (no HIP runtime): the device, the kernel loads and the launch checks were not run; "
             "mono-jit selftest --emulate runs the same launch checks on an emulated gfx950"
             + (f" (it needs the emulate extra: {' and '.join(missing)} not installed)" if missing else ""))
    report_checks("selftest", checks, as_json)


def _emulated(templates: tuple[str, ...] | None, specs: list, settings: Settings, as_json: bool) -> None:
    progress = None if as_json else (lambda what: say(f"emulating {what} ..."))
    results = api.selftest_emulated(templates=templates, specs=specs, settings=settings, progress=progress)
    if as_json:
        emit_json("selftest", {"emulated": True, "ok": all(r.ok for r in results),
                               "kernels": [r.as_dict() for r in results]})
    else:
        for r in results:
            figure = f"{r.measure} {r.error:.3g} (bound {r.bound:.3g})" if r.ok else r.problem
            say(f"{'ok  ' if r.ok else 'FAIL'} {r.template} {plain(r.spec)}: {figure}; "
                f"{r.wave_instructions:,} wave-instructions, {r.bytes_read:,} bytes read, {r.seconds:.1f} s")
        failed = sum(not r.ok for r in results)
        say(f"{len(results) - failed} of {len(results)} kernels match their references on the emulator")
    if not all(r.ok for r in results):
        raise SystemExit(1)


COMMANDS = (selftest,)
