"""The cache as an OCI artifact: one blob per entry, one manifest listing them.

Blob: a plain tar of the entry's ``meta.json`` (its published bytes) and ``kernel.hsaco``, with
fixed names, order, modes and times, so the same entry always makes the same blob and digest (a
second push sends nothing). ``meta.sha256`` is not shipped: it is derived from meta.json's
bytes when the entry is published.

Manifest (OCI image manifest; its config's media type says what it is):
- ``config``: the two-byte ``{}`` blob with media type CONFIG_MEDIA_TYPE;
- ``layers``: one descriptor per entry (media type ENTRY_MEDIA_TYPE, digest, size) with
  annotations naming its key, arch, template, spec and toolchain id, so a reader finds an entry
  by key from the manifest alone (one request);
- ``annotations``: the schema, the mono-jit version and host that pushed, when, and the
  toolchain fingerprints by id (a host with no toolchain of its own computes keys from them).

Parsing trusts nothing: every descriptor is checked (digest form, size cap, hex key, one layer a
key) before a blob is asked for, and every blob is verified as a local load verifies an entry.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
import time
from dataclasses import dataclass

from mono_jit.errors import RemoteError
from mono_jit.spec import SUPPORTED_ARCHS

from ..key import canonical_json
from ..store import HSACO_CAP, HSACO_NAME, META_CAP, META_NAME, CorruptEntry, Entry, verify_entry
from ..tarball import write_tar
from .reference import Reference

SCHEMA = "mono-jit-oci/1"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_MEDIA_TYPE = "application/vnd.mono-jit.cache.config.v1+json"
ENTRY_MEDIA_TYPE = "application/vnd.mono-jit.entry.v1.tar"
CONFIG_BYTES = b"{}"
TITLE = "org.opencontainers.image.title"
CREATED = "org.opencontainers.image.created"
A_SCHEMA, A_VERSION, A_HOST, A_TOOLCHAINS = ("dev.mono-jit.schema", "dev.mono-jit.version", "dev.mono-jit.host",
                                             "dev.mono-jit.toolchains")
A_KEY, A_ARCH, A_TEMPLATE, A_SPEC, A_TOOLCHAIN = ("dev.mono-jit.key", "dev.mono-jit.arch", "dev.mono-jit.template",
                                                  "dev.mono-jit.spec", "dev.mono-jit.toolchain")
BLOB_CAP = HSACO_CAP + META_CAP + 16 * 1024  # the two files, their tar headers and padding
MAX_LAYERS = 20000
_HEX64 = re.compile(r"[0-9a-f]{64}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_TOOLCHAIN_ID = re.compile(r"[0-9a-f]{16}")


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def toolchain_id(fingerprint: dict) -> str:
    """16 hex of the fingerprint's canonical JSON (as the layers' toolchain records name it)."""
    return hashlib.sha256(canonical_json(fingerprint).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Listed:
    """One entry the manifest lists: its descriptor's fields, checked."""

    key: str
    arch: str
    digest: str
    size: int
    template: str
    descriptor: dict


@dataclass(frozen=True)
class Listing:
    """A parsed mono-jit manifest: entries by key, toolchain fingerprints by id."""

    entries: dict[str, Listed]
    toolchains: dict[str, dict]
    digest: str  # of the manifest's bytes

    def fingerprints(self, arch: str) -> list[dict]:
        """The toolchains that built the listed entries of `arch`."""
        ids = {e.descriptor["annotations"].get(A_TOOLCHAIN) for e in self.entries.values() if e.arch == arch}
        return [fp for tid, fp in sorted(self.toolchains.items()) if tid in ids]


# -- entries as blobs -----------------------------------------------------------------------------


def pack(entry: Entry) -> bytes:
    """The entry's blob (deterministic: same entry, same bytes; meta.json first, as ever)."""
    out = io.BytesIO()
    write_tar(out, {META_NAME: entry.meta_json, HSACO_NAME: entry.hsaco}, first=META_NAME)
    return out.getvalue()


def unpack(listed: Listed, blob: bytes, where: Reference) -> tuple[bytes, bytes]:
    """(hsaco, meta.json's bytes) of a fetched blob, verified as a local load verifies an entry (key, factors,
    schema, HSACO size / sha256 / ELF header for the arch); RemoteError naming the entry if not."""
    name = f"{where}: entry {listed.arch}/{listed.key[:16]}"
    files: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:") as tar:
            for member in tar:
                cap = {META_NAME: META_CAP, HSACO_NAME: HSACO_CAP}.get(member.name)
                if cap is None or not member.isfile() or member.name in files or member.size > cap:
                    raise RemoteError(f"{name}: its blob holds {member.name!r}, not just {META_NAME} and {HSACO_NAME}")
                handle = tar.extractfile(member)
                files[member.name] = handle.read() if handle else b""
    except tarfile.TarError as exc:
        raise RemoteError(f"{name}: its blob is not a tar ({exc})") from None
    if set(files) != {META_NAME, HSACO_NAME}:
        raise RemoteError(f"{name}: its blob lacks {META_NAME} or {HSACO_NAME}")
    try:
        verify_entry(listed.key, listed.arch, files[META_NAME], files[HSACO_NAME])
    except CorruptEntry as exc:
        raise RemoteError(f"{name} fails verification (forged or damaged): {exc}") from None
    return files[HSACO_NAME], files[META_NAME]


