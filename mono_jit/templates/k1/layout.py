"""K1's stage decomposition, sync words and scratch offsets, as plain numbers of a spec.

Pure Python (no FlyDSL, no torch): the kernel, the runner that allocates K1's buffers and the
tests all read the same figures from here.

Stages (CTA b runs tasks b, b + 256, ...). SCHEDULE below is the one statement of their order,
task counts, waits, publishes and scratch regions: the kernel's stage loops, the sync words, the
scratch offsets, the protocol model (`program`) and the stage-subset builds all follow it
(templates/schedule.py, templates/stage_loop.py).

  S1 fold + mix partials  task = (row group of 16, column chunk of 128): 56 x groups tasks.
                          512 threads = 4 streams x 128 columns; each thread keeps its 24
                          hc_fn weights in registers across the group's rows, so hc_fn is
                          read once per group, not once per row.
  S2 seam                 task = row: sum the 56 partials, gate (sigmoid, softmax + Sinkhorn),
                          collapse, attn_norm, MXFP8 quantisation of the normed row.
  S3 fused_wqa_wkv GEMV   task = (one 16-row N tile of the 2048 outputs, K half): 256 tasks, so
                          every CU streams 1/256 of the 14.7 MB weight; the 8 waves split the
                          half's 28 K steps and reduce through LDS; S4 adds the two halves.
  S4 norms + KV insert    task = row: q_norm (+ MXFP8 of qr for S5), kv_norm, RoPE, UE8M0 record.
  S5 wq_b GEMV            task = two 16-row N tiles (4 waves each, K = 12 steps split 3 ways);
                          at TP8 that is 8192 / 32 = 256 tasks, one per CTA.
  S6 q heads              task = (row, 8 heads): one wave per head: RMS, RoPE, bf16 store.

Hand-offs are flags at device scope tagged with the step's epoch + 1 (see kernel.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from ...deepseek_v4 import HEAD_DIM, HIDDEN, KV_LORA, Q_LORA, per_rank
from ...hsaco.resources import LDS_PER_CU
from ...spec import Spec
from .. import schedule as sched, seam_layout
from ..geometry import (LDS_ACC_WORDS, LDS_GATE_WORDS, LDS_RED_WORDS, MX_BLOCK, PARTIALS, SEAM_CHUNKS, TILE_K,
                        TILE_N, WAVES)

QKV = Q_LORA + KV_LORA  # fused_wqa_wkv outputs
S3_TILES = QKV // TILE_N  # 128
S3_PARTS = 2
S3_PART_STEPS = HIDDEN // TILE_K // S3_PARTS  # 28
HEADS_PER_TASK = WAVES  # S6: one wave per head

# LDS: the shared block-reduction, gate and split-K areas (geometry.py).
STATIC_LDS_BYTES = 4 * (LDS_RED_WORDS + LDS_GATE_WORDS + LDS_ACC_WORDS)
# Unused dynamic LDS that takes a CTA past half of a CU's 160 KiB, so no CU can hold two K1
# CTAs and the 256 CTAs land one per CU (MI355X: 256 CUs). The runner launches with it (meta's
# launch.dynamic_lds).
PIN_LDS_BYTES = LDS_PER_CU // 2 + 64 - STATIC_LDS_BYTES


# -- the schedule: stages in launch order (every stage waits only on flags of a stage before it,
# so with all 256 CTAs resident nothing can deadlock) -------------------------------------------

def _s6_row(lay: K1Layout, task):
    return task // lay.head_groups


def _s6_awaits(lay: K1Layout, task, m, data):
    """The S5 tasks of the task's 8 heads."""
    first_head = (task % lay.head_groups) * HEADS_PER_TASK
    return first_head * lay.s5_tasks_per_head, HEADS_PER_TASK * lay.s5_tasks_per_head


def _row(lay: K1Layout, task):
    return task


