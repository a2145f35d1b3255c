"""A persistent kernel's stage schedule as data, and what follows from it (pure Python).

A schedule is a tuple of `Stage`s in launch order. Each names its task count, the stages whose
flags it waits on and which of them, whether its tasks are rows that do nothing past the
runtime m, whether it publishes a flag per task, and the scratch regions it reads and writes.
Which flags a wait covers may depend on what an earlier stage wrote in this launch (K2's routed
stages wait on the tasks of the experts the step chose): such a wait reads those words through a
`Lookup`, which the kernel answers with loads of its scratch and the model with the step's ints.
From that one table come the sync area's flag offsets (`flag_bases`), the scratch offsets
(`region_offsets`), every CTA's sequence of hand-offs (`program`, which the protocol tests run
on a model of the grid) and the kernels' stage loops themselves (stage_loop.run_stage runs
every stage of K1 and K2 from its record), so what the tests check is what the GPU runs.
`ScheduledLayout` is the layouts' one set of accessors over these (tasks, flag bases, waits,
program, scratch offsets).

A stage-subset build (a standalone launch of some stages, for testing a stage alone) keeps a
stage's wait only when the producer is in the subset (`Wait.on`). `hand_off_errors` checks
the table's scratch regions against its waits: a stage reads only what a stage it waits on
(directly or through that stage's own waits) wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, ClassVar, Mapping, Protocol, Sequence

from .geometry import CTAS, TILE_N
from .sync_words import FIRST_FLAG

Layout = Any  # the template's layout object; the table's functions take it as their first argument


class Lookup(Protocol):
    """What earlier stages of this launch wrote, for a wait that depends on it, with the two
    operations such a wait computes with: the kernel's answers are DSL values (loads of its i32
    scratch), the model's ints."""

    def read(self, region: str, index: Any) -> Any:
        """Word `index` of i32 scratch region `region`."""

    def select(self, cond: Any, a: Any, b: Any) -> Any:
        """a where cond holds, else b."""

    def max(self, a: Any, b: Any) -> Any:
        """The larger of a and b."""


@dataclass(frozen=True)
class Words:
    """A `Lookup` over ints: each region's words as the step wrote them (the protocol model's)."""

    regions: Mapping[str, Sequence[int]]

    def read(self, region: str, index: int) -> int:
        return self.regions[region][index]

    @staticmethod
    def select(cond: bool, a: int, b: int) -> int:
        return a if cond else b

    @staticmethod
    def max(a: int, b: int) -> int:
        return a if a >= b else b


NO_DATA = Words({})  # a launch's data where no wait depends on it


@dataclass(frozen=True)
class Region:
    """A scratch region: `size(lay)` words (or bytes) of the named work buffer, starting on a
    multiple of `align` of them."""

    name: str
    size: Callable[[Layout], int]
    doc: str
    align: int = 1


@dataclass(frozen=True)
class Wait:
    """A wait on stage `on`'s flags: `flags(lay, task, m, data)` gives (first, count) or (first,
    count, stride), counted from `on`'s first flag; `data` (a `Lookup`) reads what earlier stages
    wrote in this launch, for a wait that depends on it. Plain arithmetic, so the kernel traces it
    on DSL values and the model runs it on ints."""

    on: int
    flags: Callable[[Layout, Any, Any, Lookup], tuple]


def rows_below_m(lay: Layout, task, m, data: Lookup) -> tuple:
    """A wait's flags on a stage whose tasks are rows: those of the rows below m."""
    return 0, m


