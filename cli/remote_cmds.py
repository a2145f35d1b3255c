"""push / pull: the cache as OCI artifacts in a container registry, the faces of mono_jit.api.push
and mono_jit.api.pull."""

from __future__ import annotations

from pathlib import Path

import click

from mono_jit import api
from mono_jit.errors import RemoteError

from .context import cache_dir_option, settings_for
from .options import emit_json, guarded, human_bytes, json_option, template_option

insecure_option = click.option(
    "--insecure", is_flag=True,
    help="Talk plain HTTP to REF's registry (default: HTTPS, unless MONO_JIT_REMOTE_INSECURE names it).")


def _reference(ctx: click.Context, param: click.Parameter, value: str):  # type: ignore[no-untyped-def]
    try:
        return api.registry_reference(value)
    except RemoteError as exc:
        raise click.BadParameter(str(exc), param_hint="REF") from None


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
    report = api.push(ref, templates=templates, replace=replace, insecure=insecure, settings=settings_for(cache_dir))
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
    report = api.pull(ref, image_layer=image_layer, insecure=insecure, settings=settings_for(cache_dir))
    if as_json:
        emit_json("pull", report)
        return
    others = f"; skipped {report['other_arch']} for {', '.join(report['other_arches'])}" if report["other_arch"] else ""
    click.echo(f"pulled {report['fetched']} entries ({human_bytes(report['bytes'])}) from {ref} into "
               f"{report['target']}; {report['present']} here already{others}")


COMMANDS = (push, pull)
