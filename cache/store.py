"""Layered, content-addressed store of compiled kernels.

Entry rules:
- written whole in ``<writable>/v1/tmp/<unique>/``, each file fsynced, then published by one
  ``rename`` of the directory (a losing racer discards its copy and uses the winner's);
- immutable once published: reads take no lock and need no write access;
- verified on every load: meta.json parses, its key matches the folder and the hash of its
  factors, the HSACO's size and sha256 match, and the ELF header is AMDGPU for the arch. A bad
  entry is moved to ``quarantine/`` when its layer is writable, and always treated as a miss;
- a ``last_used`` stamp beside the files is refreshed at most hourly, for gc.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from mono_jit.config import Settings
from mono_jit.errors import InvalidCodeObject
from mono_jit.hsaco import check_header

from .digest import sha256
from .key import cache_key, canonical_json
from .trust import check_root, make_private_root

META_SCHEMA = 1
HSACO_NAME = "kernel.hsaco"
META_NAME = "meta.json"
STAMP_NAME = "last_used"
STAMP_INTERVAL = 3600.0
TOOLCHAINS_DIR = "toolchains"  # <root>/v1/<arch>/toolchains/<digest>.json
# The hit path imports neither logging, shutil nor uuid (several ms in a fresh process): they are
# imported where a warning, a removal or a write needs them.


def _warn(message: str, *args: object) -> None:
    import logging

    logging.getLogger(__name__).warning(message, *args)


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def unique_suffix(chars: int = 8) -> str:
    """Random hex for temporary names (what uuid4().hex[:chars] gave, without importing uuid)."""
    return os.urandom((chars + 1) // 2).hex()[:chars]


class CorruptEntry(Exception):
    """An entry failed verification (internal: the store turns it into a miss)."""


@dataclass(frozen=True)
class Layer:
    root: Path
    writable: bool

    @property
    def base(self) -> Path:
        return self.root / "v1"

    def entry_dir(self, arch: str, key: str) -> Path:
        return self.base / arch / key[:2] / key


@dataclass(frozen=True)
class Entry:
    """A published entry, verified when it was loaded."""

    layer: Layer
    path: Path
    key: str
    arch: str
    meta: dict
    hsaco: bytes

    @property
    def size(self) -> int:
        return sum(f.stat().st_size for f in self.path.iterdir() if f.is_file())


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_entry(layer: Layer, path: Path, arch: str) -> Entry:
    """Load and verify the entry at `path`; CorruptEntry says what is wrong."""
    try:
        meta = json.loads((path / META_NAME).read_text())
        hsaco = (path / HSACO_NAME).read_bytes()
    except (OSError, ValueError) as exc:
        raise CorruptEntry(f"unreadable: {exc}") from None
    verify_entry(path.name, arch, meta, hsaco)
    return Entry(layer, path, path.name, arch, meta, hsaco)


def verify_entry(key: str, arch: str, meta: object, hsaco: bytes) -> None:
    """The checks every load (and every bundle import) makes; CorruptEntry says what is wrong."""
    if not isinstance(meta, dict) or meta.get("schema") != META_SCHEMA:
        raise CorruptEntry(f"meta.json schema {meta.get('schema') if isinstance(meta, dict) else None!r} is not {META_SCHEMA}")
    if meta.get("key") != key or cache_key(meta.get("factors", {})) != key:
        raise CorruptEntry("meta.json's key or factors do not match the entry's key")
    if meta.get("arch") != arch:
        raise CorruptEntry(f"meta.json says arch {meta.get('arch')!r}, the entry sits under {arch}")
    expected = meta.get("hsaco", {})
    if len(hsaco) != expected.get("size"):
        raise CorruptEntry(f"kernel.hsaco is {len(hsaco)} bytes, meta.json says {expected.get('size')}")
    if sha256(hsaco).hexdigest() != expected.get("sha256"):
        raise CorruptEntry("kernel.hsaco's sha256 does not match meta.json")
    try:
        check_header(hsaco, arch)
    except InvalidCodeObject as exc:
        raise CorruptEntry(str(exc)) from None


class Store:
    """Read-only layers in order, then the writable layer."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        allow = bool(settings.allow_shared_roots)
        layers = []
        for root in settings.readonly_roots:
            if not root.is_dir():
                _warn("read-only cache root %s does not exist; skipping it", root)
                continue
            check_root(root, allow)
            layers.append(Layer(root, writable=False))
        writable = settings.writable_root
        make_private_root(writable)
        check_root(writable, allow)
        self.writable = Layer(writable, writable=True)
        self.layers: tuple[Layer, ...] = (*layers, self.writable)

    # -- reading -----------------------------------------------------------------------------

    def lookup(self, key: str, arch: str) -> Entry | None:
        """The first verified entry for `key` in layer order; bad entries are set aside."""
        for layer in self.layers:
            path = layer.entry_dir(arch, key)
            if not path.is_dir():
                continue
            try:
                entry = read_entry(layer, path, arch)
            except CorruptEntry as reason:
                self.quarantine(layer, path, str(reason))
                continue
            if layer.writable:
                self._touch(path)
            return entry
        return None

    def entries(self) -> Iterator[Entry | tuple[Path, str]]:
        """Every entry in every layer (the first layer wins for a key); (path, reason) if bad."""
        seen: set[str] = set()
        for layer in self.layers:
            if not layer.base.is_dir():
                continue
            for arch_dir in sorted(p for p in layer.base.iterdir() if p.is_dir() and p.name.startswith("gfx")):
                for path in sorted(arch_dir.glob("??/*")):
                    if path.name in seen or not path.is_dir():
                        continue
                    seen.add(path.name)
                    try:
                        yield read_entry(layer, path, arch_dir.name)
                    except CorruptEntry as reason:
                        yield (path, str(reason))

    # -- writing -----------------------------------------------------------------------------

    def publish(self, key: str, arch: str, hsaco: bytes, meta: dict) -> Entry:
        """Write an entry atomically into the writable layer and return it (verified)."""
        final = self.writable.entry_dir(arch, key)
        tmp_root = self.writable.base / "tmp"
        tmp_root.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = tmp_root / f"{key[:16]}-{os.getpid()}-{unique_suffix(8)}"
        tmp.mkdir(mode=0o700)
        try:
            (tmp / HSACO_NAME).write_bytes(hsaco)
            (tmp / META_NAME).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
            (tmp / STAMP_NAME).touch()
            for name in (HSACO_NAME, META_NAME):
                _fsync_file(tmp / name)
            _fsync_dir(tmp)
            final.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(tmp, final)
            except OSError:
                if not final.is_dir():
                    raise
                _rmtree(tmp)  # lost the race: keep the winner's copy
            _fsync_dir(final.parent)
        finally:
            if tmp.exists():
                _rmtree(tmp)
        self._record_toolchain(arch, meta["factors"]["toolchain"])
        # Read back through the load path on purpose: it proves the published copy (or the
        # racing winner's) is whole before anyone is told it exists.
        return read_entry(self.writable, final, arch)

    def _record_toolchain(self, arch: str, fingerprint: dict) -> None:
        """Remember which toolchain built entries here, so a process that cannot fingerprint a
        toolchain of its own (no FlyDSL or ld.lld on a serving host) can still find them."""
        text = canonical_json(fingerprint)
        folder = self.writable.base / arch / TOOLCHAINS_DIR
        target = folder / f"{sha256(text.encode()).hexdigest()[:16]}.json"
        if target.exists():
            return
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = folder / f".{target.name}.{os.getpid()}.{unique_suffix(6)}"
        tmp.write_text(text)
        os.replace(tmp, target)

    def recorded_toolchains(self, arch: str) -> list[dict]:
        """Fingerprints that built entries for `arch`, in layer order (see _record_toolchain)."""
        found: list[dict] = []
        for layer in self.layers:
            for path in sorted((layer.base / arch / TOOLCHAINS_DIR).glob("*.json")):
                try:
                    fingerprint = json.loads(path.read_text())
                except (OSError, ValueError):
                    continue
                if isinstance(fingerprint, dict) and fingerprint not in found:
                    found.append(fingerprint)
        return found

    def quarantine(self, layer: Layer, path: Path, reason: str) -> None:
        """Set a bad entry aside (writable layer) and log why; a read-only one is only skipped."""
        if not layer.writable:
            _warn("ignoring bad cache entry %s in read-only layer: %s", path, reason)
            return
        target = layer.base / "quarantine" / f"{path.name}-{int(time.time())}-{unique_suffix(6)}"
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            os.rename(path, target)
            (target / "reason.txt").write_text(reason + "\n")
            _warn("quarantined bad cache entry %s -> %s: %s", path, target, reason)
        except OSError as exc:
            _warn("bad cache entry %s (%s) could not be quarantined: %s", path, reason, exc)

    def remove(self, path: Path) -> None:
        """Delete an entry of the writable layer: rename away first so it vanishes at once."""
        doomed = self.writable.base / "tmp" / f"rm-{path.name}-{unique_suffix(8)}"
        doomed.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.rename(path, doomed)
        _rmtree(doomed)

    @staticmethod
    def _touch(path: Path) -> None:
        stamp = path / STAMP_NAME
        try:
            if time.time() - stamp.stat().st_mtime > STAMP_INTERVAL:
                os.utime(stamp)
        except FileNotFoundError:
            stamp.touch()
        except OSError:
            pass  # a stamp is a hint for gc, never a reason to fail a load


def last_used(path: Path) -> float:
    try:
        return (path / STAMP_NAME).stat().st_mtime
    except OSError:
        return path.stat().st_mtime