@dataclass(frozen=True)
class Stage:
    """One stage of a persistent launch: CTA b runs its tasks b, b + CTAS, ...

    - `tasks`: how many tasks (and, if it publishes, flags) the stage has, a function of the
      layout or, for a stage of one task in every build, the number 1 (`count`);
    - `waits`: the `Wait`s of a live task, in order (on earlier stages' flags, some of them
      depending on what an earlier stage wrote in this launch);
    - `row_of(lay, task)`: the token row of a task that is skipped (no wait, no work) when the
      row is at or past m, or None when every task runs;
    - `publishes`: a flag per task after its work; a stage that publishes none meets the CTA
      barrier after each task, unless it pushes (its pushes are the hand-off);
    - `peer_awaits(lay, task, rank)`: (region, first unit, count)s of its own peer buffer a live
      task polls before its work; `pushes(lay, task, rank)`: (peer, region, unit)s every task
      stores into the peers' buffers after it (the cross-rank hand-offs of a TP launch). The
      pushes carry the task's rows (zeros past m), so the kernel runs a pushing stage's work for
      every task, and the work skips the rest of a row past m itself (`guards_tasks`); a pushing
      stage with rows therefore waits on no flag (its tasks past m could not skip the wait);
    - `reads` / `writes`: the scratch regions it hands over.
    """

    number: int
    name: str
    tasks: Callable[[Layout], int] | int
    waits: tuple[Wait, ...] = ()
    row_of: Callable[[Layout, Any], Any] | None = None
    publishes: bool = True
    peer_awaits: Callable[[Layout, int, int], list[tuple]] | None = None
    pushes: Callable[[Layout, int, int], list[tuple]] | None = None
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.pushes is not None and self.row_of is not None and self.waits:
            raise ValueError(f"S{self.number} pushes for every task, so its tasks past m cannot skip their waits")

    def count(self, lay: Layout) -> int:
        """The stage's tasks in `lay`'s build."""
        return self.tasks if isinstance(self.tasks, int) else self.tasks(lay)

    @property
    def one_task(self) -> bool:
        """Whether the stage has one task in every build: its task is 0 and publishes the
        stage's first flag (the kernel adds no task index)."""
        return self.tasks == 1

    @property
    def guards_tasks(self) -> bool:
        """Whether the kernel skips a task (its waits and work) whose row is at or past m: a
        stage with rows that does not push."""
        return self.row_of is not None and self.pushes is None

    def waits_kept(self, stages: frozenset[int]) -> tuple[Wait, ...]:
        """The waits a build holding `stages` keeps: those whose producer is among them."""
        return tuple(w for w in self.waits if w.on in stages)


def peer_stages(schedule: tuple[Stage, ...]) -> frozenset[int]:
    """The stages that push to or poll the peer buffers."""
    return frozenset(s.number for s in schedule if s.pushes is not None or s.peer_awaits is not None)


def hand_off_errors(schedule: tuple[Stage, ...], regions: tuple[Region, ...]) -> list[str]:
    """What is wrong with the table's scratch hand-offs: a name that is no region, a region read
    by a stage that waits neither on the stage that last wrote it nor on a stage that waited on
    it in turn (or that nothing wrote before it), a region nothing writes. A wait on a stage
    orders its reader after everything that stage waited on (release / acquire chains), so a
    routed stage may read the router's words through the union it waits on."""
    names, errors = {r.name for r in regions}, []
    writer: dict[str, int] = {}
    before: dict[int, set[int]] = {}  # stage -> the stages it waits on, directly or in turn
    for s in schedule:
        ons = [w.on for w in s.waits]
        before[s.number] = set(ons).union(*(before.get(on, set()) for on in ons))
        waited = " and ".join(map(str, ons)) or "None"
        errors += [f"S{s.number}: {n} is no region" for n in (*s.reads, *s.writes) if n not in names]
        errors += [f"S{s.number} reads {n} but waits on {waited}, not its writer {writer.get(n)}"
                   for n in s.reads if writer.get(n) not in before[s.number]]
        writer.update({n: s.number for n in s.writes})
    return errors + [f"{n} is written by no stage" for n in sorted(names - set(writer))]


def stage(schedule: tuple[Stage, ...], number: int) -> Stage:
    (found,) = [s for s in schedule if s.number == number]
    return found


def flag_bases(schedule: tuple[Stage, ...], lay: Layout) -> dict[int, int]:
    """The first sync word of each publishing stage's flags (after the epoch and counters), and
    under key 0 the area's total words."""
    bases, word = {}, FIRST_FLAG
    for s in schedule:
        if s.publishes:
            bases[s.number] = word
            word += s.count(lay)
    bases[0] = word
    return bases


