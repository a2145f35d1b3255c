"""Image layers: cache entries copied into a folder every user can read and only its builder can
write, for a read-only cache layer (`MONO_JIT_CACHE_PATH`) of a container image.

A Dockerfile's build stage runs `mono-jit prebuild --image-layer /opt/mono-jit` as root; its
serving stage runs as another user with `MONO_JIT_CACHE_PATH=/opt/mono-jit` and offline mode.
The store's writable cache stays private (0700); the layer's folders are 0755 and its files
0444, owned by the builder, which the trust rules accept for a read-only layer (not writable by
others, owned by root or the reader). Only what a publish creates gets those modes: an existing
destination must already be the builder's own, enterable by others and writable by no one else (a
shared /tmp or another user's folder is refused before anything compiles), and the finished
layer is checked as a reader will check it. Each entry is copied byte for byte from a verified load
into a temporary folder and published by one rename; the toolchain records go along, so a host
without FlyDSL still finds the entries.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from mono_jit.errors import MonoJitError

from .fs import make_dirs, read_regular, write_new
from .store import DIGEST_CAP, DIGEST_NAME, HSACO_NAME, META_CAP, META_NAME, TOOLCHAINS_DIR, Entry, Layer, \
    read_entry, toolchain_record, unique_suffix
from .trust import check_root, examine

LAYER_DIR_MODE, LAYER_FILE_MODE = 0o755, 0o444


def check_layer_destination(dest: Path) -> None:
    """MonoJitError naming `dest` and why, unless an image layer may be published there: an
    existing folder (a symlink is followed) must be this user's own, writable by no one else,
    not sticky and enterable by everyone, since no mode is changed but of what a publish creates;
    a missing one must be creatable (a folder is made and removed in its nearest existing
    folder). So a prebuild finds out before compiling, and nothing is left behind."""
    if os.path.lexists(dest):
        reason = _destination_refusal(dest)
        if reason is not None:
            shown = f"{dest} (a symlink to {os.path.realpath(dest)})" if os.path.islink(dest) else f"{dest}"
            raise MonoJitError(f"image layer refused: {shown} {reason}; give --image-layer a new folder (it is made "
                               f"0755), e.g. {dest / 'mono-jit'}")
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


def _destination_refusal(dest: Path) -> str | None:
    """Why the existing `dest` (followed) may not hold an image layer, or None."""
    try:
        st = os.stat(dest)
    except OSError as exc:
        return f"cannot be examined: {exc.strerror or exc}"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder"
    mode = stat.S_IMODE(st.st_mode)
    if mode & stat.S_ISVTX:
        return f"is a shared folder (sticky, mode {mode:o}, as /tmp is): the layer needs a folder of its own"
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by other users (mode {mode:o}): a reader would refuse the layer"
    if st.st_uid != os.getuid():
        return f"is owned by uid {st.st_uid}, not by you ({os.getuid()}): its owner's folder is not re-moded"
    if not mode & stat.S_IXOTH:  # a reader needs to enter it to list v1
        return (f"cannot be entered by other users (mode {mode:o}): chmod o+x it, a folder this run did not make "
                "keeps its mode")
    base = examine(dest / "v1", allow_shared=False, folder=True)[1]
    return None if base is None else f"holds a v1 folder a reader would refuse: {base}"


def publish_image_layer(entries: list[Entry], dest: Path) -> int:
    """Copy `entries` (verified loads) into the image layer at `dest`, then check it as a reader
    will (trust.check_root and every level down to each entry); returns how many were new. Only
    the folders and files made here get the layer's modes."""
    check_layer_destination(dest)
    make_dirs(dest / "v1", LAYER_DIR_MODE)
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
    _check_as_read(dest, entries)
    return added


def _check_as_read(dest: Path, entries: list[Entry]) -> None:
    """MonoJitError naming the first level of the finished layer at `dest` that a reader's trust
    rules refuse (the root, v1, an arch, prefix or toolchains folder, or an entry)."""
    try:
        check_root(dest, allow_shared=False)
        layer = Layer(dest, writable=False)
        for entry in entries:
            final = layer.entry_dir(entry.arch, entry.key)
            for level in (layer.base / entry.arch, layer.base / entry.arch / TOOLCHAINS_DIR, final.parent):
                reason = examine(level, allow_shared=False, folder=True)[1]
                if reason is not None:
                    raise MonoJitError(reason)
            read_entry(layer, final, entry.arch)
    except MonoJitError as exc:  # UntrustedRoot and CorruptEntry too
        raise MonoJitError(f"the image layer {dest} would be refused where it is served: {exc}") from None
