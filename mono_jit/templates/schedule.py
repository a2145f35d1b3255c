"""A persistent kernel's stage schedule as data, and what follows from it (pure Python).

A schedule is a tuple of `Stage`s in launch order. Each names its task count, the stage whose
flags it waits on and which of them, whether its tasks are rows that do nothing past the
runtime m, whether it publishes a flag per task, and the scratch regions it reads and writes.
From that one table come the sync area's flag offsets (`flag_bases`), the scratch offsets
(`region_offsets`), every CTA's sequence of hand-offs (`program`, which the protocol tests run
on a model of the grid) and, in the kernel module, the stage loops themselves, so what the
tests check is what the GPU runs.

A stage-subset build (a standalone launch of some stages, for testing a stage alone) keeps a
stage's wait only when the producer is in the subset (`waits_in`). `hand_off_errors` checks
the table's scratch regions against its waits: a stage reads only what the stage it waits on
wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .sync_words import FIRST_FLAG

Layout = Any  # the template's layout object; the table's functions take it as their first argument


@dataclass(frozen=True)
class Region:
    """A scratch region: `size(lay)` words (or bytes) of the named work buffer."""

    name: str
    size: Callable[[Layout], int]
    doc: str


@dataclass(frozen=True)
class Stage:
    """One stage of a persistent launch: CTA b runs its tasks b, b + CTAS, ...

    - `tasks(lay)`: how many tasks (and, if it publishes, flags) the stage has;
    - `waits_on`: the stage whose flags a task waits for, or None;
    - `awaits(lay, task, m)`: (first, count) of those flags, counted from the producer's first
      flag; plain arithmetic, so the kernel traces it on DSL values and the model runs it on ints;
    - `row_of(lay, task)`: the token row of a task that is skipped (no wait, no work) when the
      row is at or past m, or None when every task runs;
    - `publishes`: a flag per task after its work;
    - `peer_awaits(lay, task, rank)`: (region, first unit, count)s of its own peer buffer a live
      task polls before its work; `pushes(lay, task, rank)`: (peer, region, unit)s every task
      stores into the peers' buffers after it (the cross-rank hand-offs of a TP launch);
    - `reads` / `writes`: the scratch regions it hands over.
    """

    number: int
    name: str
    tasks: Callable[[Layout], int]
    waits_on: int | None = None
    awaits: Callable[[Layout, Any, Any], tuple[Any, Any]] | None = None
    row_of: Callable[[Layout, Any], Any] | None = None
    publishes: bool = True
    peer_awaits: Callable[[Layout, int, int], list[tuple]] | None = None
    pushes: Callable[[Layout, int, int], list[tuple]] | None = None
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()

    def waits_in(self, stages: frozenset[int]) -> bool:
        """Whether this stage waits in a build holding `stages` (its producer is among them)."""
        return self.waits_on is not None and self.waits_on in stages


def peer_stages(schedule: tuple[Stage, ...]) -> frozenset[int]:
    """The stages that push to or poll the peer buffers."""
    return frozenset(s.number for s in schedule if s.pushes is not None or s.peer_awaits is not None)


def hand_off_errors(schedule: tuple[Stage, ...], regions: tuple[Region, ...]) -> list[str]:
    """What is wrong with the table's scratch hand-offs: a name that is no region, a region read
    by a stage that does not wait on the stage that last wrote it (or that nothing wrote before
    it), a region nothing writes."""
    names, errors = {r.name for r in regions}, []
    writer: dict[str, int] = {}
    for s in schedule:
        errors += [f"S{s.number}: {n} is no region" for n in (*s.reads, *s.writes) if n not in names]
        errors += [f"S{s.number} reads {n} but waits on {s.waits_on}, not its writer {writer.get(n)}"
                   for n in s.reads if writer.get(n) is None or writer[n] != s.waits_on]
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
            word += s.tasks(lay)
    bases[0] = word
    return bases


def region_offsets(regions: tuple[Region, ...], lay: Layout, align: int = 1) -> dict[str, int]:
    """Each region's first word, packed in table order, each region's end rounded up to `align`;
    under "end" the buffer's size."""
    offsets, at = {}, 0
    for region in regions:
        offsets[region.name] = at
        at = -(-(at + region.size(lay)) // align) * align
    offsets["end"] = at
    return offsets


def awaited_flags(lay: Layout, s: Stage, task, m):
    """(first sync word, count) a task of stage `s` waits for."""
    if s.awaits is None:
        raise ValueError(f"S{s.number} waits on no flags")
    first, count = s.awaits(lay, task, m)
    return lay.flag_base(s.waits_on) + first, count


def program(schedule: tuple[Stage, ...], lay: Layout, cta: int, ctas: int, m: int, rank: int = 0) -> list[tuple]:
    """CTA `cta`'s steps in one launch with m rows on `rank`, in the kernel's order: ("wait",
    first word, count), ("await_peers", region, first unit, count), ("run", stage, task) where
    the task does its work, ("push", peer, region, unit), ("publish", flag word, 1)."""
    steps: list[tuple] = []
    for s in schedule:
        for task in range(cta, s.tasks(lay), ctas):
            if s.row_of is None or s.row_of(lay, task) < m:
                if s.waits_on is not None:
                    steps.append(("wait", *awaited_flags(lay, s, task, m)))
                if s.peer_awaits is not None:
                    steps += [("await_peers", *a) for a in s.peer_awaits(lay, task, rank)]
                steps.append(("run", s.number, task))
            if s.pushes is not None:
                steps += [("push", *p) for p in s.pushes(lay, task, rank)]
            if s.publishes:
                steps.append(("publish", lay.flag_base(s.number) + task, 1))
    return steps
