"""Export / import of cache entries as one tar bundle with a manifest and checksums.

Layout: ``manifest.json`` first, then ``entries/<arch>/<key>/{kernel.hsaco, meta.json}`` sorted
by name, written reproducibly (tarball.py): one cache always exports to the same bytes, so its
sha256, printed by `mono-jit export`, pins it.

Import trusts nothing in the bundle. The manifest (capped) is read and checked first: every
name is ``entries/<supported arch>/<hex key>/<file>``, every size within a per-file cap and all
of them within a total cap. Members are then streamed one by one, never whole in memory: each
must be a regular file the manifest lists, once, of its declared size, and hash to its declared
sha256 as it is written to a private staging folder; the decompressed stream itself may not run
past what the manifest declares (so tar headers cannot hide a bomb either). An entry's two files
are adjacent (as export writes them) and the entry is verified by the store's own checks, as a
load of a local entry would be, as soon as both are staged. Only when the whole bundle passed
is anything published, through the store, which reads each entry back through its load path.
A bundle is only as trustworthy as where it came from: ``--sha256`` pins the exact bundle.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, BinaryIO, Iterator

from mono_jit.errors import BundleError
from mono_jit.spec import SUPPORTED_ARCHS

from .fs import disk_problem, make_dirs, read_regular, remove, write_new_stream
from .store import (HSACO_CAP, HSACO_NAME, META_CAP, META_NAME, CorruptEntry, Entry, Store, unique_suffix,
                    verify_entry)
from .tarball import write_file

BUNDLE_SCHEMA = "mono-jit-bundle/1"
MANIFEST = "manifest.json"
MiB = 1024 * 1024
MAX_FILE_BYTES = {HSACO_NAME: HSACO_CAP, META_NAME: META_CAP}  # the store's own caps
MAX_BUNDLE_BYTES = 1024 * MiB  # every member together, decompressed
MAX_MANIFEST_BYTES = 16 * MiB
HEADER_SLACK = 64 * 1024  # tar headers, padding and read-ahead allowed beyond the members
CHUNK = MiB
_FILES = (HSACO_NAME, META_NAME)
_HEX64 = re.compile(r"[0-9a-f]{64}")
# Decompressors by magic bytes (export writes plain tar or gzip).
_MAGIC = ((b"\x1f\x8b", "gzip"), (b"BZh", "bz2"), (b"\xfd7zXZ\x00", "lzma"))


@dataclass(frozen=True)
class Exported:
    """A written bundle: its manifest and the sha256 of its bytes (what `import --sha256` pins)."""

    manifest: dict
    sha256: str


def export_bundle(out: Path, entries: list[Entry]) -> Exported:
    """Write `entries` to the tar(.gz) `out`, reproducibly (tarball.py: the same entries make
    the same bytes, so two exports of one cache have one digest)."""
    files: dict[str, dict] = {}
    payload: dict[str, bytes] = {}
    for entry in entries:
        for name in _FILES:
            data = (entry.path / name).read_bytes()
            member = f"entries/{entry.arch}/{entry.key}/{name}"
            files[member] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            payload[member] = data
    # No creation time: it would make every export of the same cache a different bundle.
    manifest = {"schema": BUNDLE_SCHEMA, "entries": len({m.rsplit("/", 1)[0] for m in files}), "files": files}
    payload[MANIFEST] = json.dumps(manifest, indent=2, sort_keys=True).encode()
    tmp = out.with_name(out.name + ".partial")
    # Sorted by name, an entry's two files stay adjacent, as import requires.
    try:
        digest = write_file(tmp, payload, compress=out.name.endswith((".gz", ".tgz")), first=MANIFEST)
        tmp.replace(out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise BundleError(disk_problem(exc, "cannot write the bundle", out, "write the bundle to another disk")) from None
    except BaseException:  # a failed or interrupted export leaves no partial bundle behind
        tmp.unlink(missing_ok=True)
        raise
    return Exported(manifest, digest)


# -- reading the bundle -------------------------------------------------------------------------


class _HashingReader(io.RawIOBase):
    """The bundle file's bytes as read, hashed on the way (the --sha256 check covers exactly the
    bytes imported, with no window to swap the file between a check and the read)."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw, self.digest = raw, hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        data = self._raw.read(len(buffer))
        buffer[:len(data)] = data
        self.digest.update(data)
        return len(data)

    def hexdigest(self) -> str:
        """The sha256 of the whole file: what is left of it is read (and hashed) first."""
        while chunk := self._raw.read(CHUNK):
            self.digest.update(chunk)
        return self.digest.hexdigest()


