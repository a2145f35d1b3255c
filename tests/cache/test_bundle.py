"""Hostile bundles: gzip bombs, truncated archives, malformed manifests, unknown arches, forged
checksums and path tricks are each refused with one line, in bounded time and memory, and leave
nothing behind; --sha256 pins the exact bundle."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from cache_settings import settings_at
from mono_jit.cache import Entry, Store
from mono_jit.cache.bundle import export_bundle
from mono_jit.cache.key import cache_key
from mono_jit.cli import main

ZERO_BLOCK = 64 * 1024 * 1024
BOMB_BYTES = 2 * 1024 ** 3  # 2 GiB of zeros inside each bomb
KEY = "ab" * 32


# -- building bundles ---------------------------------------------------------------------------


def _header(name: str, size: int, kind: bytes = tarfile.REGTYPE) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type = size, kind
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def _padded(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 512)


def _write_bomb(path: Path, parts: list[bytes | int]) -> None:
    """A tar.gz of `parts` (bytes as they are, an int as that many zero bytes), written as
    concatenated gzip members so gigabytes of zeros cost one compressed block, repeated: never
    held in memory, and built in milliseconds."""
    zeros = gzip.compress(b"\0" * ZERO_BLOCK, 9)
    with open(path, "wb") as out:
        for part in parts:
            if isinstance(part, bytes):
                out.write(gzip.compress(part))
                continue
            for _ in range(part // ZERO_BLOCK):
                out.write(zeros)
            out.write(gzip.compress(b"\0" * (part % ZERO_BLOCK)))
        out.write(gzip.compress(b"\0" * 1024))  # end of archive


def _manifest(files: dict[str, dict]) -> bytes:
    data = json.dumps({"schema": "mono-jit-bundle/1", "entries": 0, "files": files}).encode()
    return _header("manifest.json", len(data)) + _padded(data)


def _zeros_sha256(size: int) -> str:
    digest = hashlib.sha256()
    block = b"\0" * ZERO_BLOCK
    for _ in range(size // ZERO_BLOCK):
        digest.update(block)
    digest.update(b"\0" * (size % ZERO_BLOCK))
    return digest.hexdigest()


def _bombs(folder: Path) -> dict[str, Path]:
    """Five ways to hide a gigabyte or more of zeros in a bundle of about 2 MB."""
    hsaco, meta = f"entries/gfx950/{KEY}/kernel.hsaco", f"entries/gfx950/{KEY}/meta.json"
    small = {"size": 100, "sha256": "0" * 64}
    many: list[bytes | int] = []  # entries under every cap with honest checksums: only verification stops them
    sizes = {"kernel.hsaco": 60 * 1024 * 1024, "meta.json": 1024 * 1024}
    digests = {file: _zeros_sha256(size) for file, size in sizes.items()}
    files = {}
    for i in range(16):  # 976 MiB in all, just under the total cap
        for file, size in sizes.items():
            name = f"entries/gfx950/{i:064x}/{file}"
            files[name] = {"size": size, "sha256": digests[file]}
            many += [_header(name, size), size]
    layouts = {
        "declared": [_manifest({hsaco: {"size": BOMB_BYTES, "sha256": "0" * 64}, meta: small}),
                     _header(hsaco, BOMB_BYTES), BOMB_BYTES],
        "lying_header": [_manifest({hsaco: small, meta: small}), _header(hsaco, BOMB_BYTES), BOMB_BYTES],
        "unlisted": [_manifest({}), _header("entries/junk", BOMB_BYTES), BOMB_BYTES],
        "pax_header": [_header("pax", BOMB_BYTES, tarfile.XHDTYPE), BOMB_BYTES],
        "many_members": [_manifest(files), *many],
    }
    paths = {}
    for name, parts in layouts.items():
        paths[name] = folder / f"{name}.tar.gz"
        _write_bomb(paths[name], parts)
    return paths


def _members(bundle: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(bundle) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]


def _tar(path: Path, members: list[tuple[str, bytes]], *, manifest: object = "recompute") -> Path:
    """A plain tar of `members`; the manifest is recomputed from them (consistent checksums)
    unless one is given."""
    body = [(n, d) for n, d in members if n != "manifest.json"]
    if manifest == "recompute":
        files = {n: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in body}
        manifest = {"schema": "mono-jit-bundle/1", "entries": len(body) // 2, "files": files}
    data = manifest if isinstance(manifest, bytes) else json.dumps(manifest).encode()
    with tarfile.open(path, "w") as tar:
        for name, blob in [("manifest.json", data), *body]:
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return path


@pytest.fixture
def bundle(warm_cache, tmp_path) -> Path:
    out = tmp_path / "good.tar.gz"
    export_bundle(out, [e for e in Store(settings_at(warm_cache)).entries() if isinstance(e, Entry)])
    return out


def _import(bundle: Path, root: Path, *extra: str):
    return CliRunner().invoke(main, ["import", str(bundle), "--cache-dir", str(root), *extra])


def _refused(result, *words: str) -> str:
    """A one-line error naming `words`, exit 1, no traceback and no click 'Aborted!'."""
    assert isinstance(result.exception, SystemExit) and result.exit_code == 1, result.output
    line = result.output.strip()
    assert "\n" not in line and line.startswith("mono-jit: error: "), line
    assert "Traceback" not in line and "Aborted" not in line
    for word in words:
        assert word in line, line
    return line


def _nothing_left(root: Path) -> None:
    """No entry published, no staging folder left."""
    assert not list((root / "v1").glob("gfx*/??/*"))
    assert not list((root / "v1" / "tmp").glob("*"))


# -- the tests ----------------------------------------------------------------------------------


def test_gzip_bombs_are_refused_quickly_in_bounded_memory(tmp_path):
    bombs = _bombs(tmp_path)
    assert all(p.stat().st_size < 8 * 1024 * 1024 for p in bombs.values())
    root = tmp_path / "cache"
    script = textwrap.dedent(f"""
        import json, os, resource, sys, time
        from pathlib import Path
        from mono_jit.config import Settings
        from mono_jit.cache import Store
        from mono_jit.cache.bundle import import_bundle
        from mono_jit.errors import BundleError
        store = Store(Settings({{**os.environ, "MONO_JIT_CACHE_DIR": {str(root)!r}}}))
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out = {{}}
        for name, path in json.loads(sys.argv[1]).items():
            started = time.perf_counter()
            try:
                import_bundle(store, Path(path))
                error = None
            except BundleError as exc:
                error = str(exc)
            out[name] = [error, time.perf_counter() - started]
        out["growth_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
        print(json.dumps(out))
    """)
    proc = subprocess.run([sys.executable, "-c", script, json.dumps({k: str(v) for k, v in bombs.items()})],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result.pop("growth_kib") < 100 * 1024  # peak RSS grew by under 100 MiB over 9 GiB of zeros
    for name, (error, seconds) in result.items():
        assert error is not None, f"{name} was imported"
        assert "\n" not in error and seconds < 10, (name, error, seconds)
    _nothing_left(root)


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9, 0.999])
@pytest.mark.parametrize("compressed", [True, False])
def test_a_truncated_bundle_is_one_line_and_writes_nothing(bundle, tmp_path, fraction, compressed):
    source = bundle if compressed else _tar(tmp_path / "plain.tar", _members(bundle))
    data = source.read_bytes().rstrip(b"\0")  # tar's zero padding is no content to lose
    cut = tmp_path / ("cut.tar.gz" if compressed else "cut.tar")
    cut.write_bytes(data[:int(len(data) * fraction)])
    _refused(_import(cut, tmp_path / "fresh"))
    _nothing_left(tmp_path / "fresh")


MALFORMED = {
    "not json": b"{not json",
    "a list": [1, 2],
    "files a list": {"schema": "mono-jit-bundle/1", "files": ["entries"]},
    "size a string": {"schema": "mono-jit-bundle/1",
                      "files": {f"entries/gfx950/{KEY}/kernel.hsaco": {"size": "12", "sha256": "0" * 64}}},
    "no sha256": {"schema": "mono-jit-bundle/1", "files": {f"entries/gfx950/{KEY}/kernel.hsaco": {"size": 1}}},
    "entry null": {"schema": "mono-jit-bundle/1", "files": {f"entries/gfx950/{KEY}/kernel.hsaco": None}},
    "odd name": {"schema": "mono-jit-bundle/1",
                 "files": {"entries/gfx950/zz/kernel.hsaco": {"size": 1, "sha256": "0" * 64}}},
    "traversal name": {"schema": "mono-jit-bundle/1",
                       "files": {"entries/gfx950/../../../etc/passwd": {"size": 1, "sha256": "0" * 64}}},
    "one file of two": {"schema": "mono-jit-bundle/1",
                        "files": {f"entries/gfx950/{KEY}/kernel.hsaco": {"size": 1, "sha256": "0" * 64}}},
}


@pytest.mark.parametrize("label", MALFORMED)
def test_a_malformed_manifest_is_one_line(bundle, tmp_path, label):
    forged = _tar(tmp_path / "forged.tar", _members(bundle), manifest=MALFORMED[label])
    names_manifest = label in ("not json", "files a list", "size a string", "no sha256", "entry null")
    _refused(_import(forged, tmp_path / "fresh"), "manifest.json" if names_manifest else "")
    _nothing_left(tmp_path / "fresh")


def test_an_unknown_arch_is_one_line(bundle, tmp_path):
    """Entries relabelled gfx999 throughout (names, meta, factors, key): consistent, but no
    arch this mono-jit knows."""
    members = []
    for name, data in _members(bundle):
        if name.endswith("meta.json"):
            meta = json.loads(data)
            meta["arch"] = meta["factors"]["arch"] = "gfx999"
            meta["key"] = cache_key(meta["factors"])
            data = json.dumps(meta).encode()
        members.append((name, data))
    keys = {n.split("/")[2]: json.loads(d)["key"] for n, d in members if n.endswith("meta.json")}
    renamed = [(n.replace("gfx950", "gfx999").replace(n.split("/")[2], keys[n.split("/")[2]])
                if n.startswith("entries/") else n, d) for n, d in members]
    _refused(_import(_tar(tmp_path / "gfx999.tar", renamed), tmp_path / "fresh"), "gfx999")
    _nothing_left(tmp_path / "fresh")


def test_sha256_pins_the_bundle(bundle, tmp_path):
    right = hashlib.sha256(bundle.read_bytes()).hexdigest()
    _refused(_import(bundle, tmp_path / "fresh", "--sha256", "0" * 64), "sha256", right)
    _nothing_left(tmp_path / "fresh")
    result = _import(bundle, tmp_path / "fresh", "--sha256", right.upper(), "--json")
    assert result.exit_code == 0 and json.loads(result.output)["imported"] == 3, result.output


def _forged_meta(bundle: Path, change) -> list[tuple[str, bytes]]:
    out = []
    for name, data in _members(bundle):
        if name.endswith("meta.json"):
            meta = json.loads(data)
            change(meta)
            data = json.dumps(meta).encode()
        out.append((name, data))
    return out


@pytest.mark.parametrize("label, change", [
    ("key mismatch", lambda meta: meta.update(key="cd" * 32)),
    ("hsaco null", lambda meta: meta.update(hsaco=None)),
])
def test_consistent_checksums_do_not_vouch_for_a_bad_entry(bundle, tmp_path, label, change):
    """The manifest's checksums match every member, but an entry is invalid: the store's own
    verification refuses it, and nothing of the bundle is published."""
    forged = _tar(tmp_path / "forged.tar", _forged_meta(bundle, change))
    _refused(_import(forged, tmp_path / "fresh"), "is bad")
    _nothing_left(tmp_path / "fresh")


@pytest.mark.parametrize("label", ["absolute", "symlink", "twice", "unlisted"])
def test_path_tricks_in_members_are_refused(bundle, tmp_path, label):
    members = _members(bundle)
    name, data = members[1]
    out = tmp_path / "tricks.tar"
    with tarfile.open(out, "w") as tar:
        for member_name, blob in members:
            info = tarfile.TarInfo(member_name)
            info.size = len(blob)
            if member_name == name and label == "symlink":
                info.type, info.linkname, info.size = tarfile.SYMTYPE, "/etc/passwd", 0
            if member_name == name and label == "absolute":
                info.name = "/" + member_name
            tar.addfile(info, io.BytesIO(blob))
            if member_name == name and label == "twice":
                tar.addfile(info, io.BytesIO(blob))
        if label == "unlisted":
            info = tarfile.TarInfo("entries/extra")
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    _refused(_import(out, tmp_path / "fresh"))
    _nothing_left(tmp_path / "fresh")


def test_a_disk_error_while_importing_is_one_line(bundle, tmp_path):
    root = tmp_path / "fresh"
    Store(settings_at(root))
    (root / "v1").mkdir(mode=0o700, exist_ok=True)
    (root / "v1" / "tmp").write_text("in the way")
    _refused(_import(bundle, root), "staging folder", "v1/tmp")
