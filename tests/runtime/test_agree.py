"""All-or-none across ranks on a real gloo group of processes: one rank that cannot run makes
every rank fall back with the same reason, and no rank hangs; peer memory is exchanged in rank
order, or released on every rank when one rank cannot open it (HIP replaced by a fake)."""

from __future__ import annotations

import multiprocessing as mp
import socket

import pytest

from mono_jit.runtime.backends import ReferenceBackend

WAIT_S = 120


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(target, world: int, *args) -> list:
    """Run target(rank, world, port, *args) in `world` spawned processes; their results by rank."""
    ctx = mp.get_context("spawn")
    port, results = _free_port(), ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(target, rank, world, port, results, *args)) for rank in range(world)]
    for p in procs:
        p.start()
    try:
        got = dict(results.get(timeout=WAIT_S) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return [got[rank] for rank in range(world)]


def _rank_main(target, rank, world, port, results, *args):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        results.put((rank, target(rank, world, dist.group.WORLD, *args)))
    except Exception as exc:  # reported, so the parent never waits for a dead rank's result
        results.put((rank, f"raised {type(exc).__name__}: {exc}"))
    finally:
        dist.destroy_process_group()


class _BrokenBackend(ReferenceBackend):
    def load(self, template, spec, meta, hsaco):
        raise RuntimeError("no kernels for this build")


def _runner_on_rank(rank, world, group, failing):
    from mono_jit.runtime.runner import MonoRunner

    backend = _BrokenBackend() if rank == failing else ReferenceBackend()
    runner = MonoRunner(8, rank, group, "cpu", 8192, templates=("k1",), backend=backend)
    return runner.declined


@pytest.mark.slow
def test_one_failing_rank_of_eight_makes_every_rank_fall_back():
    declined = _run_ranks(_runner_on_rank, 8, 3)
    assert all(d == declined[0] for d in declined), declined
    assert declined[0] == "rank 3: RuntimeError: no kernels for this build"


@pytest.mark.slow
def test_eight_healthy_ranks_agree_to_run():
    assert _run_ranks(_runner_on_rank, 8, -1) == [None] * 8


class FakeHip:
    """Device pointers are 0x1000 x (rank + 1); a handle names its rank; rank `broken` cannot open."""

    def __init__(self, rank, broken):
        self.rank, self.broken, self.closed, self.freed = rank, broken, [], []

    def malloc_uncached(self, nbytes):
        assert nbytes % 4096 == 0
        return 0x1000 * (self.rank + 1)

    def ipc_handle(self, pointer):
        return bytes([self.rank]) * 64

    def ipc_open(self, handle):
        if self.rank == self.broken:
            raise RuntimeError("hipIpcOpenMemHandle failed: HIP error 1 (invalid argument)")
        return 0x100000 + handle[0]

    def ipc_close(self, pointer):
        self.closed.append(pointer)

    def free(self, pointer):
        self.freed.append(pointer)


def _exchange_on_rank(rank, world, group, broken):
    from mono_jit.runtime.peer import exchange

    hip = FakeHip(rank, broken)
    memory, why = exchange(hip, 5000, group, rank, world)
    return (memory.addresses, memory.local.numel()) if memory else (why, hip.closed, hip.freed)


@pytest.mark.slow
def test_peer_memory_is_exchanged_in_rank_order():
    got = _run_ranks(_exchange_on_rank, 3, -1)
    for rank, (addresses, size) in enumerate(got):
        assert size == 8192
        assert addresses == [0x1000 * (rank + 1) if peer == rank else 0x100000 + peer for peer in range(3)]


@pytest.mark.slow
@pytest.mark.parametrize("broken", [0, 2])
def test_a_rank_that_cannot_open_peer_memory_releases_it_on_every_rank(broken):
    got = _run_ranks(_exchange_on_rank, 3, broken)
    for rank, (why, closed, freed) in enumerate(got):
        assert why == f"rank {broken}: opening peer memory: hipIpcOpenMemHandle failed: HIP error 1 (invalid argument)"
        assert freed == [0x1000 * (rank + 1)]
        assert sorted(closed) == ([] if rank == broken else [0x100000 + p for p in range(3) if p != rank])
