"""The emulated gfx950's speed on the shipped kernels: K1 at buckets 1 and 8 (one device) and the
whole K2 at bucket 4, ratio 4, on 8 emulated ranks sharing peer memory (the test world of
tests/support/k2_inputs.py, which has 3 rows), each launched once to compile the interpreter and its
caches, then timed. Prints per launch its wave-instructions and wall time, then

    wave_instructions_per_s N
    wave_instructions_per_s_machine M

N over the timed launches on one core (all of them together: wave-instructions / seconds in the
emulator); M with every core busy: one process a core runs the same launches at the same time
(each after compiling and warming up, all released together), and M is the sum of the
processes' rates (each its wave-instructions / its seconds in the emulator, as N). One launch
runs on one core; M is the throughput of independent launches (a CI run's, a selftest's). The issue's goals are 10 million a second on
one core on K2's mix and 20 million on the 2-core machine. The machine's other load counts: run
it on an idle machine.

`--profile` runs the timed launches again inside `mono_jit.emulator.profile.profiling()` and
prints where the interpreter's time went: the CPU's time-stamp counter is read in the compiled
loop as each instruction starts, and the cycles since the previous start are charged to the
previous instruction's operation (its dispatch, operand reads, lane loops, memory checks and
writes). The table gives per counter class (VALU split into compares, DPP-free plain operations
and the rest by operation name) the share of the cycles, the instructions and the nanoseconds
an instruction (cycles scaled by the launches' wall time), then the turns' ends (the last
instruction of each turn: s_barrier, s_sleep, s_endpgm, a full quantum) and the scheduler
(round-robin, parking, idle passes), then the 12 costliest operations. Reading the counter
costs a few cycles an instruction, so the profiled run is slightly slower than the timed one.
These are the emulator's costs on this CPU; nothing here has run on an MI355X.

    .venv/bin/python bench/emulator.py [--cache-dir DIR] [--no-k2] [--profile]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS / "support"))  # the K2 test world and its harness

from mono_jit.config import Settings  # noqa: E402
from mono_jit.emulator import ops  # noqa: E402
from mono_jit.emulator.profile import CYCLES, COUNT, N_OPS, Profile, profiling  # noqa: E402
from mono_jit.pipeline.resolve import resolve  # noqa: E402
from mono_jit.selfcheck.emulated import emulated_launcher  # noqa: E402
from mono_jit.selfcheck.k1_world import K1Run, random_weights  # noqa: E402
from mono_jit.spec import Spec  # noqa: E402
from mono_jit.templates import get  # noqa: E402


def k1_launch(bucket: int, settings: Settings) -> tuple[int, float]:
    """One K1 launch at `bucket` (m = bucket rows): (wave-instructions, seconds)."""
    launch = emulated_launcher("k1", Spec(8, 4, 1024, bucket), settings)
    run = K1Run(bucket, random_weights(row_pad=256), row_pad=256, shuffled=False, device="cpu", launcher=launch)
    run.launch(run.set_step(bucket, seed=bucket, do_fold=1))
    report = launch.backend.last_report
    return report.wave_instructions, report.seconds


def k2_launch(settings: Settings) -> tuple[int, float]:
    """The whole K2 on 8 emulated ranks (bucket 4, ratio 4): (wave-instructions, seconds)."""
    from k2_emulation import K2Code, rank_moe_weights, run_on_ranks, sparse_moe
    from k2_harness import K2Run
    from k2_inputs import TP, full_weights, shard, world

    wd = world(4)
    spec = Spec(8, 4, wd.inputs.topk.shape[1], 4)
    found = resolve(get("k2"), spec, settings=settings)
    code = K2Code.of(spec, found.hsaco, [launch.to_json() for launch in found.meta.launches])
    shards = [shard(full_weights(), rank) for rank in range(TP)]
    layer = sparse_moe(range(0, 384, 24))  # 16 reachable experts of 384: the others are never read
    lay = K2Run(wd, shards[0], 0, 4, "cpu").lay
    mailboxes = [torch.zeros(lay.peer_bytes // 8, dtype=torch.int64) for _ in range(TP)]
    runs = [K2Run(wd, shards[rank], rank, 4, "cpu", mailbox=mailboxes[rank],
                  peer_addresses=[m.data_ptr() for m in mailboxes], moe=rank_moe_weights(layer, rank))
            for rank in range(TP)]
    report = run_on_ranks(code, runs)
    return report.wave_instructions, report.seconds


def group_of(op: int) -> str:
    """The profile's row of an operation: its counter class, VALU split by operation group."""
    klass = ops.CLASSES[ops.CLASS_OF[op]]
    if klass != "valu":
        return klass
    name = ops.NAMES[op]
    if name.startswith("V_CMP_"):
        return "valu compare"
    if name.endswith(("_F32", "_F64")) or name.startswith("V_CVT"):
        return "valu float"
    return "valu integer / bits"


