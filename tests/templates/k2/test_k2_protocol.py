"""K2 part one's protocol on a model of 8 ranks x 256 CTAs: every CTA runs its hand-offs
(K2Layout.program, the order the kernel's stage loops wait, publish and push in) under random
scheduling, launch after launch on the same sync areas and peer buffers, a rank starting its
next launch as soon as its own previous one ended (stream order), a rank's first launch
possibly late (host work before it), with the words
templates/sync_device.py uses (arrival ticket, epoch read once, tag = epoch + 1 wrapping as an int32,
exit counter, the last CTA out advancing the epoch) and the peer half of the epoch's low bit.

Every flag and every peer unit (a task's (value, tag) pairs to one rank) remembers the launch that
wrote it, so a wait that passes on another launch's word is seen (a stale read); a state where no
CTA of any rank can move while some have work left is a deadlock. Time is the count of steps
taken (a late rank's start jumps it forward when nothing else can move); with a wait limit, a
CTA that has waited on its peers' units longer than that traps, as the kernel's poll does after
`peer_wait_us`. The model runs part one's schedule table (K2Layout.schedule: its waits, peer
polls and pushes), the one the kernel's stage loops read; what each task reads is checked, when
it starts its work, against `needs`, this file's own statement of the data flow."""

from __future__ import annotations

import functools
import heapq
import random
from dataclasses import dataclass, field, replace
from typing import Callable

import pytest

from mono_jit.templates.geometry import CTAS, SEAM_GROUP, TILE_N
from mono_jit.templates.k2.attention_layout import HEAD_TILE, O_LORA, WOA_PARTS, K2Layout
from mono_jit.templates.schedule import Wait
from mono_jit.templates.sync_words import ARRIVE_WORD, EPOCH_WORD, EXIT_WORD

Program = Callable[[K2Layout, int, int, int], list]


class Trapped(Exception):
    pass


class Deadlock(Exception):
    pass


def wrap(value: int, bits: int) -> int:
    """`value` as a signed `bits`-bit word (the int32 epoch and tags wrap; a narrow tag width
    makes the wrap reachable in a test)."""
    half = 1 << (bits - 1)
    return (value + half) % (2 * half) - half


@dataclass
class Cta:
    rank: int
    index: int
    steps: list = field(default_factory=list)
    pc: int = 0
    tag: int = 0
    half: int = 0
    since: int = -1  # when it began waiting on its peers' units at step pc (-1: not waiting)


class Rank:
    """One GPU: its sync area, its peer buffer (units by (half, region)), its launches."""

    def __init__(self, lay: K2Layout, index: int, epoch: int):
        self.index = index
        self.words = [0] * lay.sync_words
        self.words[EPOCH_WORD] = epoch
        self.word_writer: list = [None] * lay.sync_words
        self.units = {(h, r): [(0, None)] * lay.peer_units(r) for h in (0, 1) for r in lay.peer_regions()}
        self.launch = -1  # the running launch's index
        self.left = 0  # CTAs of the running launch that have not left
        self.ready: list[Cta] = []


