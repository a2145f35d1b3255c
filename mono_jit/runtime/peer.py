"""Peer memory: one uncached device buffer per rank, every rank's address of every buffer.

The in-kernel all-reduces push each rank's partials into its peers' buffers with system-scope
stores. The buffers are uncached device memory (`hipExtMallocWithFlags`, flags 0x3) so peers'
stores are seen without cache maintenance, rounded to 4 KiB (IPC of uncached allocations under
2 MiB needs whole pages), zeroed; each rank's 64-byte IPC handle is all-gathered over the TP
group's gloo group and opened with lazy peer access. This follows AITER's `UncachedIpcHeap`
(`aiter/ops/flydsl/quick_allreduce_int4_ipc.py`), which vLLM 0.33's in-tree mono uses
(`mono/common/peer_memory.py`). A rank that fails
to allocate or open sends None or reports it; the ranks then agree (agree.py) all-or-none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .agree import agree

PAGE = 4096


@dataclass(frozen=True)
class DeviceBuffer:
    """Raw device memory passed as a kernel tensor argument (what kernargs.pack reads)."""

    pointer: int
    elements: int
    dtype: str

    def data_ptr(self) -> int:
        return self.pointer

    def numel(self) -> int:
        return self.elements

    def is_contiguous(self) -> bool:
        return True

    def stride(self) -> tuple[int]:
        return (1,)


@dataclass
class PeerMemory:
    """This rank's buffer and the address of each rank's buffer, indexed by TP rank."""

    local: DeviceBuffer
    addresses: list[int]


def _gather(group: Any, value: object, ranks: int) -> list[object]:
    if group is None:
        if ranks != 1:
            raise ValueError(f"no process group to exchange {ranks} ranks' peer buffers over")
        return [value]
    import torch.distributed as dist

    if dist.get_world_size(group) != ranks:
        raise ValueError(f"a TP group of {dist.get_world_size(group)} ranks, expected {ranks}")
    gathered: list[object] = [None] * ranks
    dist.all_gather_object(gathered, value, group=group)
    return gathered


def exchange(memory: Any, nbytes: int, group: Any, rank: int, tp: int) -> tuple[PeerMemory | None, str | None]:
    """Allocate, exchange and open every rank's buffer; (memory, None) on every rank, or
    (None, reason naming the failed ranks) on every rank. Collective over `group`. `memory`
    allocates and maps: HIP's IPC (hip.Hip) or host shared memory (host_memory.py), whose
    `settled` runs once every rank has opened every buffer."""
    size = -(-nbytes // PAGE) * PAGE
    local: Any = None  # the buffer's address once allocated
    handle: Any = None
    why = ""
    try:
        local = memory.malloc_uncached(size)
        handle = memory.ipc_handle(local)
    except Exception as exc:  # any failure here must still reach the collective below
        why = f"peer memory: {exc}"
    addresses: list[int] = []
    try:
        handles = _gather(group, handle, tp)
        if not why and None not in handles:  # a rank without a buffer says why itself
            try:
                for peer, peer_handle in enumerate(handles):
                    addresses.append(local if peer == rank else memory.ipc_open(peer_handle))
            except Exception as exc:
                why = f"opening peer memory: {exc}"
        failed = agree(group, not why, why)
    except BaseException:  # the collective itself failed (a wrong group, a dead peer): nothing kept
        _release(memory, addresses, rank, local)
        raise
    if failed is None:
        if hasattr(memory, "settled"):
            memory.settled(local)
        return PeerMemory(DeviceBuffer(local, size, "uint8"), addresses), None
    _release(memory, addresses, rank, local)
    return None, failed


def _release(memory: Any, addresses: list[int], rank: int, local: Any) -> None:
    """Close the peers' mappings and free this rank's buffer (host shared memory: its file too)."""
    for peer, address in enumerate(addresses):
        if peer != rank:
            memory.ipc_close(address)
    if local is not None:
        memory.free(local)
