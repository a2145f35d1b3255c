"""Where the interpreter's time goes: CPU cycles per operation, per wave turn and in the
scheduler, collected while a `profiling()` block is open (`bench/emulator.py --profile`).

The interpreter reads the time-stamp counter (`cycles.py`) as each instruction starts and
charges the cycles since the previous start to the previous instruction's operation, so an
operation's cost includes its dispatch. The last instruction of a wave's turn (an `s_barrier`,
`s_sleep`, `s_endpgm`, or the end of the quantum) and the turn's entry are charged to TURN;
whatever the whole run took outside the waves' turns (the round-robin, parking, idle passes) is
the scheduler's (TOTAL is timed around each call of the interpreter). Off (the usual case) the arrays have no columns and the interpreter reads no
counter; the counters and results of a launch are the same either way."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from . import ops as O
from .cycles import cycles
from .jit_cache import njit

N_OPS = len(O.NAMES)
TURNS, TOTAL = N_OPS, N_OPS + 1  # columns after the operations'
COLUMNS = N_OPS + 2
CYCLES, COUNT = 0, 1  # rows
OFF = np.zeros((2, 0), np.int64)  # no columns: the interpreter does not profile


@dataclass
class Profile:
    """Cycles (row CYCLES) and instructions (row COUNT) per operation id, then TURNS (all of the
    waves' turns) and TOTAL (the whole runs) in row CYCLES."""

    table: np.ndarray = field(default_factory=lambda: np.zeros((2, COLUMNS), np.int64))

    def turn_cycles(self) -> int:
        """The turns' ends and entries: what the turns took beyond their operations' cycles."""
        return int(self.table[CYCLES, TURNS] - self.table[CYCLES, :N_OPS].sum())

    def scheduler_cycles(self) -> int:
        return int(self.table[CYCLES, TOTAL] - self.table[CYCLES, TURNS])

    def total_cycles(self) -> int:
        return int(self.table[CYCLES, TOTAL])


_active: list[Profile] = []


@contextmanager
def profiling() -> Iterator[Profile]:
    """Profile every launch run inside the block (of any Machine) into the Profile yielded."""
    profile = Profile()
    _active.append(profile)
    try:
        yield profile
    finally:
        _active.remove(profile)


def active_table() -> np.ndarray:
    """The open profile's table, or OFF."""
    return _active[-1].table if _active else OFF


@njit(cache=True)
def lap(PROF, last, since, op):
    """Charge the cycles since `since` to operation `last` (none when -1), count `op`; returns
    (op, now) for the next call."""
    now = cycles()
    if last >= 0:
        PROF[CYCLES, last] += now - since
    PROF[COUNT, op] += 1
    return op, now


@njit(cache=True)
def now():
    return cycles()