class _CappedReader(io.RawIOBase):
    """A decompressed stream that refuses to yield more than `limit` bytes: a bomb stops at the
    cap, wherever in the tar stream (member data, pax or long-name headers) it hides. A
    truncated or corrupt compressed stream is a BundleError here, whatever the codec raised."""

    def __init__(self, stream: BinaryIO, limit: int) -> None:
        self._stream, self.limit, self.used = stream, limit, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        try:
            data = self._stream.read(min(len(buffer), self.limit - self.used + 1))
        except (OSError, EOFError, ValueError, RuntimeError) as exc:  # zlib.error, lzma.LZMAError too
            raise BundleError(f"the bundle is truncated or corrupt ({_reason(exc)})") from None
        self.used += len(data)
        if self.used > self.limit:
            raise BundleError(f"the bundle expands past what its manifest declares ({self.limit} bytes): refused")
        buffer[:len(data)] = data
        return len(data)


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _decompressed(raw: BinaryIO) -> tuple[BinaryIO, _HashingReader]:
    """The tar stream inside `raw`: plain, or gzip / bz2 / xz by magic bytes."""
    head = raw.read(6)
    raw.seek(0)
    hashed = _HashingReader(raw)
    for magic, module in _MAGIC:
        if head.startswith(magic):
            import importlib

            opener = importlib.import_module(module)
            return opener.open(io.BufferedReader(hashed, CHUNK), "rb"), hashed
    return io.BufferedReader(hashed, CHUNK), hashed


# -- the manifest -------------------------------------------------------------------------------


def _read_manifest(tar: tarfile.TarFile, member: tarfile.TarInfo | None) -> dict[str, dict]:
    """The manifest's file table, checked whole before any member is read."""
    if member is None or member.name != MANIFEST or not member.isfile():
        raise BundleError(f"the bundle does not start with {MANIFEST} (not a mono-jit bundle; a repacked one, "
                          "e.g. `tar -C dir .`, is not one either): make one with `mono-jit export B.tar.gz`")
    if member.size > MAX_MANIFEST_BYTES:
        raise BundleError(f"{MANIFEST} is {member.size} bytes (limit {MAX_MANIFEST_BYTES})")
    handle = tar.extractfile(member)
    try:
        manifest = json.loads(handle.read() if handle else b"")
    except ValueError as exc:
        raise BundleError(f"{MANIFEST} is not JSON: {exc}") from None
    schema = manifest.get("schema") if isinstance(manifest, dict) else None
    if schema != BUNDLE_SCHEMA:
        raise BundleError(f"unknown bundle schema {schema!r} (expected {BUNDLE_SCHEMA})")
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise BundleError(f"{MANIFEST} has no 'files' table")
    for name, declared in files.items():
        _check_listed(name, declared)
    _check_complete(files)
    total = sum(d["size"] for d in files.values())
    if total > MAX_BUNDLE_BYTES:
        raise BundleError(f"the bundle declares {total} bytes (limit {MAX_BUNDLE_BYTES})")
    return files


def _check_listed(name: object, declared: object) -> None:
    """One manifest line: a safe entries/<arch>/<key>/<file> name, a capped size, a sha256."""
    parts = PurePosixPath(name).parts if isinstance(name, str) else ()
    if (not isinstance(name, str) or name != "/".join(parts) or len(parts) != 4 or parts[0] != "entries"
            or not _HEX64.fullmatch(parts[2]) or parts[3] not in _FILES):
        raise BundleError(f"bundle member {name!r} is not entries/<arch>/<key>/<{' or '.join(_FILES)}>")
    if parts[1] not in SUPPORTED_ARCHS:
        raise BundleError(f"bundle member {name!r} is for arch {parts[1]!r}, which this mono-jit does not "
                          f"support (supported: {', '.join(SUPPORTED_ARCHS)})")
    size = declared.get("size") if isinstance(declared, dict) else None
    digest = declared.get("sha256") if isinstance(declared, dict) else None
    cap = MAX_FILE_BYTES[parts[3]]
    if type(size) is not int or not 0 <= size <= cap or not isinstance(digest, str) or not _HEX64.fullmatch(digest):
        raise BundleError(f"{MANIFEST}: {name!r} needs a size of 0..{cap} bytes and a sha256, "
                          f"it has {declared!r:.120}")