class World:
    """8 ranks running the launches of `ms` (one m a step, the same on every rank)."""

    def __init__(self, lay: K2Layout, ms: list[int], seed: int, *, tag_bits: int = 32, epoch: int = 0,
                 ahead: int | None = None, parity: bool = True, program: Program | None = None,
                 epochs: list[int] | None = None, lag: int | None = None,
                 needs: Callable[[K2Layout, tuple, int], tuple[int, ...]] | None = None,
                 wait_limit: int | None = None, late: dict[int, int] | None = None):
        self.lay, self.ms, self.bits, self.parity = lay, ms, tag_bits, parity
        self.needs = needs or globals()["needs"]
        self.program = program or (lambda lay, cta, m, rank: lay.program(cta, m, rank))
        self.rng = random.Random(seed)
        self.ranks = [Rank(lay, r, (epochs or [epoch] * lay.tp)[r]) for r in range(lay.tp)]
        self.weights = [50 if r == ahead else 1 for r in range(lay.tp)]
        self.lag = lag  # a CTA index that runs only when no other CTA of its rank can
        self.waiters: dict[tuple, list[Cta]] = {}
        self.stale: list[tuple] = []
        self.max_lead = 0  # launches a rank started ahead of the slowest rank
        self.now = 0  # steps taken, and the late ranks' start times
        self.wait_limit = wait_limit  # steps a CTA may wait on peer units before it traps (None: no bound)
        self.late = dict(late or {})  # rank -> the time its first launch starts
        self.deadlines: list[tuple[int, int, Cta, int]] = []  # (deadline, id, CTA, its since) of peer waits

    # -- launches ----------------------------------------------------------------------
    def start_launch(self, rank: Rank) -> None:
        rank.launch += 1
        m = self.ms[rank.launch]
        rank.left = CTAS
        for cta in range(CTAS):
            steps = [("start",), *self.program(self.lay, cta, m, rank.index), ("leave",)]
            rank.ready.append(Cta(rank.index, cta, steps))
        self.max_lead = max(self.max_lead, rank.launch - min(r.launch for r in self.ranks))

    def run(self) -> None:
        for rank in self.ranks:
            if rank.index not in self.late:
                self.start_launch(rank)
        while True:
            for index, at in list(self.late.items()):
                if at <= self.now:
                    del self.late[index]
                    self.start_launch(self.ranks[index])
            live = [r for r in self.ranks if r.ready]
            if not live:
                if all(r.launch == len(self.ms) - 1 and r.left == 0 for r in self.ranks) and not self.late:
                    return
                if self.late or self.deadlines:  # nothing moves until a late rank starts or a wait ends
                    self.advance(min([*self.late.values(), *[d + 1 for d, *_ in self.deadlines[:1]]]))
                    continue
                raise Deadlock(f"launches {[r.launch for r in self.ranks]}, CTAs left {[r.left for r in self.ranks]}")
            self.advance(self.now + 1)
            rank = self.rng.choices(live, [self.weights[r.index] for r in live])[0]
            i = self.rng.randrange(len(rank.ready))
            if rank.ready[i].index == self.lag and len(rank.ready) > 1:
                i = (i + 1) % len(rank.ready)
            rank.ready[i], rank.ready[-1] = rank.ready[-1], rank.ready[i]
            cta = rank.ready.pop()
            self.step(cta)
            self.park(cta)

    # -- one CTA -----------------------------------------------------------------------
    def blocker(self, cta: Cta) -> tuple | None:
        """The first flag or unit the CTA's next step waits for that does not carry its tag."""
        step = cta.steps[cta.pc]
        rank = self.ranks[cta.rank]
        if step[0] == "wait":  # ("wait", first, count[, stride]): count flags `stride` apart
            first, count, stride = (*step[1:], 1)[:3]
            for f in range(first, first + count * stride, stride):
                if rank.words[f] != cta.tag:
                    return ("flag", cta.rank, f)
        elif step[0] == "await_peers":
            _, region, first, count = step
            units = rank.units[(cta.half, region)]
            for u in range(first, first + count):
                if units[u][0] != cta.tag:
                    return ("unit", cta.rank, cta.half, region, u)
        return None

    def advance(self, now: int) -> None:
        """Time moves to `now`: a CTA still waiting on its peers' units past its deadline traps."""
        self.now = now
        while self.deadlines and self.deadlines[0][0] < now:
            _, _, cta, since = heapq.heappop(self.deadlines)
            if cta.since == since:  # still in that wait
                raise Trapped(cta.rank)

    def park(self, cta: Cta) -> None:
        """Back in its rank's ready list, or waiting on what blocks it, or done."""
        if cta.pc == len(cta.steps):
            return
        key = self.blocker(cta)
        if key is None:
            self.ranks[cta.rank].ready.append(cta)
            cta.since = -1
        else:
            self.waiters.setdefault(key, []).append(cta)
            if key[0] == "unit" and cta.since < 0 and self.wait_limit is not None:
                cta.since = self.now
                heapq.heappush(self.deadlines, (self.now + self.wait_limit, id(cta), cta, self.now))

    def wake(self, key: tuple) -> None:
        for cta in self.waiters.pop(key, []):
            self.park(cta)

    def step(self, cta: Cta) -> None:
        rank = self.ranks[cta.rank]
        step = cta.steps[cta.pc]
        cta.pc += 1
        me = (rank.index, rank.launch)
        kind = step[0]
        if kind == "start":  # every thread reads the epoch, thread 0 takes an arrival ticket
            epoch = rank.words[EPOCH_WORD]
            cta.tag = wrap(epoch + 1, self.bits)
            cta.half = self.lay.peer_half(epoch) if self.parity else 0
            rank.words[ARRIVE_WORD] += 1
        elif kind in ("wait", "run") and cta.steps[cta.pc][0] not in ("wait", "run"):  # then the task reads
            consumer = next(s for s in cta.steps[cta.pc:] if s[0] in ("publish", "push"))
            self.stale += [("flag", me, f, rank.word_writer[f])
                           for f in self.needs(self.lay, consumer, self.ms[rank.launch]) if rank.word_writer[f] != me]
        elif kind == "await_peers":
            _, region, first, count = step
            units = rank.units[(cta.half, region)]
            self.stale += [(region, me, u, units[u][1]) for u in range(first, first + count)
                           if units[u][1] is None or units[u][1][1] != rank.launch]
        elif kind == "publish":
            rank.words[step[1]] = cta.tag
            rank.word_writer[step[1]] = me
            self.wake(("flag", rank.index, step[1]))
        elif kind == "push":  # system-scope (value, tag) stores into the peer's half
            _, peer, region, unit = step
            self.ranks[peer].units[(cta.half, region)][unit] = (cta.tag, me)
            self.wake(("unit", peer, cta.half, region, unit))
        elif kind == "leave":
            self.leave(rank, cta)

    def leave(self, rank: Rank, cta: Cta) -> None:
        """sync_device.leave: count out; trap on a dirty area; the last out advances the epoch to its tag
        and clears the counters; then the rank's next launch may start (stream order)."""
        words = rank.words
        before = words[EXIT_WORD]
        words[EXIT_WORD] += 1
        if words[ARRIVE_WORD] > CTAS or before >= CTAS:
            raise Trapped(rank.index)
        rank.left -= 1
        if before == CTAS - 1:
            words[EPOCH_WORD] = cta.tag
            words[ARRIVE_WORD] = words[EXIT_WORD] = 0
            if rank.launch + 1 < len(self.ms):
                self.start_launch(rank)


