"""Host shared memory, the CPU's stand-in for HIP's IPC peer buffers (runtime/host_memory.py):
what one mapping stores another sees, files only this user can open whatever the umask, no file
left once every rank has mapped it or the buffer is freed, and a forged handle maps nothing."""

from __future__ import annotations

import os
import stat

import pytest
import torch

from mono_jit.runtime.host_memory import PREFIX, HostSharedMemory, host_tensor


def files(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(PREFIX))


def test_a_peer_sees_the_owners_stores_and_the_file_goes_once_settled(tmp_path):
    owner, peer = HostSharedMemory(tmp_path), HostSharedMemory(tmp_path)
    old = os.umask(0)
    try:
        local = owner.malloc_uncached(8192)
    finally:
        os.umask(old)
    (name,) = files(tmp_path)
    assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600
    mapped = peer.ipc_open(owner.ipc_handle(local))
    host_tensor(local, torch.int64, (1024,))[5] = 77
    assert int(host_tensor(mapped, torch.int64, (1024,))[5]) == 77
    assert int(host_tensor(local, torch.int64, (1024,))[6]) == 0  # zeroed
    owner.settled(local)
    assert files(tmp_path) == []
    host_tensor(mapped, torch.int64, (1024,))[6] = 5  # the mapping outlives the file
    assert int(host_tensor(local, torch.int64, (1024,))[6]) == 5
    peer.ipc_close(mapped)
    owner.free(local)


def test_free_removes_an_unsettled_file(tmp_path):
    memory = HostSharedMemory(tmp_path)
    memory.free(memory.malloc_uncached(4096))
    assert files(tmp_path) == []


@pytest.mark.parametrize("handle", ["../../etc/passwd", "/etc/passwd", "passwd", f"{PREFIX}x/../../y", 7])
def test_a_forged_handle_maps_nothing(tmp_path, handle):
    with pytest.raises((ValueError, OSError)):
        HostSharedMemory(tmp_path).ipc_open(handle)


def test_a_symlink_in_place_of_a_buffer_is_not_followed(tmp_path):
    target = tmp_path / "secret"
    target.write_bytes(b"x" * 4096)
    (tmp_path / f"{PREFIX}planted").symlink_to(target)
    with pytest.raises(OSError):
        HostSharedMemory(tmp_path).ipc_open(f"{PREFIX}planted")


def test_reading_no_memory_is_refused():
    with pytest.raises(ValueError, match="address 0x0"):
        host_tensor(0, torch.float32, (4,))


def test_an_exchange_whose_collective_fails_leaves_no_file(tmp_path):
    """peer.exchange allocates before the collective; when the collective raises (here: no
    process group for 8 ranks) the buffer and its file go with the error, as on a refused rank."""
    from mono_jit.runtime.peer import exchange

    with pytest.raises(ValueError, match="no process group"):
        exchange(HostSharedMemory(tmp_path), 4096, None, 0, 8)
    assert files(tmp_path) == []