def _check_complete(files: dict[str, dict]) -> None:
    """Every listed entry has both of its files."""
    counts: dict[str, int] = {}
    for name in files:
        entry = name.rsplit("/", 1)[0]
        counts[entry] = counts.get(entry, 0) + 1
    for entry, count in counts.items():
        if count != len(_FILES):
            raise BundleError(f"bundled entry {entry} lacks {HSACO_NAME} or {META_NAME}")


# -- streaming the members ----------------------------------------------------------------------


def _stream(bundle: BinaryIO, staging: Path) -> tuple[dict[str, dict], _HashingReader]:
    """Check the manifest, then stream every member into `staging`; the file table and the
    bundle's hashing reader (for --sha256)."""
    stream, hashed = _decompressed(bundle)
    capped = _CappedReader(stream, MAX_MANIFEST_BYTES + HEADER_SLACK)
    try:
        with tarfile.open(fileobj=capped, mode="r|") as tar:  # tarfile reads ahead one record only
            members = iter(tar)
            files = _read_manifest(tar, next(members, None))
            capped.limit = capped.used + sum(d["size"] + 1024 for d in files.values()) + HEADER_SLACK
            seen: set[str] = set()
            for member in members:
                _stage_member(tar, member, files, seen, staging)
                _verify_when_complete(member.name, seen, staging)
    except tarfile.TarError as exc:
        raise BundleError(f"the bundle is truncated or not a tar bundle ({_reason(exc)})") from None
    missing = sorted(set(files) - seen)
    if missing:
        raise BundleError(f"the bundle lacks {len(missing)} member(s) its manifest lists, e.g. {missing[0]} "
                          "(truncated?)")
    return files, hashed


def _stage_member(tar: tarfile.TarFile, member: tarfile.TarInfo, files: dict[str, dict], seen: set[str],
                  staging: Path) -> None:
    """Write one listed member into `staging`, checking its size and sha256 as it streams."""
    name = member.name
    if name.startswith("/") or ".." in PurePosixPath(name).parts or "\\" in name:
        raise BundleError(f"bundle member {name!r} escapes the bundle (absolute or '..')")
    if name not in files:
        raise BundleError(f"bundle member {name!r} is not listed in {MANIFEST}")
    if name in seen:
        raise BundleError(f"bundle member {name!r} appears twice")
    if not member.isfile():
        raise BundleError(f"bundle member {name!r} is not a regular file (links and devices are refused)")
    declared = files[name]
    if member.size != declared["size"]:
        raise BundleError(f"bundle member {name!r} is {member.size} bytes, {MANIFEST} says {declared['size']}")
    seen.add(name)
    target = staging / name
    digest = hashlib.sha256()
    try:
        make_dirs(target.parent)
        written = write_new_stream(target, _chunks(tar.extractfile(member), digest))
    except OSError as exc:
        raise BundleError(disk_problem(exc, f"cannot stage bundle member {name}", staging)) from None
    if written != declared["size"] or digest.hexdigest() != declared["sha256"]:
        raise BundleError(f"bundle member {name!r} fails its checksum")


def _verify_when_complete(name: str, seen: set[str], staging: Path) -> None:
    """Verify an entry as soon as its second file is staged; its two files must be adjacent
    (as export writes them), so a bad entry stops the import before anything else is read."""
    folder = name.rsplit("/", 1)[0]
    complete = all(f"{folder}/{file}" in seen for file in _FILES)
    if not complete and len(seen) % len(_FILES) == 0:
        raise BundleError(f"bundled entry {folder}: its files are not adjacent in the bundle")
    if complete:
        _, arch, key = folder.split("/")
        _load_staged(staging, arch, key)


