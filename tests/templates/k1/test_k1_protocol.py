"""K1's cross-CTA protocol on a model of the grid: 256 CTAs run their hand-offs
(K1Layout.program, generated from the same schedule table as the kernel's stage loops) under
random scheduling, on a sync area with the words templates/sync_device.py uses. Each flag remembers
which launch wrote it, so a wait that passes on an earlier launch's flag is seen, and each task's
work checks that the tasks whose output it reads (`producers`, this file's own statement of the
data flow, not the table's) have finished in this launch.

What must hold: a launch that ends normally never read an earlier launch's flag nor data not yet
written, whatever the launches before it did, including one cut short at any point and one with
another row count; where an earlier launch left the area dirty, the new launch traps. A table
with a wait missing or too short fails here."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from mono_jit.templates import seam_layout
from mono_jit.templates.k1 import addressing as ad
from mono_jit.templates.geometry import CTAS
from mono_jit.templates.k1.layout import BYTE_REGIONS, F32_REGIONS, SCHEDULE, K1Layout
from mono_jit.templates.schedule import Wait, hand_off_errors
from mono_jit.templates.sync_words import ARRIVE_WORD, EPOCH_WORD, EXIT_WORD


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
        self.early: list[tuple[int, int]] = []  # (stage, task) that ran before a task it reads from
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
        elif kind == "run":
            stage, task = first, count
            if any(self.area.writer[self.lay.flag_base(p) + t] != self.name
                   for p, t in producers(self.lay, stage, task, self.m)):
                self.early.append((stage, task))
        elif kind == "publish":
            words[first] = self.tags[cta]
            self.area.writer[first] = self.name
        elif kind == "leave":
            before = words[EXIT_WORD]
            words[EXIT_WORD] += 1
            if self.arrival_check and (words[ARRIVE_WORD] > CTAS or before >= CTAS):
                raise Trapped(cta)
            if before == CTAS - 1:  # the last one out: epoch first, then the counters (sync_device.leave)
                self.programs[cta] += [("epoch", 0, 0), ("clear arrivals", 0, 0), ("clear exits", 0, 0)]
        elif kind == "epoch":
            words[EPOCH_WORD] = self.tags[cta]
        elif kind == "clear arrivals":
            words[ARRIVE_WORD] = 0
        elif kind == "clear exits":
            words[EXIT_WORD] = 0

    def run(self, rng: random.Random, stop_after: int | None = None, laggard: int | None = None) -> str:
        """'done', 'trapped' or 'aborted' (after `stop_after` micro-steps); a state where no CTA
        can move while some still have work is a deadlock and fails the test. A `laggard` CTA
        moves only when no other can (the slow CTA a missing wait would race with)."""
        steps = 0
        while any(self.programs.values()):
            if stop_after is not None and steps >= stop_after:
                return "aborted"
            ready = [cta for cta, program in self.programs.items() if program and self.runnable(cta)]
            assert ready, f"{self.name}: deadlock with every CTA resident"
            others = [cta for cta in ready if cta != laggard]
            try:
                self.step(rng.choice(others or ready))
            except Trapped:
                return "trapped"
            steps += 1
        return "done"


def producers(lay: K1Layout, stage: int, task: int, m: int) -> list[tuple[int, int]]:
    """The (stage, task)s whose scratch output a live task of `stage` reads, from what each task
    writes (the task decoding of addressing.py and seam_layout.py and the stage list of layout.py's docstring)."""
    groups, heads = math.ceil(lay.rows / 16), lay.heads
    if stage == 2:  # the 56 column chunks of the row's group of 16 (S1's partials)
        return [(1, t) for t in range(groups * 56) if seam_layout.fold_task(t)[0] == task // 16]
    if stage == 3:  # the MXFP8 normed rows below m (rows past m reach only unstored outputs)
        return [(2, row) for row in range(m)]
    if stage == 4:  # all 2048 outputs of the row, both K halves: every S3 tile
        return [(3, t) for t in range(2 * 2048 // 16)]
    if stage == 5:  # the MXFP8 qr rows below m
        return [(4, row) for row in range(m)]
    if stage == 6:  # task = row x groups of 8 heads: q_raw columns of its heads, by the S5 tiles
        group_count = math.ceil(heads / 8)
        first_col = (task % group_count) * 8 * 512
        cols = range(first_col, min(first_col + 8 * 512, heads * 512))
        return [(5, t) for t in range(heads * 512 // 32) if ad.s5_tile(t, 0)[0] in cols]
    return []


def _total_steps(lay: K1Layout, m: int) -> int:
    return sum(len(lay.program(cta, m)) + 2 for cta in range(CTAS)) + 3


@pytest.mark.parametrize("rows, m", [(4, 3), (16, 16), (64, 17)])
def test_launches_in_a_row_finish_and_read_only_their_own_flags(rows, m):
    lay, rng = K1Layout(8, rows), random.Random(rows)
    area = SyncArea(lay.sync_words)
    for step, step_m in enumerate([m, 1, rows, m]):
        launch = Launch(area, lay, step_m, f"step {step}")
        assert launch.run(rng) == "done"
        assert not launch.stale and not launch.early
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
    assert outcome == "trapped" or not second.early, f"cut at {cut}: {second.early[:3]} ran before their inputs"


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


def _mutated(stage: int, **change) -> tuple:
    return tuple(replace(s, **change) if s.number == stage else s for s in SCHEDULE)


WRONG_TABLES = {
    "S2 waits on nothing": _mutated(2, waits=()),
    "S3 waits for one row fewer": _mutated(3, waits=(Wait(2, lambda lay, task, m, data: (0, m - 1)),)),
    "S4 misses the last S3 flag": _mutated(4, waits=(Wait(3, lambda lay, row, m, data: (0, lay.tasks(3) - 1)),)),
    "S5 waits on nothing": _mutated(5, waits=()),
    "S6 waits for half its heads": _mutated(6, waits=(
        Wait(5, lambda lay, task, m, data: ((task % lay.head_groups) * 128, 64)),)),
}


def _runs_early(lay: K1Layout, m: int) -> list[tuple[int, int]]:
    """Every task that ran before its inputs, over launches with a few laggard CTAs."""
    early = []
    for laggard in (1, 31, 255):
        area = SyncArea(lay.sync_words)
        launch = Launch(area, lay, m, f"laggard {laggard}")
        assert launch.run(random.Random(laggard), laggard=laggard) == "done"
        assert not launch.stale
        early += launch.early
    return early


def test_the_model_runs_the_table_the_kernel_runs():
    """K1Layout's program is the schedule's: every stage's waits and publishes come from
    SCHEDULE, which kernel.make_kernel loops over (tests/templates/k1/test_k1_gates.py compiles a wrong table
    to see the kernel follow it)."""
    lay = K1Layout(8, 16)
    kinds = {step[0] for cta in range(CTAS) for step in lay.program(cta, 16)}
    assert kinds == {"wait", "run", "publish"}
    waiting = {s.number for s in SCHEDULE if s.waits}
    assert waiting == {2, 3, 4, 5, 6}
    runs = {(step[1], step[2]) for cta in range(CTAS) for step in lay.program(cta, 16) if step[0] == "run"}
    assert {stage for stage, _ in runs} == {s.number for s in SCHEDULE}
    assert not _runs_early(lay, 16)


@pytest.mark.parametrize("wrong", sorted(WRONG_TABLES))
def test_a_table_with_a_wait_missing_or_short_is_caught(wrong):
    """The model fails a table whose kernel would read data before it is written."""
    lay = replace(K1Layout(8, 16), schedule=WRONG_TABLES[wrong])
    assert _runs_early(lay, 13), f"{wrong}: the model did not see a task run before its inputs"


def test_each_stage_reads_only_scratch_its_producer_wrote():
    """The table's regions agree with its waits; a table that drops S4's wait does not."""
    regions = F32_REGIONS + BYTE_REGIONS
    assert hand_off_errors(SCHEDULE, regions) == []
    assert hand_off_errors(WRONG_TABLES["S5 waits on nothing"], regions) == [
        "S5 reads qr_codes but waits on None, not its writer 4", "S5 reads qr_scales but waits on None, not its writer 4"]
