"""Export / import of cache entries as one tar bundle with a manifest and checksums.

Layout: ``manifest.json`` first, then ``entries/<arch>/<key>/{kernel.hsaco, meta.json}``. Import
reads only regular files whose names the manifest lists (no absolute paths, no ``..``, no links
or devices), checks each file's size and sha256 against the manifest, verifies each entry as a
load would, and publishes it atomically through the store; nothing is written on a bad bundle.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import time
from pathlib import Path, PurePosixPath

from mono_jit.errors import BundleError

from .store import HSACO_NAME, META_NAME, CorruptEntry, Entry, Store, verify_entry

BUNDLE_SCHEMA = "mono-jit-bundle/1"
MANIFEST = "manifest.json"
MAX_MEMBER_BYTES = 256 * 1024 * 1024


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    tar.addfile(info, io.BytesIO(data))


def export_bundle(out: Path, entries: list[Entry]) -> dict:
    """Write `entries` to the tar(.gz) `out`; return the manifest."""
    files: dict[str, dict] = {}
    payload: dict[str, bytes] = {}
    for entry in entries:
        for name in (HSACO_NAME, META_NAME):
            data = (entry.path / name).read_bytes()
            member = f"entries/{entry.arch}/{entry.key}/{name}"
            files[member] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            payload[member] = data
    manifest = {"schema": BUNDLE_SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "entries": len(entries), "files": files}
    mode = "w:gz" if out.name.endswith((".gz", ".tgz")) else "w"
    tmp = out.with_name(out.name + ".partial")
    with tarfile.open(tmp, mode) as tar:
        _add(tar, MANIFEST, json.dumps(manifest, indent=2, sort_keys=True).encode())
        for member, data in payload.items():
            _add(tar, member, data)
    tmp.replace(out)
    return manifest


def _safe_member(name: str) -> PurePosixPath:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or not name or "\\" in name:
        raise BundleError(f"bundle member {name!r} escapes the bundle (absolute or '..')")
    return path


def _read_members(tar: tarfile.TarFile) -> tuple[dict, dict[str, bytes]]:
    data: dict[str, bytes] = {}
    for member in tar.getmembers():
        _safe_member(member.name)
        if not member.isfile():
            raise BundleError(f"bundle member {member.name!r} is not a regular file (links are refused)")
        if member.size > MAX_MEMBER_BYTES:
            raise BundleError(f"bundle member {member.name!r} is {member.size} bytes (limit {MAX_MEMBER_BYTES})")
        if member.name in data:
            raise BundleError(f"bundle member {member.name!r} appears twice")
        handle = tar.extractfile(member)
        data[member.name] = handle.read() if handle else b""
    if MANIFEST not in data:
        raise BundleError("the bundle has no manifest.json")
    try:
        manifest = json.loads(data.pop(MANIFEST))
    except ValueError as exc:
        raise BundleError(f"manifest.json is not JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != BUNDLE_SCHEMA:
        raise BundleError(f"unknown bundle schema {manifest.get('schema') if isinstance(manifest, dict) else None!r} "
                          f"(expected {BUNDLE_SCHEMA})")
    return manifest, data


def import_bundle(store: Store, bundle: Path) -> dict:
    """Verify the whole bundle, then publish every entry; {'imported', 'present'} counts."""
    try:
        with tarfile.open(bundle, "r:*") as tar:
            manifest, data = _read_members(tar)
    except (tarfile.TarError, OSError) as exc:
        raise BundleError(f"{bundle}: not a readable tar bundle: {exc}") from None
    files = manifest.get("files", {})
    if set(files) != set(data):
        extra, missing = sorted(set(data) - set(files)), sorted(set(files) - set(data))
        raise BundleError(f"bundle members and manifest differ (unlisted: {extra[:3]}, missing: {missing[:3]})")
    groups: dict[tuple[str, str], dict[str, bytes]] = {}
    for name, blob in data.items():
        declared = files[name]
        if len(blob) != declared.get("size") or hashlib.sha256(blob).hexdigest() != declared.get("sha256"):
            raise BundleError(f"bundle member {name!r} fails its checksum")
        parts = PurePosixPath(name).parts
        if len(parts) != 4 or parts[0] != "entries" or parts[3] not in (HSACO_NAME, META_NAME):
            raise BundleError(f"bundle member {name!r} is not entries/<arch>/<key>/<file>")
        groups.setdefault((parts[1], parts[2]), {})[parts[3]] = blob
    staged = []
    for (arch, key), blobs in sorted(groups.items()):
        staged.append((arch, key, _verified(arch, key, blobs)))
    imported = present = 0
    for arch, key, (hsaco, meta) in staged:
        if store.lookup(key, arch) is not None:
            present += 1
            continue
        store.publish(key, arch, hsaco, meta)
        imported += 1
    return {"imported": imported, "present": present}


def _verified(arch: str, key: str, blobs: dict[str, bytes]) -> tuple[bytes, dict]:
    """Check one bundled entry exactly as a load would."""
    if set(blobs) != {HSACO_NAME, META_NAME}:
        raise BundleError(f"bundled entry {arch}/{key} lacks {HSACO_NAME} or {META_NAME}")
    try:
        meta = json.loads(blobs[META_NAME])
        verify_entry(key, arch, meta, blobs[HSACO_NAME])
    except (ValueError, CorruptEntry) as exc:
        raise BundleError(f"bundled entry {arch}/{key} is bad: {exc}") from None
    return blobs[HSACO_NAME], meta