def region_offsets(regions: tuple[Region, ...], lay: Layout, align: int = 1) -> dict[str, int]:
    """Each region's first word, packed in table order from a multiple of its own `align`, each
    region's end rounded up to `align`; under "end" the buffer's size."""
    offsets, at = {}, 0
    for region in regions:
        at = -(-at // region.align) * region.align
        offsets[region.name] = at
        at = -(-(at + region.size(lay)) // align) * align
    offsets["end"] = at
    return offsets


def awaited(lay: Layout, w: Wait, task, m, data: Lookup = NO_DATA) -> tuple:
    """(first sync word, count[, stride]) of wait `w` of a task; `data` answers the words a wait
    that depends on the launch's data reads."""
    first, *rest = w.flags(lay, task, m, data)
    return (lay.flag_base(w.on) + first, *rest)


def program(schedule: tuple[Stage, ...], lay: Layout, cta: int, ctas: int, m: int, rank: int = 0,
            data: Lookup = NO_DATA) -> list[tuple]:
    """CTA `cta`'s steps in one launch with m rows on `rank` whose stages wrote `data` (for the
    waits that depend on it), in the kernel's order: ("wait", first word, count[, stride]),
    ("await_peers", region, first unit, count), ("run", stage, task) where the task does its
    work, ("push", peer, region, unit), ("publish", flag word, 1)."""
    steps: list[tuple] = []
    for s in schedule:
        for task in range(cta, s.count(lay), ctas):
            if s.row_of is None or s.row_of(lay, task) < m:
                steps += [("wait", *awaited(lay, w, task, m, data)) for w in s.waits]
                if s.peer_awaits is not None:
                    steps += [("await_peers", *a) for a in s.peer_awaits(lay, task, rank)]
                steps.append(("run", s.number, task))
            if s.pushes is not None:
                steps += [("push", *p) for p in s.pushes(lay, task, rank)]
            if s.publishes:
                steps.append(("publish", lay.flag_base(s.number) + task, 1))
    return steps


class ScheduledLayout:
    """The accessors every layout derives from its schedule table and its scratch region tables
    (one implementation for K1's and K2's layouts, which inherit it as a mixin of their frozen
    dataclasses). Flag bases and region offsets are computed once per instance: the protocol
    tests and the kernel's trace ask for them per task."""

    schedule: tuple[Stage, ...]
    rows: int  # the bucket's token rows
    # the scratch regions, each table packed in order; the byte table's ends rounded to byte_align
    f32_regions: ClassVar[tuple[Region, ...]] = ()
    i32_regions: ClassVar[tuple[Region, ...]] = ()
    byte_regions: ClassVar[tuple[Region, ...]] = ()
    byte_align: ClassVar[int] = 1

    def tasks(self, number: int) -> int:
        return stage(self.schedule, number).count(self)

    @property
    def row_tiles(self) -> int:
        """16-token column blocks of the MFMA B operand."""
        return -(-self.rows // TILE_N)

    @property
    def operand_rows(self) -> int:
        """Token rows a GEMV's B operand reads: whole 16-token tiles. Rows past `rows` are never
        written (their products reach only output columns that are never stored), but they are
        allocated, so a bucket of 1 reads 16 rows inside the buffer."""
        return self.row_tiles * TILE_N

    # -- sync words (int32): epoch, exit and arrival counters, then a flag per producer task --
    @cached_property
    def _flag_bases(self) -> dict[int, int]:
        return flag_bases(self.schedule, self)

    def flag_base(self, number: int) -> int:
        """The sync word of stage `number`'s first task flag."""
        return self._flag_bases[number]

    @property
    def sync_words(self) -> int:
        return self._flag_bases[0]

    def awaits(self, number: int, task, m):
        """(first flag, count) a task of stage `number` waits for first in a launch of m rows."""
        s = stage(self.schedule, number)
        if not s.waits:
            raise ValueError(f"S{number} waits on no flags")
        return awaited(self, s.waits[0], task, m)

    def waits(self, number: int, task, m, data: Lookup = NO_DATA) -> list[tuple]:
        """(first flag, count[, stride]) of each wait of a task of stage `number`, in order; `data`
        answers the words a wait that depends on the launch's data reads."""
        return [awaited(self, w, task, m, data) for w in stage(self.schedule, number).waits]

    def row_of(self, number: int, task):
        """The row whose place past m skips a task of stage `number` (its wait and its work), or
        None when none is skipped."""
        row_of = stage(self.schedule, number).row_of
        return None if row_of is None else row_of(self, task)

    def program(self, cta: int, m: int, rank: int = 0) -> list[tuple]:
        """CTA `cta`'s hand-offs on `rank` in one launch of m rows, in the order the kernel's
        stage loops run them (both from self.schedule; `program` above lists the steps)."""
        return program(self.schedule, self, cta, CTAS, m, rank)

    # -- scratch offsets (words of the f32 and i32 regions, bytes of the byte regions) --------
    @cached_property
    def _f32_offsets(self) -> dict[str, int]:
        return region_offsets(self.f32_regions, self)

    @cached_property
    def _i32_offsets(self) -> dict[str, int]:
        return region_offsets(self.i32_regions, self)

    @cached_property
    def _byte_offsets(self) -> dict[str, int]:
        return region_offsets(self.byte_regions, self, self.byte_align)

    def _f32(self, name: str) -> int:
        return self._f32_offsets[name]

    def _i32(self, name: str) -> int:
        return self._i32_offsets[name]

    def _byte(self, name: str) -> int:
        return self._byte_offsets[name]
