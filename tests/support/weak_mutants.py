"""The weak-memory half of the fence-mutation harness: each fence mutant of K1's code object
(mono_jit/hsaco/fence_mutants.py) launched on the emulator in weak memory, with the option that
shows its fence's absence: a write-back mutant with workgroups round robin over the XCDs (and
again all on one XCD, where no write-back is needed), a wait mutant with flag-first completion,
an invalidate mutant with warm L1s. A row says whether the launch reported a stale read, and
its first line."""

from __future__ import annotations

from typing import NamedTuple

from mono_jit.config import Settings
from mono_jit.emulator import EmulatorFault
from mono_jit.emulator.weak_state import WeakMemory
from mono_jit.hsaco.fence_mutants import Mutant
from mono_jit.selfcheck.emulated import emulated_launcher
from mono_jit.selfcheck.k1_world import K1Run, random_weights
from mono_jit.spec import Spec


class WeakRow(NamedTuple):
    site: str
    option: str
    report: str | None  # the stale read's first line, None when the launch read nothing stale

    @property
    def caught(self) -> bool:
        return self.report is not None


def options_for(mutant: Mutant) -> list[tuple[str, WeakMemory]]:
    """The weak-memory options a mutant is run under (named), by the fence it removes."""
    if mutant.instruction.startswith("buffer_wbl2"):
        return [("round-robin", WeakMemory()), ("one-xcd", WeakMemory(placement="one-xcd"))]
    if mutant.instruction.startswith("s_waitcnt"):
        return [("flag-first", WeakMemory(flag_first=True))]
    return [("warm-l1", WeakMemory(warm_l1=True))]


def k1_weak_rows(mutant: Mutant, settings: Settings, bucket: int = 1) -> list[WeakRow]:
    """K1's mutant launched once a step (bucket rows, seeded) under each of its options."""
    spec = Spec(8, 4, 1024, bucket)
    rows = []
    for name, options in options_for(mutant):
        launch = emulated_launcher("k1", spec, settings, hsaco=mutant.hsaco)
        launch.backend.machine.weak_memory = options
        run = K1Run(bucket, random_weights(row_pad=256), row_pad=256, shuffled=False, device="cpu", launcher=launch)
        try:
            run.launch(run.set_step(bucket, seed=bucket, do_fold=1))
            report = None
        except EmulatorFault as fault:
            report = str(fault).splitlines()[0]
            assert report.startswith("stale read: "), report  # any other fault is not this harness's
        rows.append(WeakRow(mutant.site, name, report))
    return rows
