"""A persistent kernel's stage loop, generated from its schedule table (FlyDSL; kernel modules only).

K1 and K2 run every stage through `run_stage`: the stage's `Stage` record (schedule.py) gives
the task count, the row guard, the waits, whether a task publishes a flag and whether the stage
pushes; the kernel gives only what a task does (`StageWork`). So the loops the GPU runs are the
ones the protocol model (`schedule.program`) steps through, and a stage-subset build keeps the
waits whose producer it holds (`Stage.waits_kept`).

The frame `k` a stage's work reads is a namespace of the kernel's arguments, views and lane
indices; `run_stage` reads from it `lay`, `Sync`, `tag`, `tid`, `cta`, `m` and `data` (the
`schedule.Lookup` a wait that depends on the launch's data reads through).
"""

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, cast

import flydsl.expr as fx
from flydsl.expr import const_expr, gpu

from ._dsl import dsl
from .geometry import CTAS, LDS_ACC_WORDS, LDS_GATE_WORDS, LDS_RED_WORDS, WAVE
from .schedule import NO_DATA, Stage, Wait, awaited
from .sync_device import arrive, publish, step_tag, wait


class Frame(SimpleNamespace):
    """The values a kernel's stages read: its arguments, LDS and scratch views, lane indices and
    layout (`lay`). The kernel builds one; a stage's setup may make a copy with its own."""

    def but(self, **changes: Any) -> "Frame":
        """A copy with `changes`."""
        return Frame(**{**vars(self), **changes})


def enter(lay: Any, Sync, m, shared_struct: type) -> Frame:
    """The frame a persistent kernel starts from, as the CTA arrives on `Sync`: `lay`, `Sync`, `m`
    clamped to the bucket (a bad m must not write past it or wait on other flags), this thread's
    `tid`, `lane`, `wave` and `cta`, the kernel's LDS (`shared`, a `shared_struct` whose first
    fields are the `red`, `gate` and `acc` arrays every kernel's stages share, viewed as `red`,
    `gate` and `lds_acc`), this launch's `tag` and no launch data."""
    m = fx.min(fx.max(m, 0), lay.rows)
    tid = fx.thread_idx.x
    lane = tid % WAVE
    wave = tid // WAVE
    cta = fx.block_idx.x
    shared = fx.SharedAllocator().allocate(shared_struct).peek()
    red = shared.red.view(fx.make_layout(LDS_RED_WORDS, 1))
    gate = shared.gate.view(fx.make_layout(LDS_GATE_WORDS, 1))
    lds_acc = shared.acc.view(fx.make_layout(LDS_ACC_WORDS, 1))
    tag = step_tag(Sync)
    arrive(Sync, tid)
    return Frame(lay=lay, Sync=Sync, m=m, tid=tid, lane=lane, wave=wave, cta=cta, shared=shared, red=red, gate=gate,
                 lds_acc=lds_acc, tag=tag, data=NO_DATA)


def _same_frame(k: Frame) -> Frame:
    return k


@dataclass(frozen=True)
class StageWork:
    """What a stage's tasks do: `task(k, task, row)` for each task that runs (`row` is the task's
    row where the kernel skips tasks by row, `Stage.guards_tasks`, else None), with `k` the frame
    `setup` made once for the stage before its loop (its own lane indices, views and weights; by
    default the kernel's frame)."""

    task: Callable[[Frame, Any, Any], None]
    setup: Callable[[Frame], Frame] = _same_frame


def await_producers(k: Frame, waits: tuple[Wait, ...], task) -> None:
    """A task's `waits`, in order: block the CTA until each one's flags carry this launch's tag."""
    for w in waits:
        first, count, *stride = awaited(k.lay, w, task, k.m, k.data)
        wait(k.Sync, first, count, k.tag, k.tid, *stride)


def hand_off(k: Frame, stage: Stage, task) -> None:
    """What follows a task: its flag (in a stage of one task in every build, the stage's one
    flag); in a stage that publishes none, the CTA barrier, unless the stage pushes (the work's
    pushes are its hand-off)."""
    if stage.publishes:
        flag = k.lay.flag_base(stage.number)
        publish(k.Sync, flag if stage.one_task else flag + task, k.tag, k.tid)
    elif stage.pushes is None:
        gpu.barrier()


@dsl
def run_stage(k: Frame, stage: Stage, stages: frozenset[int], work: StageWork) -> Frame:
    """One stage's loop over this CTA's tasks, as its record states it, in a build holding
    `stages`: a task whose row is below m (every task of a stage without rows, or that pushes)
    waits for the flags of its producers this build holds and works; then it hands off
    (`hand_off`). Returns the stage's frame (its setup's).

    (The loop body calls no method of a local: FlyDSL would carry that local through the loop.)"""
    k = work.setup(k)
    run, waits, guarded = work.task, stage.waits_kept(stages), stage.guards_tasks
    row_of = cast(Callable[[Any, Any], Any], stage.row_of)  # not None where guarded
    for task in range(k.cta, stage.count(k.lay), CTAS):
        if const_expr(guarded):
            row = row_of(k.lay, task)
            if row < k.m:
                await_producers(k, waits, task)
                run(k, task, row)
        else:
            await_producers(k, waits, task)
            run(k, task, None)
        hand_off(k, stage, task)
    return k
