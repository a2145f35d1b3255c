"""Reproducible tar and tar.gz writing: the same members always make the same bytes.

Nothing of the machine, the user or the moment gets in: members go in sorted by name, each a
regular file with mode 0644, mtime 0, uid / gid 0 and empty owner names, in the ustar format
(no pax headers carrying times); a gzip stream has no file name and an mtime of 0 in its
header, at a fixed compression level. Bundles (bundle.py) and registry blobs (oci/artifact.py)
are written through it, so a digest printed on one machine pins the bytes another one makes from
the same entries (given the same zlib: another zlib version may compress differently).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from pathlib import Path
from typing import BinaryIO, Mapping

MEMBER_MODE = 0o644
GZIP_LEVEL = 9


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    """Append `data` as the regular file `name`, with fixed mode, time and owner."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime, info.uid, info.gid = len(data), MEMBER_MODE, 0, 0, 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def write_tar(out: BinaryIO, members: Mapping[str, bytes], first: str | None = None) -> None:
    """Write `members` as a plain tar to `out`: `first` (when given) leads, the rest follow
    sorted by name."""
    names = sorted(name for name in members if name != first)
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in ([first] if first is not None else []) + names:
            add_member(tar, name, members[name])


def write_file(path: Path, members: Mapping[str, bytes], *, compress: bool, first: str | None = None) -> str:
    """Write `members` (see write_tar) to the file `path`, gzipped when `compress`; returns
    the sha256 of the file's bytes."""
    with open(path, "wb") as raw:
        if compress:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=GZIP_LEVEL, mtime=0) as stream:
                write_tar(stream, members, first)  # type: ignore[arg-type]
        else:
            write_tar(raw, members, first)
    with open(path, "rb") as written:
        return hashlib.file_digest(written, "sha256").hexdigest()