def profile_table(profile: Profile, seconds: float) -> list[str]:
    """The profile as printed lines: per group, turn ends and scheduler, then the costliest ops."""
    table = profile.table
    total = max(profile.total_cycles(), 1)
    ns_per_cycle = seconds * 1e9 / total
    groups: dict[str, list[int]] = {}
    for op in range(N_OPS):
        entry = groups.setdefault(group_of(op), [0, 0])
        entry[0] += int(table[CYCLES, op])
        entry[1] += int(table[COUNT, op])
    rows = sorted(groups.items(), key=lambda item: -item[1][0])
    rows += [("turn ends and entries", [profile.turn_cycles(), 0]), ("scheduler", [profile.scheduler_cycles(), 0])]
    lines = [f"{'where':<24}{'share':>8}{'wave-instructions':>20}{'ns each':>10}"]
    for name, (cycles, count) in rows:
        if cycles == 0 and count == 0:
            continue
        each = f"{cycles * ns_per_cycle / count:.0f}" if count else "-"
        lines.append(f"{name:<24}{100 * cycles / total:>7.1f}%{count:>20,}{each:>10}")
    lines.append("costliest operations:")
    for op in sorted(range(N_OPS), key=lambda o: -int(table[CYCLES, o]))[:12]:
        cycles, count = int(table[CYCLES, op]), int(table[COUNT, op])
        if count:
            lines.append(f"  {ops.NAMES[op]:<22}{100 * cycles / total:>7.1f}%{count:>20,}{cycles * ns_per_cycle / count:>10.0f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache-dir", type=Path, default=None, help="cache to take (or compile) the kernels from")
    parser.add_argument("--no-k2", action="store_true", help="only K1 (K2 on 8 ranks takes minutes)")
    parser.add_argument("--profile", action="store_true", help="then a table of where the interpreter's time went")
    args = parser.parse_args()
    environ = dict(os.environ, **({"MONO_JIT_CACHE_DIR": str(args.cache_dir)} if args.cache_dir else {}))
    settings = Settings(environ)
    k1_launch(1, settings)  # the interpreter's first call compiles it (numba): untimed
    rows = launches(settings, args.no_k2)
    for name, instructions, seconds in rows:
        print(f"{name}: {instructions:,} wave-instructions in {seconds:.2f} s")
    total = sum(r[1] for r in rows) / sum(r[2] for r in rows)
    print(f"wave_instructions_per_s {total:.0f}")
    cores = os.cpu_count() or 1
    print(f"wave_instructions_per_s_machine {machine_rate(environ, args.no_k2, cores):.0f} ({cores} cores)")
    if args.profile:
        with profiling() as profile:
            profiled = launches(settings, args.no_k2)
        print(f"profile of {', '.join(r[0] for r in profiled)}:")
        print("\n".join(profile_table(profile, sum(r[2] for r in profiled))))


def machine_rate(environ: dict[str, str], no_k2: bool, cores: int) -> float:
    """Wave-instructions a second with `cores` processes running `launches` at once."""
    context = multiprocessing.get_context("spawn")
    ready, results = context.Barrier(cores), context.Queue()
    workers = [context.Process(target=core_worker, args=(environ, no_k2, ready, results)) for _ in range(cores)]
    for worker in workers:
        worker.start()
    rates = [results.get() for _ in workers]
    for worker in workers:
        worker.join()
    return sum(rates)


def core_worker(environ: dict[str, str], no_k2: bool, ready: Any, results: Any) -> None:
    """One core's share of `machine_rate`: warm up, wait for the others, run the launches and
    report their wave-instructions a second in the emulator."""
    settings = Settings(environ)
    k1_launch(1, settings)
    ready.wait()
    rows = launches(settings, no_k2)
    results.put(sum(r[1] for r in rows) / sum(r[2] for r in rows))


def launches(settings: Settings, no_k2: bool) -> list[tuple[str, int, float]]:
    """The timed launches: (name, wave-instructions, seconds) each."""
    rows = [(f"k1 bucket {b}", *k1_launch(b, settings)) for b in (1, 8)]
    if not no_k2:
        rows.append(("k2 bucket 4 ratio 4, 8 ranks", *k2_launch(settings)))
    return rows


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"bench wall time {time.perf_counter() - start:.0f} s")