@functools.lru_cache(maxsize=None)
def needs(lay: K2Layout, consumer: tuple, m: int) -> tuple[int, ...]:
    """The flags whose data the task that publishes / pushes `consumer` reads, from the stages'
    data dependencies (not from the *_awaits ranges the program waits on)."""
    if consumer[0] == "push" and consumer[2] == "ag":  # S7 on a chunk's owner: its peers' units only
        return ()
    if consumer[0] == "push":  # wo_b: the MXFP8 z of every live row
        return tuple(lay.f_z + r for r in range(m))
    flag = consumer[1]
    if lay.f_keys <= flag < lay.f_attn or lay.f_seam <= flag < lay.f_norm:  # key table, S7: no flag's data
        return ()
    if lay.f_attn <= flag < lay.f_merge:  # attention: its row's key table
        return (lay.f_keys + lay.s2_task(flag - lay.f_attn)[0],)
    if lay.f_merge <= flag < lay.f_woa:  # merge: every chunk of its row and head's tile
        row, head = lay.s3_task(flag - lay.f_merge)
        return tuple(lay.f_attn + t for t in range(lay.tasks(2)) if lay.s2_task(t)[:2] == (row, head // HEAD_TILE))
    if lay.f_woa <= flag < lay.f_z:  # wo_a: its K half's heads' merges of the live rows
        tile, half = lay.s4_task(flag - lay.f_woa)
        per_group = lay.heads // lay.groups
        first = tile * TILE_N // O_LORA * per_group + half * per_group // WOA_PARTS
        return tuple(lay.f_merge + t for t in range(lay.tasks(3)) if lay.s3_task(t)[0] < m
                     and first <= lay.s3_task(t)[1] < first + per_group // WOA_PARTS)
    if lay.f_z <= flag < lay.f_seam:  # z quant: both halves of every wo_a tile
        return tuple(range(lay.f_woa, lay.f_z))
    if lay.f_norm <= flag < lay.f_norm + lay.tasks(8):  # seam gate: every column chunk of its row group
        group = (flag - lay.f_norm) // SEAM_GROUP
        return tuple(lay.f_seam + t for t in range(lay.tasks(7)) if lay.s7_task(t)[0] == group)
    raise AssertionError(f"no stage waits before {consumer}")


def _steps(rng: random.Random, rows: int, n: int) -> list[int]:
    """n step widths for a bucket of `rows`: its full width, 1, and random ones."""
    return [rows, 1] + [rng.randint(1, rows) for _ in range(n - 2)]


CASES = [  # (ratio, width, rows): one hop at 4 and 16 rows, two hops at 32 and 64
    (4, 1024, 4), (128, 8192, 16), (4, 1024, 32), (128, 8192, 64)]


@pytest.mark.parametrize("ratio, width, rows", CASES)
def test_launches_in_a_row_on_8_ranks_finish_and_read_only_their_own_words(ratio, width, rows):
    lay = K2Layout(8, ratio, width, rows)
    world = World(lay, _steps(random.Random(rows), rows, 4 if rows < 64 else 3), seed=rows)
    world.run()
    assert not world.stale, world.stale[:3]
    assert all(r.words[EPOCH_WORD] == len(world.ms) for r in world.ranks)


@pytest.mark.parametrize("rows", [8, 32])
def test_a_rank_running_ahead_starts_the_next_launch_safely(rows):
    """One rank is scheduled 50 times as often: it runs stages ahead, finishes launches first and
    starts the next while the others are in the previous one (pushing into their other half);
    it never gets two launches ahead, and nobody reads a word of another launch."""
    lay = K2Layout(8, 4, 1024, rows)
    world = World(lay, _steps(random.Random(1), rows, 5), seed=3, ahead=5, lag=CTAS - 1)
    world.run()
    assert not world.stale, world.stale[:3]
    assert world.max_lead == 1


@pytest.mark.parametrize("rows", [2, 64])
def test_the_epoch_wraps_past_the_int32_maximum(rows):
    lay = K2Layout(8, 128, 8192, rows)
    world = World(lay, [rows, 1, rows, rows], seed=7, epoch=(1 << 31) - 3, ahead=2)
    world.run()
    assert not world.stale, world.stale[:3]
    assert all(r.words[EPOCH_WORD] == -(1 << 31) + 1 == wrap((1 << 31) - 3 + 4, 32) for r in world.ranks)


def test_a_narrow_tag_wraps_many_times_and_stays_safe():
    """With 3-bit tags (8 values) the tags wrap every 8 launches: every unit and flag being
    rewritten every launch of its half (pad rows included) keeps every read current."""
    lay = K2Layout(8, 4, 1024, 32)
    ms = [32] + [1] * 10 + [32, 17]
    world = World(lay, ms, seed=11, tag_bits=3, ahead=0)
    world.run()
    assert not world.stale, world.stale[:3]


def test_an_area_that_was_never_zeroed_traps():
    lay = K2Layout(8, 4, 1024, 4)
    world = World(lay, [4], seed=0)
    rng = random.Random(0)
    for rank in world.ranks:  # every rank's area dirty: the same garbage epoch, dirty counters
        rank.words[1:] = [rng.randrange(1, 1 << 20) for _ in rank.words[1:]]
    with pytest.raises(Trapped):
        world.run()


# -- the model catches a broken protocol ------------------------------------------------

def test_without_the_parity_halves_a_rank_ahead_overwrites_what_a_peer_still_reads():
    """One half for every launch: the rank ahead pushes launch n + 1's pairs over launch n's
    before a slower rank read them, which then waits forever for a tag that is gone."""
    lay = K2Layout(8, 4, 1024, 4)
    outcomes = set()
    for seed in range(3):
        world = World(lay, [4, 4, 4], seed=seed, ahead=seed, parity=False)
        try:
            world.run()
            outcomes.add("stale" if world.stale else "clean")
        except Deadlock:
            outcomes.add("deadlock")
    assert "deadlock" in outcomes


def _mutated(lay: K2Layout, stage: int, **change) -> K2Layout:
    return replace(lay, schedule=tuple(replace(s, **change) if s.number == stage else s for s in lay.schedule))


WRONG_TABLES = {  # name: (stage, its wrong fields, the lagging CTA whose task the wait misses)
    "S2 waits on nothing": (2, {"waits": ()}, lambda lay: 1),
    "S3 misses a row's last chunk": (3, {"waits": (Wait(2, lambda lay, task, m, data: (
        (lay.s3_task(task)[0] * lay.head_tiles + lay.s3_task(task)[1] // HEAD_TILE) * lay.chunks, lay.chunks - 1)),)},
        lambda lay: lay.chunks - 1),
    "S4 waits for one row fewer": (4, {"waits": (Wait(3, lambda lay, task, m, data: (
        (task // WOA_PARTS * TILE_N // O_LORA * WOA_PARTS + task % WOA_PARTS) * lay.rows * 4, 4 * (m - 1))),)},
        lambda lay: 4),
    "S5 misses the last wo_a flag": (5, {"waits": (Wait(4, lambda lay, row, m, data: (0, lay.tasks(4) - 1)),)},
                                     lambda lay: (lay.tasks(4) - 1) % CTAS),
    "S6 waits on nothing": (6, {"waits": ()}, lambda lay: 0),
    "S8 waits on nothing": (8, {"waits": ()}, lambda lay: 1),
}


@pytest.mark.parametrize("wrong", sorted(WRONG_TABLES))
def test_a_table_with_a_wait_missing_or_short_reads_a_stale_word(wrong):
    """A schedule table whose wait misses a task, that task's CTA lagging: the consumer starts
    its work before that task of its launch has published and reads the previous launch's data."""
    stage, change, lag = WRONG_TABLES[wrong]
    lay = _mutated(K2Layout(8, 4, 1024, 2), stage, **change)
    world = World(lay, [2, 2], seed=0, lag=lag(lay))
    world.run()
    assert world.stale, f"{wrong}: the model saw no stale read"


def test_the_right_table_with_the_same_laggards_reads_nothing_stale():
    lay = K2Layout(8, 4, 1024, 2)
    for lag in sorted({lag(lay) for _, _, lag in WRONG_TABLES.values()}):
        world = World(lay, [2, 2], seed=0, lag=lag)
        world.run()
        assert not world.stale, (lag, world.stale[:3])


def test_pad_groups_without_their_pushes_read_a_wrapped_tag():
    """Two hops with the owner's pushes for row groups past m left out: after 8 launches of one
    row (3-bit tags), a row group's AG unit still holds a tag that has come round again."""
    def lazy(lay: K2Layout, cta: int, m: int, rank: int) -> list:
        return [s for s in lay.program(cta, m, rank)
                if not (s[0] == "push" and s[2] == "ag" and lay.s7_task(s[3])[0] * SEAM_GROUP >= m)]

    lay = K2Layout(8, 4, 1024, 32)
    world = World(lay, [32] + [1] * 7 + [32], seed=5, tag_bits=3, program=lazy)
    world.run()
    assert any(region == "ag" for region, *_ in world.stale)


def test_ranks_whose_epochs_disagree_deadlock():
    """One rank's area re-created (epoch 0) while the others are at 40: its tags never match the
    pushes it awaits, and it never reaches leave (where K1's dirty-area trap sits): without a
    bound on the peer waits the group hangs; with one it traps. The runner must create and drop
    the ranks' K2 areas together."""
    lay = K2Layout(8, 4, 1024, 4)
    world = World(lay, [4], seed=0, epochs=[40] * 7 + [0])
    with pytest.raises(Deadlock):
        world.run()
    with pytest.raises(Trapped):
        World(lay, [4], seed=0, epochs=[40] * 7 + [0], wait_limit=WAIT_LIMIT).run()


# -- a late rank and the time-bounded peer wait -----------------------------------------------

WAIT_LIMIT = 200_000  # model steps (two launches of 4 or of 32 rows on 8 ranks take 93 k and 56 k)


@pytest.mark.parametrize("rows", [4, 32])  # one hop, two hops
def test_a_rank_late_within_the_wait_limit_is_waited_for(rows):
    """Rank 3 starts its launches three quarters of the limit late (vLLM's host work before K2
    ran long on it): the others' peer waits hold that long and the launches finish clean."""
    lay = K2Layout(8, 4, 1024, rows)
    world = World(lay, [rows, 1], seed=rows, wait_limit=WAIT_LIMIT, late={3: 3 * WAIT_LIMIT // 4})
    world.run()
    assert not world.stale, world.stale[:3]
    assert all(r.words[EPOCH_WORD] == 2 for r in world.ranks)


@pytest.mark.parametrize("rows", [4, 32])
def test_a_rank_late_past_the_wait_limit_traps_the_others(rows):
    """Rank 3 starts later than the limit: the ranks waiting on its pushes trap (the step fails)
    instead of hanging; without the bound they would wait for it."""
    lay = K2Layout(8, 4, 1024, rows)
    with pytest.raises(Trapped) as trapped:
        World(lay, [rows], seed=rows, wait_limit=WAIT_LIMIT, late={3: 2 * WAIT_LIMIT}).run()
    assert trapped.value.args[0] != 3
    world = World(lay, [rows], seed=rows, late={3: 2 * WAIT_LIMIT})
    world.run()
    assert not world.stale, world.stale[:3]
