"""Layered, content-addressed store of compiled kernels.

Entry rules:
- written whole in ``<writable>/v1/tmp/<unique>/``, each file created exclusively and fsynced,
  then published by one ``rename`` of the directory (a losing racer discards its copy and uses
  the winner's); every folder is made with an explicit mode, whatever the umask;
- immutable once published: reads take no lock and need no write access;
- trusted level by level: a layer's root, ``v1`` and ``v1/<arch>`` (a refused one is reported
  once and skipped), the prefix folder, the entry folder and its files (owner and mode, see
  trust.py; no symlinks below the root); files are read only when regular, under a size cap;
- verified on every load: ``meta.sha256`` matches meta.json's bytes (so a flip anywhere in
  meta.json is caught), meta.json parses and fits its schema (schema.py), its key matches the
  folder and the hash of its factors, the HSACO's size and sha256 match, and the ELF header is
  AMDGPU for the arch. A bad entry is moved to ``quarantine/`` when its layer is writable, and
  always treated as a miss;
- a ``last_used`` stamp beside the files is refreshed at most hourly, for gc.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
import time
from pathlib import Path
from typing import Iterator

from mono_jit.config import Settings
from mono_jit.hsaco.elf_header import MACH_BY_ARCH, check_header
from mono_jit.errors import InvalidCodeObject, MonoJitError, UntrustedRoot
from mono_jit.record import Record

from .digest import sha256
from .fs import UnsafeFile, make_dirs, read_regular, remove, write_new
from .key import cache_key, canonical_json
from .meta import EntryMeta, MetaError
from .trust import check_root, examine, make_private_root

HSACO_NAME = "kernel.hsaco"
META_NAME = "meta.json"
DIGEST_NAME = "meta.sha256"  # sha256 of meta.json's bytes, hex, then a newline
STAMP_NAME = "last_used"
STAMP_INTERVAL = 3600.0
TOOLCHAINS_DIR = "toolchains"  # <root>/v1/<arch>/toolchains/<digest>.json
HSACO_CAP = 64 << 20  # far above any kernel's code object (K1's is under 100 KiB)
META_CAP = 1 << 20
DIGEST_CAP = 128
TOOLCHAIN_CAP = 64 << 10
FILE_MODE = 0o644
# The hit path imports neither logging, shutil nor uuid (several ms in a fresh process): they are
# imported where a warning, a removal or a write needs them.

_REPORTED: set[str] = set()


def _warn(message: str, *args: object) -> None:
    import logging

    logging.getLogger(__name__).warning(message, *args)


def info(name: str, message: str, *args: object) -> None:
    """An INFO record of logger `name` (`mono-jit -v`), only when something imported logging: a
    hit never imports it, and a process that has not imported it has no handler to listen."""
    logging = sys.modules.get("logging")
    if logging is not None:
        logging.getLogger(name).info(message, *args)


def _first_time(message: str) -> bool:
    """Whether this process has not reported `message` yet (and now counts it reported)."""
    if message in _REPORTED:
        return False
    _REPORTED.add(message)
    return True


def _info_once(message: str) -> None:
    """An INFO record (`mono-jit -v`) the first time this process sees `message`."""
    if _first_time(message):
        info(__name__, "%s", message)


def _warn_once(message: str) -> None:
    """Log `message` the first time this process sees it (a refused layer is named once)."""
    if _first_time(message):
        _warn("%s", message)


def _rmtree(path: Path) -> None:
    """fs.remove, for removals that may fail quietly (a leftover gc collects later)."""
    try:
        remove(path)
    except OSError:
        pass


def _is_dir(path: Path) -> bool:
    """True for a real folder (a symlink to one is not)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _listable(base: Path) -> bool:
    """Whether a layer's v1 folder can be listed (absent counts: the layer is empty); an
    unreadable one (another user's 0700 folder) is named once."""
    try:
        os.listdir(base)
    except FileNotFoundError:
        return True
    except OSError as exc:
        _warn_once(f"cannot read cache layer {base.parent}: {exc.strerror or exc}; skipping it")
        return False
    return True


