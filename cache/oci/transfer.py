"""push and pull: cache entries to and from one registry reference.

push: read what the reference lists (one request), upload the blobs of entries it does not list
(a HEAD first: the registry may hold the blob under another tag), then tag a manifest of the
union (or of this cache alone with ``replace``); when nothing changed, nothing is written.
Entries are immutable by key, so an entry the reference already lists is never sent again.
Two hosts pushing to one tag at the same moment can each drop the other's new entries (the
registry has no compare-and-swap on tags): the next miss of such an entry compiles and pushes it
again.

pull: read the manifest (one request), skip the entries the local layers (or the image layer)
already hold and those of an arch this mono-jit does not serve, fetch each missing blob (one
request each), verify every one as a local load verifies an entry, and only then publish them,
each by one rename through the store (or into the image layer through a private staging store).
A bad blob anywhere means nothing is published.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from mono_jit.errors import RemoteError

from ..fs import disk_problem
from ..store import CorruptEntry, Entry, Layer, Store, read_entry
from .artifact import (CONFIG_BYTES, CONFIG_MEDIA_TYPE, ENTRY_MEDIA_TYPE, Listed, Listing, build_manifest,
                       config_descriptor, descriptor, pack, parse_manifest, supported, toolchain_id, unpack)
from .client import Registry

PUSH_SCHEMA, PULL_SCHEMA = "mono-jit-push/1", "mono-jit-pull/1"
MAX_PULL_BYTES = 256 << 20  # one pull stages its missing entries in memory before publishing any


def listing(registry: Registry) -> Listing | None:
    """What the reference lists (one request), or None when it names nothing yet."""
    found = registry.manifest()
    return None if found is None else parse_manifest(found[0], found[1], registry.ref)


def push(registry: Registry, entries: list[Entry], replace: bool = False) -> dict:
    """List `entries` at the registry reference, uploading the blobs it lacks; a report."""
    old = listing(registry)
    before = {} if old is None else {k: e.descriptor for k, e in old.entries.items()}
    layers = {} if replace else dict(before)
    toolchains = {} if (replace or old is None) else dict(old.toolchains)
    added = uploaded = sent = 0
    for entry in entries:
        toolchains.setdefault(toolchain_id(entry.meta.toolchain), entry.meta.toolchain)
        if entry.key in layers:
            continue  # same key, same content: it is listed already
        blob = pack(entry)
        layers[entry.key] = descriptor(entry, blob)
        added += 1
        if registry.upload(blob, layers[entry.key]["digest"], ENTRY_MEDIA_TYPE):
            uploaded, sent = uploaded + 1, sent + len(blob)
    used = {d["annotations"]["dev.mono-jit.toolchain"] for d in layers.values()}
    digest = old.digest if old is not None else ""
    changed = old is None or layers != before
    if changed:
        registry.upload(CONFIG_BYTES, config_descriptor()["digest"], CONFIG_MEDIA_TYPE)
        manifest = build_manifest(list(layers.values()), {k: v for k, v in toolchains.items() if k in used})
        digest = registry.put_manifest(manifest)
    return {"schema": PUSH_SCHEMA, "ref": str(registry.ref), "added": added, "uploaded": uploaded, "bytes": sent,
            "already_listed": len(entries) - added, "listed": len(layers), "manifest_written": changed,
            "manifest_digest": digest, "requests": registry.requests_sent}


def fetch(registry: Registry, listed: Listed) -> tuple[bytes, bytes]:
    """One entry's (hsaco, meta.json's bytes), fetched (one request) and verified."""
    return unpack(listed, registry.blob(listed.digest, listed.size), registry.ref)


def publish(store: Store, listed: Listed, hsaco: bytes, meta_json: bytes) -> Entry:
    """A verified fetched entry, published unchanged in the store's writable layer (one rename)."""
    try:
        return store.publish_json(listed.key, listed.arch, hsaco, meta_json)
    except OSError as exc:
        raise RemoteError(disk_problem(exc, f"cannot publish {listed.arch}/{listed.key[:16]}",
                                       store.writable.root)) from None
    except CorruptEntry as exc:
        raise RemoteError(str(exc)) from None


def pull(registry: Registry, store: Store, image_layer: Path | None = None) -> dict:
    """Fetch the entries of the reference that are missing here, verify all, then publish them
    into the store's writable layer, or into the image layer `image_layer`; a report."""
    found = listing(registry)
    if found is None:
        raise RemoteError(f"{registry.ref} names nothing in the registry (push a cache there first: "
                          f"mono-jit push {registry.ref})")
    served = [e for e in found.entries.values() if supported(e)]
    others = sorted({e.arch for e in found.entries.values() if not supported(e)})
    have = (lambda e: _in_image_layer(image_layer, e)) if image_layer is not None else \
        (lambda e: store.lookup(e.key, e.arch) is not None)
    missing = [e for e in served if not have(e)]
    total = sum(e.size for e in missing)
    if total > MAX_PULL_BYTES:
        raise RemoteError(f"{registry.ref} lists {total} bytes of missing entries, over the pull limit of "
                          f"{MAX_PULL_BYTES}")
    staged = [(e, *fetch(registry, e)) for e in missing]  # every blob verified before any is published
    if image_layer is None:
        for listed, hsaco, meta in staged:
            publish(store, listed, hsaco, meta)
    elif staged:
        _publish_image_layer(staged, image_layer)
    return {"schema": PULL_SCHEMA, "ref": str(registry.ref), "manifest_digest": found.digest,
            "listed": len(found.entries), "fetched": len(staged), "bytes": total,
            "present": len(served) - len(missing), "other_arch": len(found.entries) - len(served),
            "other_arches": others, "target": str(image_layer if image_layer is not None else store.writable.root),
            "requests": registry.requests_sent}


def _in_image_layer(dest: Path, listed: Listed) -> bool:
    """Whether the image layer holds the entry (verified: a bad copy there is an error, since a
    layer's entries are never replaced)."""
    path = dest / "v1" / listed.arch / listed.key[:2] / listed.key
    if not os.path.lexists(path):
        return False
    try:
        read_entry(Layer(dest, writable=False), path, listed.arch)
    except CorruptEntry as exc:
        raise RemoteError(f"the image layer {dest} holds a bad copy of {listed.arch}/{listed.key[:16]} ({exc}): "
                          "remove that folder and pull again") from None
    return True


def _publish_image_layer(staged: list[tuple[Listed, bytes, bytes]], dest: Path) -> None:
    """Publish verified entries into a private staging store, then copy them into the image
    layer as `prebuild --image-layer` does (folders 0755, files 0444, one rename an entry)."""
    from mono_jit.config import Settings

    from ..layer import publish_image_layer

    with tempfile.TemporaryDirectory(prefix="mono-jit-pull-") as folder:
        staging = Store(Settings({"MONO_JIT_CACHE_DIR": str(Path(folder) / "cache")}))
        entries = [publish(staging, listed, hsaco, meta) for listed, hsaco, meta in staged]
        try:
            publish_image_layer(entries, dest)
        except OSError as exc:
            raise RemoteError(disk_problem(exc, "cannot write the image layer", dest)) from None
