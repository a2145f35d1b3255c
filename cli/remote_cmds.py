"""push / pull: the cache as OCI artifacts in a container registry (see mono_jit.cache.oci)."""

from __future__ import annotations

from pathlib import Path

import click

from mono_jit.config import Settings

from .context import cache_dir_option, settings_for
from .options import emit_json, guarded, human_bytes, json_option, template_option

insecure_option = click.option(
    "--insecure", is_flag=True,
    help="Talk plain HTTP to REF's registry (default: HTTPS, unless MONO_JIT_REMOTE_INSECURE names it).")


def _reference(ctx: click.Context, param: click.Parameter, value: str):  # type: ignore[no-untyped-def]
    from mono_jit.cache.oci.reference import parse_reference

    try:
        return parse_reference(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="REF") from None


def _registry(ref, settings: Settings, insecure: bool):  # type: ignore[no-untyped-def]
    from mono_jit.cache.oci.client import Registry  # imports oras: only these commands need it

    plain = insecure or ref.registry in settings.remote_insecure
    return Registry(ref, insecure=plain, timeout=float(settings.remote_timeout))


@click.command()
@click.argument("ref", callback=_reference)
@template_option()
@click.option("--replace", is_flag=True, help="List only this cache's entries at REF (default: add them to what "
                                              "REF lists).")
@insecure_option
@cache_dir_option
@json_option
@guarded
def push(ref, templates, replace, insecure, cache_dir, as_json):
    """Push the cache's entries to a registry as one OCI artifact: one blob per entry (sent only
    if REF does not list it already), one manifest listing them with their specs and toolchains.

    \b
    Credentials are read as registry tools read them (docker's config file, DOCKER_CONFIG,
    REGISTRY_AUTH_FILE, ORAS_USER / ORAS_PASS) and never stored.
    REF is an OCI reference, e.g. registry.example/team/mono-jit:dsv4-pro-tp8
    """
    from mono_jit.cache import Store
    from mono_jit.cache.oci.transfer import push as push_entries

    settings = settings_for(cache_dir)
    entries = [e for e in Store(settings).served() if templates is None or e.meta.template in templates]
    report = push_entries(_registry(ref, settings, insecure), entries, replace=replace)
    if as_json:
        emit_json("push", report)
        return
    click.echo(f"pushed {report['added']} entries to {ref} ({report['uploaded']} blobs, "
               f"{human_bytes(report['bytes'])} sent); {report['already_listed']} listed already; "
               f"{ref} lists {report['listed']}" + ("" if report["manifest_written"] else " (manifest unchanged)"))


@click.command()
@click.argument("ref", callback=_reference)
@click.option("--image-layer", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Pull into this read-only image layer (folders 0755, files 0444, as prebuild --image-layer) "
                   "instead of the writable cache.")
@insecure_option
@cache_dir_option
@json_option
@guarded
def pull(ref, image_layer, insecure, cache_dir, as_json):
    """Fetch the entries REF lists that the local layers lack (one request for the manifest,
    one per missing entry), verify every one as a local load does, and publish them only when
    all passed. REF may pin the manifest: REGISTRY/REPOSITORY@sha256:DIGEST.

    \b
    REF is an OCI reference, e.g. registry.example/team/mono-jit:dsv4-pro-tp8
    In a Dockerfile: RUN mono-jit pull REF --image-layer /opt/mono-jit
    """
    from mono_jit.cache import Store
    from mono_jit.cache.oci.transfer import pull as pull_entries

    settings = settings_for(cache_dir)
    store = Store(settings, read_only=image_layer is not None)  # into an image layer: no writable cache made
    report = pull_entries(_registry(ref, settings, insecure), store, image_layer)
    if as_json:
        emit_json("pull", report)
        return
    others = f"; skipped {report['other_arch']} for {', '.join(report['other_arches'])}" if report["other_arch"] else ""
    click.echo(f"pulled {report['fetched']} entries ({human_bytes(report['bytes'])}) from {ref} into "
               f"{report['target']}; {report['present']} here already{others}")


COMMANDS = (push, pull)
