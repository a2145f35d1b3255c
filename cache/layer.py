"""Image layers: cache entries copied into a folder every user can read and only its builder can
write, for a read-only cache layer (`MONO_JIT_CACHE_PATH`) of a container image.

A Dockerfile's build stage runs `mono-jit prebuild --image-layer /opt/mono-jit` as root; its
serving stage runs as another user with `MONO_JIT_CACHE_PATH=/opt/mono-jit` and offline mode.
The store's writable cache stays private (0700); the layer's folders are 0755 and its files
0444, owned by the builder, which the trust rules accept for a read-only layer (not writable by
others, owned by root or the reader). Each entry is copied byte for byte from a verified load
into a temporary folder and published by one rename; the toolchain records go along, so a host
without FlyDSL still finds the entries.
"""

from __future__ import annotations

import os
from pathlib import Path

from mono_jit.errors import MonoJitError

from .fs import make_dirs, read_regular, write_new
from .store import DIGEST_CAP, DIGEST_NAME, HSACO_NAME, META_CAP, META_NAME, TOOLCHAINS_DIR, Entry, \
    toolchain_record, unique_suffix

LAYER_DIR_MODE, LAYER_FILE_MODE = 0o755, 0o444


def check_layer_writable(dest: Path) -> None:
    """MonoJitError naming the path unless an image layer can be written at `dest`: a folder is
    made and removed in its nearest existing folder, so a prebuild finds out before compiling."""
    existing = dest.absolute()
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    probe = existing / f".mono-jit-probe-{unique_suffix(8)}"
    try:
        os.mkdir(probe, 0o700)
        os.rmdir(probe)
    except OSError as exc:
        raise MonoJitError(f"cannot write the image layer {dest}: {existing}: {exc.strerror or exc}; give "
                           "--image-layer a folder this user can write") from None


def publish_image_layer(entries: list[Entry], dest: Path) -> int:
    """Copy `entries` (verified loads) into the image layer at `dest`; returns how many were new."""
    make_dirs(dest / "v1", LAYER_DIR_MODE)
    os.chmod(dest, LAYER_DIR_MODE)
    os.chmod(dest / "v1", LAYER_DIR_MODE)
    added, records = 0, set()
    for entry in entries:
        final = dest / "v1" / entry.arch / entry.key[:2] / entry.key
        records.add((entry.arch, toolchain_record(entry.meta.toolchain)))
        if os.path.lexists(final):
            continue  # entries are immutable: the same key is the same content
        make_dirs(final.parent, LAYER_DIR_MODE)
        tmp = dest / "v1" / f".tmp-{entry.key[:16]}-{unique_suffix(8)}"
        tmp.mkdir(mode=0o700)
        meta = read_regular(entry.path / META_NAME, META_CAP)  # meta.sha256 covers these exact bytes
        for name, data in ((HSACO_NAME, entry.hsaco), (META_NAME, meta),
                           (DIGEST_NAME, read_regular(entry.path / DIGEST_NAME, DIGEST_CAP))):
            write_new(tmp / name, data, LAYER_FILE_MODE)
        os.chmod(tmp, LAYER_DIR_MODE)
        os.rename(tmp, final)
        added += 1
    for arch, (name, data) in sorted(records):
        folder = dest / "v1" / arch / TOOLCHAINS_DIR
        make_dirs(folder, LAYER_DIR_MODE)
        if not os.path.lexists(folder / name):
            write_new(folder / name, data, LAYER_FILE_MODE)
    return added
