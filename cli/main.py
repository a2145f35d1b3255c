"""`mono-jit`: build, inspect and manage the mono decode kernel cache.

Every command that touches the cache takes --cache-dir (default: MONO_JIT_CACHE_DIR, else the
platform cache folder); commands whose output is data take --json. Each command is a thin face
over one function of the Python API (mono_jit.api).
"""

from __future__ import annotations

import click

from . import build_cmds, gpu_cmds, info_cmds, remote_cmds, store_cmds
from .options import set_verbosity


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="mono-jit")
@click.option("-v", "--verbose", count=True, help="-v: log cache and lock decisions and every finished job; "
                                                  "-vv: debug logs.")
@click.option("-q", "--quiet", is_flag=True, help="Only errors, failures and the command's data: no progress, "
                                                  "warnings, notes or totals.")
@click.pass_context
def main(ctx: click.Context, verbose: int, quiet: bool) -> None:
    """JIT compilation service and on-disk cache for the DeepSeek-V4-Pro mono decode kernels
    (FlyDSL -> HSACO for AMD MI355X / gfx950; no GPU needed to build).

    Exit codes: 0 done; 1 the operation or a check failed (one line on stderr); 2 a usage
    error (a bad option or value, an unknown template); 130 interrupted (Ctrl-C)."""
    set_verbosity(ctx, verbose, quiet)


for module in (build_cmds, store_cmds, info_cmds, gpu_cmds, remote_cmds):
    for command in module.COMMANDS:
        main.add_command(command)


if __name__ == "__main__":
    main()
