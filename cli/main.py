"""`mono-jit`: build, inspect and manage the mono decode kernel cache.

Every command that touches the cache takes --cache-dir (default: MONO_JIT_CACHE_DIR, else the
platform cache folder); commands whose output is data take --json.
"""

from __future__ import annotations

import logging

import click

from . import build_cmds, gpu_cmds, info_cmds, remote_cmds, store_cmds


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="mono-jit")
@click.option("-v", "--verbose", is_flag=True, help="Log cache and lock decisions to stderr.")
def main(verbose: bool) -> None:
    """JIT compilation service and on-disk cache for the DeepSeek-V4-Pro mono decode kernels
    (FlyDSL -> HSACO for AMD MI355X / gfx950; no GPU needed to build)."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="mono-jit: %(message)s")


for module in (build_cmds, store_cmds, info_cmds, gpu_cmds, remote_cmds):
    for command in module.COMMANDS:
        main.add_command(command)


if __name__ == "__main__":
    main()