def unique_suffix(chars: int = 8) -> str:
    """Random hex for temporary names (what uuid4().hex[:chars] gave, without importing uuid)."""
    return os.urandom((chars + 1) // 2).hex()[:chars]


class CorruptEntry(MonoJitError):
    """An entry failed verification or its trust check (the store turns it into a miss)."""


class Layer(Record):
    root: Path
    writable: bool
    allow_shared: bool = False  # MONO_JIT_ALLOW_SHARED_ROOTS: owner and mode are not checked

    @property
    def base(self) -> Path:
        return self.root / "v1"

    def entry_dir(self, arch: str, key: str) -> Path:
        return self.base / arch / key[:2] / key


class Entry(Record):
    """A published entry, verified when it was loaded."""

    layer: Layer
    path: Path
    key: str
    arch: str
    meta: EntryMeta
    hsaco: bytes
    meta_json: bytes  # meta.json's bytes as published (what export and import copy)

    @property
    def size(self) -> int:
        """Bytes of the entry's regular files (links are not followed)."""
        with os.scandir(self.path) as items:
            return sum(i.stat(follow_symlinks=False).st_size for i in items if i.is_file(follow_symlinks=False))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def meta_bytes(meta: EntryMeta | dict) -> bytes:
    """meta.json's bytes as published (meta.sha256 covers exactly these)."""
    data = meta.to_json() if isinstance(meta, EntryMeta) else meta
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def meta_digest(data: bytes) -> bytes:
    """meta.sha256's bytes for meta.json's bytes `data`."""
    return (sha256(data).hexdigest() + "\n").encode()


def _read_file(path: Path, cap: int, allow_shared: bool) -> bytes:
    """An entry file's bytes once its level is trusted; CorruptEntry if refused or unreadable."""
    reason = examine(path, allow_shared)[1]
    if reason is not None:
        raise CorruptEntry(f"untrusted: {reason}")
    try:
        return read_regular(path, cap)
    except UnsafeFile as exc:
        raise CorruptEntry(f"unsafe: {exc}") from None
    except OSError as exc:
        raise CorruptEntry(f"unreadable: {exc}") from None


def read_entry(layer: Layer, path: Path, arch: str) -> Entry:
    """Load and verify the entry folder at `path` (its prefix folder is the caller's to trust);
    CorruptEntry says what is wrong."""
    exists, reason = examine(path, layer.allow_shared, folder=True)
    if not exists:
        raise CorruptEntry(f"{path} is missing")
    if reason is not None:
        raise CorruptEntry(f"untrusted: {reason}")
    data = _read_file(path / META_NAME, META_CAP, layer.allow_shared)
    if _read_file(path / DIGEST_NAME, DIGEST_CAP, layer.allow_shared) != meta_digest(data):
        raise CorruptEntry(f"meta.json does not match {DIGEST_NAME} (changed or damaged)")
    hsaco = _read_file(path / HSACO_NAME, HSACO_CAP, layer.allow_shared)
    return Entry(layer, path, path.name, arch, verify_entry(path.name, arch, data, hsaco), hsaco, data)


def verify_entry(key: str, arch: str, data: bytes, hsaco: bytes) -> EntryMeta:
    """The checks every load (and every bundle import) makes on meta.json's bytes `data` and the
    HSACO bytes; the entry's meta, or CorruptEntry saying what is wrong."""
    try:
        meta = EntryMeta.from_json(json.loads(data))
    except (ValueError, RecursionError) as exc:  # MetaError is a ValueError
        raise CorruptEntry(str(exc) if isinstance(exc, MetaError) else f"meta.json is not JSON: {exc}") from None
    if meta.key != key or cache_key(meta.factors) != key:
        raise CorruptEntry("meta.json's key or factors do not match the entry's key")
    if meta.arch != arch or arch not in MACH_BY_ARCH:
        raise CorruptEntry(f"meta.json says arch {meta.arch!r}, the entry sits under {arch}")
    if len(hsaco) != meta.hsaco.size:
        raise CorruptEntry(f"kernel.hsaco is {len(hsaco)} bytes, meta.json says {meta.hsaco.size}")
    if sha256(hsaco).hexdigest() != meta.hsaco.sha256:
        raise CorruptEntry("kernel.hsaco's sha256 does not match meta.json")
    try:
        check_header(hsaco, arch)
    except InvalidCodeObject as exc:
        raise CorruptEntry(str(exc)) from None
    return meta


class Store:
    """Read-only layers in order, then the writable layer."""

    def __init__(self, settings: Settings, read_only: bool = False) -> None:
        """`read_only`: write nothing anywhere (offline lookups): the writable root is searched
        as one more read-only layer when it exists and is never created, stamped or quarantined
        into."""
        self.settings = settings
        allow = bool(settings.allow_shared_roots)
        layers = []
        for root in settings.readonly_roots:
            if not root.is_dir():
                what = "is not a folder" if root.exists() else "does not exist"
                _warn_once(f"read-only cache root {root} (MONO_JIT_CACHE_PATH) {what}; skipping it")
                continue
            try:
                check_root(root, allow)
            except UntrustedRoot as exc:
                _warn_once(f"skipping read-only cache layer {root}: {exc}")
                continue
            if not _listable(root / "v1"):
                continue
            layers.append(Layer(root, writable=False, allow_shared=allow))
        writable = settings.writable_root
        if not read_only:
            try:
                make_private_root(writable)
            except OSError as exc:  # an unwritable HOME: hits from the read-only layers still serve
                # Information, not a warning: a serving user of a read-only image layer needs no
                # writable root, and a write that needs one fails with its own one-line error.
                _info_once(f"cannot create the writable cache root {writable} ({exc.strerror or exc}): serving "
                           "from the read-only layers only; a miss cannot be compiled into it")
                read_only = True
        if writable.is_dir():
            check_root(writable, allow)
        self.writable = Layer(writable, writable=not read_only, allow_shared=allow)
        self.layers: tuple[Layer, ...] = (*layers, self.writable) if writable.is_dir() else tuple(layers)
        info(__name__, "cache layers: %s", ", ".join(
            f"{layer.root} ({'writable' if layer.writable else 'read-only'})" for layer in self.layers) or "none")
        self._arch_trust: dict[tuple[Path, str], bool] = {}
        self.rejected: dict[str, list[tuple[Path, str]]] = {}  # key -> each copy a lookup found unusable, and why
        self._toolchains: dict[tuple[str, str], list[dict]] = {}  # (recorded or scanned, arch) -> fingerprints

    # -- trust -------------------------------------------------------------------------------

    def _arch_trusted(self, layer: Layer, arch: str) -> bool:
        """Whether `layer`'s v1/<arch> may serve (True when absent: it holds nothing); a refused
        one is reported once and remembered."""
        known = self._arch_trust.get((layer.root, arch))
        if known is not None:
            return known
        exists, reason = examine(layer.base / arch, layer.allow_shared, folder=True)
        if not exists:
            return True
        if reason is not None:
            _warn_once(f"skipping {arch} of cache layer {layer.root}: {reason}")
        self._arch_trust[(layer.root, arch)] = reason is None
        return reason is None

    @staticmethod
    def _folder_usable(layer: Layer, folder: Path) -> bool:
        """Whether a folder below v1/<arch> (a prefix folder, toolchains/) exists and may serve;
        a refused one is reported once."""
        exists, reason = examine(folder, layer.allow_shared, folder=True)
        if reason is not None:
            _warn_once(f"skipping cache folder {folder}: {reason}")
        return exists and reason is None

    def _private_dir(self, folder: Path) -> Path:
        """`folder` of the writable layer, made 0700 if missing; NotADirectoryError if a file is
        in its way (a disk fault, as when a level above it is one), UntrustedRoot if it is a link
        or others can write it."""
        make_dirs(folder)
        if not os.path.islink(folder) and not os.path.isdir(folder):
            raise NotADirectoryError(errno.ENOTDIR, "a file is in the way of a cache folder", str(folder))
        reason = examine(folder, self.writable.allow_shared, folder=True)[1]
        if reason is not None:
            raise UntrustedRoot(f"cannot write into the cache: {reason}")
        return folder

    # -- reading -----------------------------------------------------------------------------

    def lookup(self, key: str, arch: str) -> Entry | None:
        """The first verified entry for `key` in layer order; bad entries are set aside."""
        for layer in self.layers:
            path = layer.entry_dir(arch, key)
            if not self._arch_trusted(layer, arch) or not self._folder_usable(layer, path.parent):
                continue
            if not os.path.lexists(path):
                continue
            try:
                entry = read_entry(layer, path, arch)
            except CorruptEntry as reason:
                self.rejected.setdefault(key, []).append((path, str(reason)))
                self.quarantine(layer, path, str(reason))
                continue
            if layer.writable:
                self._touch(path)
            return entry
        return None

    def probe(self, key: str, arch: str) -> tuple[Entry | None, list[tuple[Path, str]]]:
        """What a lookup would find, writing nothing (no quarantine, no stamp): the first good
        copy of `key`, and every unusable copy or refused folder met before it, with why."""
        bad: list[tuple[Path, str]] = []
        for layer in self.layers:
            path = layer.entry_dir(arch, key)
            for level in (layer.base / arch, path.parent):
                reason = examine(level, layer.allow_shared, folder=True)[1]
                if reason is not None:
                    bad.append((level, reason))
                    break
            else:
                if not os.path.lexists(path):
                    continue
                try:
                    return read_entry(layer, path, arch), bad
                except CorruptEntry as reason:
                    bad.append((path, str(reason)))
        return None, bad

    def entries(self) -> Iterator[Entry | tuple[Path, str]]:
        """Every copy of every entry, layer by layer, each verified on its own (a key has a copy
        in each layer that holds it); (path, reason) for a bad copy or a refused prefix folder."""
        for layer in self.layers:
            for arch in self._arches(layer):
                for path in _entry_paths(layer, layer.base / arch):
                    try:
                        yield read_entry(layer, path, arch)
                    except CorruptEntry as reason:
                        yield (path, str(reason))

    def served(self) -> Iterator[Entry]:
        """For each key, the copy a lookup serves: the first good copy in layer order."""
        seen: set[tuple[str, str]] = set()
        for item in self.entries():
            if isinstance(item, Entry) and (item.arch, item.key) not in seen:
                seen.add((item.arch, item.key))
                yield item

    def _arches(self, layer: Layer) -> list[str]:
        """The trusted v1/<arch> folders of `layer`."""
        try:
            names = sorted(os.listdir(layer.base))
        except FileNotFoundError:
            return []
        except OSError as exc:  # an unreadable layer holds nothing we can serve: say so once
            _warn_once(f"cannot read cache layer {layer.root}: {exc.strerror or exc}; skipping it")
            return []
        return [n for n in names if n.startswith("gfx") and self._arch_trusted(layer, n)]

    # -- writing -----------------------------------------------------------------------------

    def publish(self, key: str, arch: str, hsaco: bytes, meta: EntryMeta) -> Entry:
        """Write an entry atomically into the writable layer and return it (verified)."""
        return self.publish_json(key, arch, hsaco, meta_bytes(meta))

    def publish_json(self, key: str, arch: str, hsaco: bytes, meta_json: bytes) -> Entry:
        """Write an entry whose meta.json bytes are `meta_json` (an imported entry's own bytes,
        copied unchanged) atomically into the writable layer and return it (verified)."""
        final = self.writable.entry_dir(arch, key)
        self._private_dir(final.parent.parent)
        self._private_dir(final.parent)
        tmp = self._private_dir(self.writable.base / "tmp") / f"{key[:16]}-{os.getpid()}-{unique_suffix(8)}"
        tmp.mkdir(mode=0o700)
        try:
            _write_entry(tmp, hsaco, meta_json)
            try:
                os.rename(tmp, final)
            except OSError:
                if not _is_dir(final):
                    raise
                _rmtree(tmp)  # lost the race: keep the winner's copy
            _fsync_dir(final.parent)
        finally:
            if os.path.lexists(tmp):
                _rmtree(tmp)
        # Read back through the load path on purpose: it proves the published copy (or the
        # racing winner's) is whole before anyone is told it exists.
        try:
            entry = read_entry(self.writable, final, arch)
        except CorruptEntry as exc:
            if os.path.lexists(final):
                raise CorruptEntry(f"the cache entry just published at {final} is bad: {exc}") from None
            # A gc evicted it (by one rename) before the read-back: the bytes written serve,
            # verified as a load would; the next lookup misses and compiles again.
            info(__name__, "%s was evicted right after it was published: serving the bytes written", final)
            entry = Entry(self.writable, final, key, arch, verify_entry(key, arch, meta_json, hsaco), hsaco, meta_json)
        self._record_toolchain_or_warn(final, arch, entry.meta.toolchain)
        return entry

    def _record_toolchain_or_warn(self, final: Path, arch: str, fingerprint: dict) -> None:
        """_record_toolchain after a publish: a failed record does not unpublish the entry at
        `final`, so it is one warning saying which of the two is written."""
        try:
            self._record_toolchain(arch, fingerprint)
        except OSError as exc:
            from .fs import disk_problem

            folder = self.writable.base / arch / TOOLCHAINS_DIR
            _warn("%s is published, but the record of its toolchain is not (a host without a toolchain finds the "
                  "entry by scanning; the next publish records it): %s", final,
                  disk_problem(exc, "cannot write the toolchain record", folder))

    def _record_toolchain(self, arch: str, fingerprint: dict) -> None:
        """Remember which toolchain built entries here, so a process that cannot fingerprint a
        toolchain of its own (no FlyDSL or ld.lld on a serving host) can still find them."""
        name, data = toolchain_record(fingerprint)
        folder = self._private_dir(self.writable.base / arch / TOOLCHAINS_DIR)
        target = folder / name
        if os.path.lexists(target):
            return
        tmp = folder / f".{target.name}.{os.getpid()}.{unique_suffix(6)}"
        try:
            write_new(tmp, data, FILE_MODE)
            os.replace(tmp, target)
        except OSError:
            Path(tmp).unlink(missing_ok=True)  # a failed write leaves no temporary record
            raise

    def recorded_toolchains(self, arch: str) -> list[dict]:
        """Fingerprints that built entries for `arch`, in layer order (see _record_toolchain);
        refused folders and unsafe or malformed records are skipped."""
        found: list[dict] = []
        for layer in self.layers:
            folder = layer.base / arch / TOOLCHAINS_DIR
            if not self._arch_trusted(layer, arch) or not self._folder_usable(layer, folder):
                continue
            for fingerprint in _toolchain_records(layer, folder):
                if fingerprint not in found:
                    found.append(fingerprint)
        return found

    def entry_toolchains(self, arch: str) -> list[dict]:
        """Fingerprints found in the factors of the entries for `arch` themselves, in layer
        order: what finds an entry whose toolchain record is missing (copied without it, or
        made before records existed). Reads every meta.json, so only a lookup that the records
        did not serve asks; the entry a fingerprint leads to is verified when it is loaded."""
        found: list[dict] = []
        for layer in self.layers:
            if not self._arch_trusted(layer, arch):
                continue
            for path in _entry_paths(layer, layer.base / arch):
                if path.parent.name == arch:  # a refused prefix folder, not an entry
                    continue
                fingerprint = _stored_toolchain(layer, path)
                if fingerprint is not None and fingerprint not in found:
                    found.append(fingerprint)
        return found

    def toolchains_tried(self, arch: str, own: dict | None) -> Iterator[dict]:
        """The toolchains whose entries a lookup for `arch` tries, in its order: this host's
        `own` (None: it has none), then, unless MONO_JIT_EXACT_TOOLCHAIN (which needs one here),
        every other the layers hold. The resolver and `mono-jit explain` both follow it."""
        if own is not None:
            yield own
            if self.settings.exact_toolchain:
                return
        yield from self.other_toolchains(arch, own)

    def other_toolchains(self, arch: str, own: dict | None) -> Iterator[dict]:
        """Every toolchain but `own` whose entries for `arch` the layers may hold: the recorded
        ones, then those only the entries' factors name (scanned only if iterated that far).
        Each list is read once per store."""
        seen = [own]
        for kind, read in (("recorded", self.recorded_toolchains), ("scanned", self.entry_toolchains)):
            known = self._toolchains.get((kind, arch))
            if known is None:
                known = self._toolchains[(kind, arch)] = read(arch)
            for fingerprint in known:
                if fingerprint not in seen:
                    seen.append(fingerprint)
                    yield fingerprint

    def quarantine(self, layer: Layer, path: Path, reason: str) -> None:
        """Set a bad entry aside (writable layer) and log why; a read-only one is only skipped.
        A link or file in an entry's place is deleted (never followed, nothing to diagnose)."""
        if not layer.writable:
            _warn_once(f"ignoring bad cache entry {path} in read-only layer: {reason}")
            return
        if not _is_dir(path):
            _rmtree(path)
            _warn("deleted %s from the cache: %s", path, reason)
            return
        try:
            target = self._private_dir(layer.base / "quarantine") / f"{path.name}-{int(time.time())}-{unique_suffix(6)}"
            os.rename(path, target)
        except (OSError, UntrustedRoot) as exc:
            _warn("bad cache entry %s (%s) could not be quarantined: %s", path, reason, exc)
            return
        _warn("quarantined bad cache entry %s -> %s: %s", path, target, reason)
        try:
            write_new(target / "reason.txt", (reason + "\n").encode(), FILE_MODE)
        except OSError as exc:
            _warn("could not write %s: %s", target / "reason.txt", exc)

    def remove(self, path: Path) -> None:
        """Delete an entry of the writable layer: rename away first so it vanishes at once."""
        doomed = self._private_dir(self.writable.base / "tmp") / f"rm-{path.name}-{unique_suffix(8)}"
        os.rename(path, doomed)
        _rmtree(doomed)

    @staticmethod
    def _touch(path: Path) -> None:
        """Refresh the last-used stamp at most hourly, never through a link; a stamp is a hint
        for gc, never a reason to fail a load."""
        stamp = path / STAMP_NAME
        try:
            if not os.path.lexists(stamp):
                write_new(stamp, b"", FILE_MODE)
            elif time.time() - os.lstat(stamp).st_mtime > STAMP_INTERVAL:
                os.utime(stamp, follow_symlinks=False)
        except OSError:
            pass


def toolchain_record(fingerprint: dict) -> tuple[str, bytes]:
    """(file name, contents) of a toolchain record in `v1/<arch>/toolchains/`."""
    text = canonical_json(fingerprint)
    return f"{sha256(text.encode()).hexdigest()[:16]}.json", text.encode()


def _write_entry(folder: Path, hsaco: bytes, data: bytes) -> None:
    """The entry's files in the new folder `folder` (`data`: meta.json's bytes), each created
    exclusively and fsynced."""
    write_new(folder / HSACO_NAME, hsaco, FILE_MODE)
    write_new(folder / META_NAME, data, FILE_MODE)
    write_new(folder / DIGEST_NAME, meta_digest(data), FILE_MODE)
    write_new(folder / STAMP_NAME, b"", FILE_MODE)
    _fsync_dir(folder)


def _entry_paths(layer: Layer, arch_dir: Path) -> Iterator[Path]:
    """Every entry path under `arch_dir` (v1/<arch>/<xx>/<key>), and each prefix folder that is
    refused (a link, or writable by others) in place of the entries it holds."""
    try:
        prefixes = sorted(os.listdir(arch_dir))
    except OSError:
        return
    for name in prefixes:
        prefix = arch_dir / name
        if len(name) != 2 or name.startswith("."):
            continue
        if examine(prefix, layer.allow_shared, folder=True)[1] is not None:
            yield prefix
            continue
        try:
            yield from (prefix / key for key in sorted(os.listdir(prefix)))
        except OSError:
            continue


def _toolchain_records(layer: Layer, folder: Path) -> Iterator[dict]:
    """The fingerprints recorded in the toolchains folder `folder` that are regular, trusted,
    small JSON objects."""
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".json") and not n.startswith("."))
    except OSError:
        return
    for name in names:
        try:
            fingerprint = json.loads(_read_file(folder / name, TOOLCHAIN_CAP, layer.allow_shared))
        except (CorruptEntry, ValueError, RecursionError):
            continue
        if isinstance(fingerprint, dict):
            yield fingerprint


def _stored_toolchain(layer: Layer, path: Path) -> dict | None:
    """The toolchain fingerprint in the factors of the entry at `path`, if its meta.json is a
    trusted, readable JSON object holding one (nothing else is checked here)."""
    try:
        meta = json.loads(_read_file(path / META_NAME, META_CAP, layer.allow_shared))
        fingerprint = meta["factors"]["toolchain"]
    except (CorruptEntry, ValueError, RecursionError, TypeError, KeyError):
        return None
    return fingerprint if isinstance(fingerprint, dict) else None


def last_used(path: Path) -> float:
    """When the entry at `path` was last loaded (its stamp, else the folder; links not followed)."""
    try:
        return os.lstat(path / STAMP_NAME).st_mtime
    except OSError:
        return os.lstat(path).st_mtime