def _chunks(handle: IO[bytes] | None, digest: hashlib._Hash) -> Iterator[bytes]:
    while handle is not None and (chunk := handle.read(CHUNK)):
        digest.update(chunk)
        yield chunk


# -- verifying and publishing -------------------------------------------------------------------


def _staged_entries(files: dict[str, dict]) -> list[tuple[str, str]]:
    return sorted({tuple(PurePosixPath(name).parts[1:3]) for name in files})  # type: ignore[misc]


def _load_staged(staging: Path, arch: str, key: str) -> tuple[bytes, bytes]:
    """(hsaco, meta.json's bytes) of a staged entry verified by the store's own checks, as a load
    of a local entry would be."""
    folder = staging / "entries" / arch / key
    try:
        meta_json = read_regular(folder / META_NAME, MAX_FILE_BYTES[META_NAME])
        hsaco = read_regular(folder / HSACO_NAME, MAX_FILE_BYTES[HSACO_NAME])
        verify_entry(key, arch, meta_json, hsaco)
    except (OSError, ValueError, CorruptEntry) as exc:
        raise BundleError(f"bundled entry {arch}/{key[:16]} is bad: {exc}") from None
    return hsaco, meta_json


def _check_sha256(hashed: _HashingReader, expected: str | None) -> None:
    if expected is not None and hashed.hexdigest() != expected.lower():
        raise BundleError(f"the bundle's sha256 is {hashed.hexdigest()}, not the expected {expected.lower()}: refused")


def import_bundle(store: Store, bundle: Path, expected_sha256: str | None = None) -> dict:
    """Check the whole bundle (its sha256 if given, manifest, members, every entry), then publish
    every entry; {'imported', 'present'} counts, and 'differing' (the "arch/key" of each present
    entry whose code object is not the bundle's) when there is one."""
    staging = _staging_folder(store)
    try:
        with _open_regular(bundle) as raw:
            try:
                files, hashed = _stream(raw, staging)
            except BundleError:
                raw.seek(0)
                _check_sha256(_HashingReader(raw), expected_sha256)  # a wrong bundle says so first
                raise
            _check_sha256(hashed, expected_sha256)
        return _publish(store, staging, files)
    finally:
        remove(staging)


def _open_regular(bundle: Path) -> BinaryIO:
    """The bundle opened for reading if it is a regular file (a FIFO would block, a device never end)."""
    try:
        fd = os.open(bundle, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise BundleError(f"cannot read the bundle {bundle}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BundleError(f"the bundle {bundle} is not a regular file")
    return os.fdopen(fd, "rb")


def _staging_folder(store: Store) -> Path:
    """A new private folder in the writable layer's tmp/ (gc removes it if this process dies)."""
    staging = store.writable.base / "tmp" / f"import-{os.getpid()}-{unique_suffix(8)}"
    try:
        make_dirs(staging)
    except OSError as exc:
        raise BundleError(disk_problem(exc, "cannot create the import's staging folder", staging)) from None
    return staging


def _publish(store: Store, staging: Path, files: dict[str, dict]) -> dict:
    """Publish the verified staged entries of the manifest's `files` through the store (which reads
    each back as a load). An entry already present is kept; 'differing', there only when one
    does, lists ("arch/key") those whose code-object bytes are not the bundle's."""
    imported = present = 0
    differing: list[str] = []
    for arch, key in _staged_entries(files):
        here = store.lookup(key, arch)
        if here is not None:
            present += 1
            if files[f"entries/{arch}/{key}/{HSACO_NAME}"]["sha256"] != here.meta.hsaco.sha256:
                differing.append(f"{arch}/{key}")
            continue
        hsaco, meta_json = _load_staged(staging, arch, key)
        try:
            store.publish_json(key, arch, hsaco, meta_json)
        except OSError as exc:
            doing = f"cannot publish {arch}/{key[:16]} ({imported} entries imported before it, each whole)"
            raise BundleError(disk_problem(exc, doing, store.writable.root)) from None
        imported += 1
    counts: dict = {"imported": imported, "present": present}
    return {**counts, "differing": differing} if differing else counts


