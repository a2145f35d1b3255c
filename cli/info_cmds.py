"""`doctor` (toolchain and cache health) and `config` (every setting with its source)."""

from __future__ import annotations

import functools
import importlib.util

import click

from mono_jit.cache import Entry, Store
from mono_jit.config import Settings
from mono_jit.errors import MonoJitError
from mono_jit.templates import all_templates
from mono_jit.toolchain import flydsl_files_modified, resolve_toolchain

from .context import cache_dir_option, settings_for
from .options import Checks, emit_json, guarded


@click.command()
@click.option("--deep", is_flag=True, help="Also re-hash FlyDSL's installed files against its RECORD (slow).")
@cache_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
@guarded
def doctor(deep, cache_dir, as_json):
    """Check the toolchain (FlyDSL, ld.lld, device bitcode), the cache roots and their entries."""
    settings = settings_for(cache_dir)
    checks = Checks()

    @functools.cache
    def walk() -> tuple[Store, list]:
        """The store and every layer's copies, verified once for both checks that read them."""
        store = Store(settings)
        return store, list(store.entries())

    def toolchain():
        if importlib.util.find_spec("flydsl") is None:  # a lean serving host, by design
            return "none here (no FlyDSL): this host serves hits only; pip install 'mono-jit[build]' to compile"
        tc = resolve_toolchain(settings)
        entries = [e for e in walk()[1] if isinstance(e, Entry)]
        matching = sum(e.meta["factors"]["toolchain"] == tc.fingerprint for e in entries)
        if entries and not matching:
            raise MonoJitError(f"none of the {len(entries)} cache entries was built by this toolchain "
                               f"({tc.fingerprint}): every lookup here misses; run mono-jit prebuild "
                               "(mono-jit explain shows which factor differs)")
        return {"ld_lld_path": str(tc.linker.path), "bitcode": str(tc.bitcode_dir), **tc.fingerprint,
                "entries_built_by_it": matching}

    def cache():
        store, items = walk()
        bad = [str(item[0]) for item in items if not isinstance(item, Entry)]
        if bad:
            raise MonoJitError(f"{len(bad)} bad entries: {', '.join(bad[:3])}")
        return {"layers": [str(layer.root) for layer in store.layers], "entries": len(items)}

    def flydsl_files():
        modified = flydsl_files_modified()
        if modified:
            raise MonoJitError(f"{len(modified)} FlyDSL files differ from RECORD: {', '.join(modified[:3])}")
        return "every file matches RECORD"

    checks.run("toolchain", toolchain)
    checks.run("cache", cache)
    checks.run("templates", lambda: sorted(all_templates()))
    if deep:
        checks.run("flydsl_files", flydsl_files)
    checks.report(as_json)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the settings as JSON.")
@guarded
def config(as_json):
    """Show every setting in force, the variable that sets it and where its value came from."""
    rows = [{"name": s.name, "env": s.env, "value": s.value, "source": s.source, "help": s.help}
            for s in Settings().items()]
    if as_json:
        emit_json(rows)
        return
    for r in rows:
        click.echo(f"{r['name']:20} {str(r['value']):50} [{r['source']}: {r['env']}]  {r['help']}")


COMMANDS = (doctor, config)