# -- the manifest ---------------------------------------------------------------------------------


def descriptor(entry: Entry, blob: bytes) -> dict:
    """The manifest layer describing `entry`'s blob."""
    meta = entry.meta
    return {"mediaType": ENTRY_MEDIA_TYPE, "digest": digest_of(blob), "size": len(blob),
            "annotations": {TITLE: f"{entry.arch}/{entry.key}.tar", A_KEY: entry.key, A_ARCH: entry.arch,
                            A_TEMPLATE: meta.template, A_SPEC: canonical_json(meta.spec),
                            A_TOOLCHAIN: toolchain_id(meta.toolchain)}}


def config_descriptor() -> dict:
    return {"mediaType": CONFIG_MEDIA_TYPE, "digest": digest_of(CONFIG_BYTES), "size": len(CONFIG_BYTES)}


def build_manifest(layers: list[dict], toolchains: dict[str, dict]) -> dict:
    """A manifest listing `layers` (sorted by arch and key, so equal contents compare equal)."""
    import socket

    from mono_jit import __version__

    ordered = sorted(layers, key=lambda d: (d["annotations"][A_ARCH], d["annotations"][A_KEY]))
    return {"schemaVersion": 2, "mediaType": MANIFEST_MEDIA_TYPE, "config": config_descriptor(), "layers": ordered,
            "annotations": {A_SCHEMA: SCHEMA, A_VERSION: __version__, A_HOST: socket.gethostname(),
                            CREATED: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                            A_TOOLCHAINS: canonical_json(toolchains)}}


def parse_manifest(manifest: dict, data: bytes, where: Reference) -> Listing:
    """The manifest's entries and toolchains, every descriptor checked; RemoteError saying what
    is wrong (another artifact at that reference, a malformed or hostile manifest)."""
    config = manifest.get("config")
    kind = config.get("mediaType") if isinstance(config, dict) else None
    if manifest.get("mediaType", MANIFEST_MEDIA_TYPE) != MANIFEST_MEDIA_TYPE or kind != CONFIG_MEDIA_TYPE:
        raise RemoteError(f"{where} is not a mono-jit cache (its config is {kind!r}, expected {CONFIG_MEDIA_TYPE})")
    found = manifest.get("annotations")
    notes: dict = found if isinstance(found, dict) else {}
    if notes.get(A_SCHEMA) != SCHEMA:
        raise RemoteError(f"{where}: unknown mono-jit artifact schema {notes.get(A_SCHEMA)!r} (expected {SCHEMA})")
    layers = manifest.get("layers")
    if not isinstance(layers, list) or len(layers) > MAX_LAYERS:
        raise RemoteError(f"{where}: the manifest's layers are not a list of at most {MAX_LAYERS}")
    entries: dict[str, Listed] = {}
    for layer in layers:
        listed = _listed(layer, where)
        if listed.key in entries:
            raise RemoteError(f"{where}: the manifest lists entry {listed.key[:16]} twice")
        entries[listed.key] = listed
    return Listing(entries, _toolchains(notes.get(A_TOOLCHAINS), where), digest_of(data))


def _listed(layer: object, where: Reference) -> Listed:
    notes = layer.get("annotations") if isinstance(layer, dict) else None
    if not isinstance(layer, dict) or not isinstance(notes, dict):
        raise RemoteError(f"{where}: a manifest layer is not a descriptor with annotations")
    key, arch, digest, size = notes.get(A_KEY), notes.get(A_ARCH), layer.get("digest"), layer.get("size")
    if layer.get("mediaType") != ENTRY_MEDIA_TYPE or not isinstance(key, str) or not _HEX64.fullmatch(key):
        raise RemoteError(f"{where}: manifest layer {str(digest)[:19]} is not a mono-jit entry ({ENTRY_MEDIA_TYPE} "
                          "with a 64-hex key)")
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest) or type(size) is not int or \
            not 0 < size <= BLOB_CAP:
        raise RemoteError(f"{where}: entry {key[:16]} needs a sha256 digest and a size of 1..{BLOB_CAP} bytes, "
                          f"it has {digest!r:.80} and {size!r:.20}")
    if not isinstance(arch, str) or not re.fullmatch(r"gfx[0-9a-z]{2,8}", arch):
        raise RemoteError(f"{where}: entry {key[:16]} names arch {arch!r:.40}")
    return Listed(key, arch, digest, size, str(notes.get(A_TEMPLATE, "?"))[:64], layer)


def _toolchains(text: object, where: Reference) -> dict[str, dict]:
    try:
        table = json.loads(text) if isinstance(text, str) else {}
    except (ValueError, RecursionError):
        table = None
    if not isinstance(table, dict) or not all(isinstance(k, str) and _TOOLCHAIN_ID.fullmatch(k) and isinstance(v, dict)
                                              for k, v in table.items()):
        raise RemoteError(f"{where}: the manifest's {A_TOOLCHAINS} annotation is not a table of fingerprints")
    for tid, fingerprint in table.items():
        if toolchain_id(fingerprint) != tid:
            raise RemoteError(f"{where}: toolchain {tid} in the manifest does not match its own fingerprint")
    return table


def supported(listed: Listed) -> bool:
    """Whether this mono-jit can serve the entry's arch (others are skipped, never fetched)."""
    return listed.arch in SUPPORTED_ARCHS