SCHEDULE: tuple[sched.Stage, ...] = (
    sched.Stage(1, "fold + mix partials", tasks=seam_layout.fold_tasks, writes=("partials",)),
    sched.Stage(2, "seam", tasks=lambda lay: lay.rows, row_of=_row,
                   waits=(sched.Wait(1, seam_layout.gate_awaits),),
                   reads=("partials",), writes=("x_codes", "x_scales")),
    sched.Stage(3, "fused_wqa_wkv GEMV", tasks=lambda lay: S3_TILES * S3_PARTS,
                   waits=(sched.Wait(2, sched.rows_below_m),), reads=("x_codes", "x_scales"),
                   writes=("qkv_raw",)),
    sched.Stage(4, "norms + KV insert", tasks=lambda lay: lay.rows, row_of=_row,
                   waits=(sched.Wait(3, lambda lay, row, m, data: (0, lay.tasks(3))),), reads=("qkv_raw",),
                   writes=("qr_codes", "qr_scales")),
    sched.Stage(5, "wq_b GEMV", tasks=lambda lay: lay.q_width // (2 * TILE_N),
                   waits=(sched.Wait(4, sched.rows_below_m),), reads=("qr_codes", "qr_scales"),
                   writes=("q_raw",)),
    sched.Stage(6, "q heads", tasks=lambda lay: lay.rows * lay.head_groups, row_of=_s6_row,
                   waits=(sched.Wait(5, _s6_awaits),), publishes=False, reads=("q_raw",)),
)

F32_REGIONS: tuple[sched.Region, ...] = (
    sched.Region("partials", lambda lay: lay.rows * SEAM_CHUNKS * PARTIALS, "[rows, 56, 25] S1 mix partials"),
    sched.Region("qkv_raw", lambda lay: S3_PARTS * lay.rows * QKV,
                    "[2 K halves, rows, 2048] S3 output before its bf16 rounding"),
    sched.Region("q_raw", lambda lay: lay.rows * lay.q_width, "[rows, q_width] S5 output"),
)

# The GEMVs' MXFP8 operands, one row per token of the MFMA's B operand.
BYTE_REGIONS: tuple[sched.Region, ...] = (
    sched.Region("x_codes", lambda lay: lay.operand_rows * HIDDEN, "[operand_rows, 7168] e4m3 of the normed row"),
    sched.Region("x_scales", lambda lay: lay.operand_rows * (HIDDEN // MX_BLOCK), "[operand_rows, 224] its E8M0 codes"),
    sched.Region("qr_codes", lambda lay: lay.operand_rows * Q_LORA, "[operand_rows, 1536] e4m3 of the normed qr"),
    sched.Region("qr_scales", lambda lay: lay.operand_rows * (Q_LORA // MX_BLOCK), "[operand_rows, 48]"),
)


@dataclass(frozen=True)
class K1Layout(sched.ScheduledLayout):
    """Every width, task count and offset of one K1 build (the accessors over the schedule and
    the scratch tables: sched.ScheduledLayout)."""

    tp: int
    rows: int  # max_tokens: the bucket
    schedule: tuple[sched.Stage, ...] = field(default=SCHEDULE, repr=False)  # what the kernel runs
    f32_regions: ClassVar[tuple[sched.Region, ...]] = F32_REGIONS
    byte_regions: ClassVar[tuple[sched.Region, ...]] = BYTE_REGIONS

    @classmethod
    def of(cls, spec: Spec) -> "K1Layout":
        return cls(tp=spec.tp, rows=spec.max_tokens)

    # -- widths ------------------------------------------------------------------------
    @property
    def heads(self) -> int:
        return per_rank(self.tp).heads

    @property
    def q_width(self) -> int:
        return self.heads * HEAD_DIM

    # -- task tables (the schedule's) -------------------------------------------------------
    @property
    def s5_tasks_per_head(self) -> int:
        return HEAD_DIM // (2 * TILE_N)  # 16

    @property
    def head_groups(self) -> int:
        return math.ceil(self.heads / HEADS_PER_TASK)

    # -- f32 scratch (F32_REGIONS, packed in order) ------------------------------------------
    @property
    def partials(self) -> int:
        return self._f32("partials")

    @property
    def qkv_raw(self) -> int:
        return self._f32("qkv_raw")

    @property
    def q_raw(self) -> int:
        return self._f32("q_raw")

    @property
    def f32_words(self) -> int:
        return self._f32("end")

    # -- byte scratch: the GEMVs' MXFP8 operands, one row per token of the MFMA's B operand ----
    @property
    def x_codes(self) -> int:
        return self._byte("x_codes")

    @property
    def x_scales(self) -> int:
        return self._byte("x_scales")

    @property
    def qr_codes(self) -> int:
        return self._byte("qr_codes")

    @property
    def qr_scales(self) -> int:
        return self._byte("qr_scales")

    @property
    def bytes(self) -> int:
        return self._byte("end")
