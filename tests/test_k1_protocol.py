"""K1's cross-CTA protocol on a model of the grid: 256 CTAs run their hand-offs
(K1Layout.program, the order the kernel's stage loops publish and wait in) under random
scheduling, on a sync area with the words templates/_sync.py uses. Each flag remembers which
launch wrote it, so a wait that passes on an earlier launch's flag is seen.

What must hold: a launch that ends normally never read an earlier launch's
flag, whatever the launches before it did, including one cut short at any point and one with
another row count; where an earlier launch left the area dirty, the new launch traps."""

from __future__ import annotations

import random

import pytest

from mono_jit.templates.k1.layout import CTAS, K1Layout
from mono_jit.templates.sync_area import ARRIVE_WORD, EPOCH_WORD, EXIT_WORD


class Trapped(Exception):
    pass


class SyncArea:
    def __init__(self, words: int):
        self.words = [0] * words
        self.writer = [None] * words  # the launch that last published each flag


class Launch:
    """One K1 launch on the model: every CTA's program as a list of micro-steps."""

    def __init__(self, area: SyncArea, lay: K1Layout, m: int, name: str, arrival_check: bool = True):
        self.area, self.lay, self.m, self.name, self.arrival_check = area, lay, m, name, arrival_check
        self.stale: list[tuple[int, int]] = []
        self.programs = {cta: [("start", 0, 0), *lay.program(cta, m), ("leave", 0, 0)] for cta in range(CTAS)}
        self.tags: dict[int, int] = {}

    def runnable(self, cta: int) -> bool:
        kind, first, count = self.programs[cta][0]
        if kind != "wait":
            return True
        return all(self.area.words[f] == self.tags[cta] for f in range(first, first + count))

    def step(self, cta: int) -> None:
        """Run CTA `cta`'s next micro-step (it must be runnable)."""
        words = self.area.words
        kind, first, count = self.programs[cta].pop(0)
        if kind == "start":  # every thread reads the epoch, then thread 0 counts the CTA in
            self.tags[cta] = words[EPOCH_WORD] + 1
            words[ARRIVE_WORD] += 1
        elif kind == "wait":
            self.stale += [(cta, f) for f in range(first, first + count) if self.area.writer[f] != self.name]
        elif kind == "publish":
            words[first] = self.tags[cta]
            self.area.writer[first] = self.name
        elif kind == "leave":
            before = words[EXIT_WORD]
            words[EXIT_WORD] += 1
            if self.arrival_check and (words[ARRIVE_WORD] > CTAS or before >= CTAS):
                raise Trapped(cta)
            if before == CTAS - 1:  # the last one out: epoch first, then the counters (_sync.leave)
                self.programs[cta] += [("epoch", 0, 0), ("clear arrivals", 0, 0), ("clear exits", 0, 0)]
        elif kind == "epoch":
            words[EPOCH_WORD] = self.tags[cta]
        elif kind == "clear arrivals":
            words[ARRIVE_WORD] = 0
        elif kind == "clear exits":
            words[EXIT_WORD] = 0

    def run(self, rng: random.Random, stop_after: int | None = None) -> str:
        """'done', 'trapped' or 'aborted' (after `stop_after` micro-steps); a state where no CTA
        can move while some still have work is a deadlock and fails the test."""
        steps = 0
        while any(self.programs.values()):
            if stop_after is not None and steps >= stop_after:
                return "aborted"
            ready = [cta for cta, program in self.programs.items() if program and self.runnable(cta)]
            assert ready, f"{self.name}: deadlock with every CTA resident"
            try:
                self.step(rng.choice(ready))
            except Trapped:
                return "trapped"
            steps += 1
        return "done"


def _total_steps(lay: K1Layout, m: int) -> int:
    return sum(len(lay.program(cta, m)) + 2 for cta in range(CTAS)) + 3


@pytest.mark.parametrize("rows, m", [(4, 3), (16, 16), (64, 17)])
def test_launches_in_a_row_finish_and_read_only_their_own_flags(rows, m):
    lay, rng = K1Layout(8, rows), random.Random(rows)
    area = SyncArea(lay.sync_words)
    for step, step_m in enumerate([m, 1, rows, m]):
        launch = Launch(area, lay, step_m, f"step {step}")
        assert launch.run(rng) == "done"
        assert not launch.stale
        assert area.words[EPOCH_WORD] == step + 1 and area.words[EXIT_WORD] == area.words[ARRIVE_WORD] == 0


@pytest.mark.parametrize("seed", range(12))
def test_a_launch_cut_short_is_followed_by_a_trap_or_a_clean_launch(seed):
    """An aborted launch of m rows at a random point, then a launch of another row count on the
    same area: that launch traps, or ends normally having read none of the aborted one's flags."""
    lay, rng = K1Layout(8, 8), random.Random(seed)
    area = SyncArea(lay.sync_words)
    assert Launch(area, lay, 8, "warm-up").run(rng) == "done"
    cut = rng.randrange(1, _total_steps(lay, 7))
    first = Launch(area, lay, 7, "aborted")
    assert first.run(rng, stop_after=cut) in ("aborted", "done")
    second = Launch(area, lay, 3, "next")
    outcome = second.run(rng)
    assert outcome == "trapped" or not second.stale, f"cut at {cut}: read {second.stale[:3]} of the aborted launch"


def test_without_the_arrival_check_an_aborted_launch_leaks_stale_flags():
    """The check is what makes the previous test pass: with it off, some cut point lets the next
    launch pass its waits on the aborted launch's flags (the hazard this guards against)."""
    lay = K1Layout(8, 8)
    leaked = 0
    for seed in range(12):
        rng = random.Random(seed)
        area = SyncArea(lay.sync_words)
        cut = rng.randrange(_total_steps(lay, 7) // 2, _total_steps(lay, 7) - 260)
        Launch(area, lay, 7, "aborted", arrival_check=False).run(rng, stop_after=cut)
        second = Launch(area, lay, 3, "next", arrival_check=False)
        if second.run(rng) == "done" and second.stale:
            leaked += 1
    assert leaked > 0


def test_an_area_that_was_never_zeroed_traps():
    lay, rng = K1Layout(8, 4), random.Random(0)
    area = SyncArea(lay.sync_words)
    area.words = [rng.randrange(1, 1 << 20) for _ in area.words]
    assert Launch(area, lay, 4, "dirty").run(rng) == "trapped"
