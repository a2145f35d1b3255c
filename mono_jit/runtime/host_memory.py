"""Peer memory for ranks that are processes of one host: the reference backend on the CPU.

The in-kernel all-reduces store into every rank's peer buffer through the addresses the ranks
exchanged (peer.py). On GPUs that is HIP IPC memory; here each rank's buffer is a file in
/dev/shm that every rank maps, so one rank's stores are seen by the others as a peer GPU's are.
The interface is the one peer.exchange drives (allocate, handle, open, close, free), with
`settled` once every rank has mapped every buffer: the owner then unlinks its file, so nothing
is left behind in /dev/shm however the processes end. A handle is a file name, and only a file
of this module's naming in the shared folder is ever opened (a forged handle cannot map an
arbitrary file).
"""

from __future__ import annotations

import ctypes
import math
import mmap
import os
import secrets
import tempfile
from pathlib import Path

import torch

PREFIX = "mono-jit-peer-"


def host_tensor(address: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """The host memory at `address` as a tensor of `shape` (no copy): what a kernel given the
    address reads and writes."""
    count = math.prod(shape) * dtype.itemsize
    if address <= 0 or count <= 0:
        raise ValueError(f"{count} bytes at address {address:#x}: not host memory a kernel could read")
    raw = (ctypes.c_uint8 * count).from_address(address)
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).view(shape)


def shared_folder() -> Path:
    """Where the buffers' files live: /dev/shm (memory-backed), else the temporary folder."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


class HostSharedMemory:
    """Shared-memory peer buffers of one process (module docstring)."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = (folder or shared_folder()).resolve()
        self._maps: dict[int, mmap.mmap] = {}
        self._files: dict[int, Path] = {}

    def _map(self, fd: int, size: int) -> int:
        mapping = mmap.mmap(fd, size)
        address = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
        self._maps[address] = mapping
        return address

    def malloc_uncached(self, size: int) -> int:
        """A zeroed buffer of `size` bytes, in a new file only this user can open."""
        path = self.folder / f"{PREFIX}{os.getpid()}-{secrets.token_hex(8)}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, size)
            address = self._map(fd, size)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        self._files[address] = path
        return address

    def ipc_handle(self, address: int) -> str:
        return self._files[address].name

    def ipc_open(self, handle: str) -> int:
        """Map a peer's buffer by its handle (a file name of this module's, in the shared folder)."""
        if not isinstance(handle, str) or not handle.startswith(PREFIX) or "/" in handle or handle in (".", ".."):
            raise ValueError(f"peer handle {handle!r}: expected a {PREFIX}* file name")
        fd = os.open(self.folder / handle, os.O_RDWR | os.O_NOFOLLOW)
        try:
            return self._map(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)

    def settled(self, address: int) -> None:
        """Every rank has mapped this buffer: remove its file (the mappings stay)."""
        path = self._files.pop(address, None)
        if path is not None:
            path.unlink(missing_ok=True)

    def ipc_close(self, address: int) -> None:
        mapping = self._maps.pop(address, None)
        if mapping is not None:
            try:
                mapping.close()
            except BufferError:  # a tensor still views it: the mapping goes with the last view
                pass

    def free(self, address: int) -> None:
        self.settled(address)
        self.ipc_close(address)
