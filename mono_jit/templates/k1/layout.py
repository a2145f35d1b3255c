"""K1's stage decomposition, sync words and scratch offsets, as plain numbers of a spec.

Pure Python (no FlyDSL, no torch): the kernel, the runner that allocates K1's buffers and the
tests all read the same figures from here.

Stages and their task tables (CTA b runs tasks b, b + 256, ...; every stage waits only on flags
of the stages before it, so with all 256 CTAs resident nothing can deadlock):

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
from dataclasses import dataclass

from ... import model
from ...resources import LDS_PER_CU
from ...spec import Spec
from ..sync_area import FIRST_FLAG

CTAS = 256
THREADS = 512
WAVES = THREADS // 64
STREAMS = 4
MIXES = 24  # (2 + 4) x 4: pre, post, comb
PARTIALS = MIXES + 1  # the 24 dot products and the sum of squares
SEAM_CHUNK = 128  # columns per S1 task (x 4 streams = one per thread)
SEAM_CHUNKS = model.HIDDEN // SEAM_CHUNK  # 56
SEAM_GROUP = 16  # rows per S1 task
Q_LORA = 1536
KV_LORA = 512
QKV = Q_LORA + KV_LORA  # fused_wqa_wkv outputs
HEAD_DIM = 512
NOPE = 448
ROPE = 64
MX_BLOCK = 32  # MXFP8: one E8M0 per 32 values
KV_SCALE_BLOCK = 64  # fp8_ds_mla: one UE8M0 per 64 NoPE dims
KV_RECORD = 584
KV_DATA = 576
KV_SCALES = 8
WEIGHT_BLOCK = 128  # checkpoint block scales: 128 x 128
TILE_N = 16  # MFMA 16x16x128: 16 weight rows x 16 tokens per instruction
TILE_K = 128
S3_TILES = QKV // TILE_N  # 128
S3_PARTS = 2
S3_PART_STEPS = model.HIDDEN // TILE_K // S3_PARTS  # 28
HEADS_PER_TASK = WAVES  # S6: one wave per head
EPS = 1e-6

# LDS (f32 words): block-reduction partials (32 slots per wave), the seam gate's 25 sums, and
# the GEMVs' split-K accumulators for up to 64 rows (4 row tiles of 16 x 16 per wave).
RED_SLOTS = 32
LDS_RED_WORDS = WAVES * RED_SLOTS
LDS_GATE_WORDS = 32
LDS_ACC_WORDS = WAVES * (model.MAX_DECODE_TOKENS // TILE_N) * 64 * 4
STATIC_LDS_BYTES = 4 * (LDS_RED_WORDS + LDS_GATE_WORDS + LDS_ACC_WORDS)
# Unused dynamic LDS that takes a CTA past half of a CU's 160 KiB, so no CU can hold two K1
# CTAs and the 256 CTAs land one per CU (MI355X: 256 CUs). The runner launches with it (meta's
# launch.dynamic_lds).
PIN_LDS_BYTES = LDS_PER_CU // 2 + 64 - STATIC_LDS_BYTES


@dataclass(frozen=True)
class K1Layout:
    """Every width, task count and offset of one K1 build."""

    tp: int
    rows: int  # max_tokens: the bucket

    @classmethod
    def of(cls, spec: Spec) -> "K1Layout":
        return cls(tp=spec.tp, rows=spec.max_tokens)

    # -- widths ------------------------------------------------------------------------
    @property
    def heads(self) -> int:
        return model.HEADS // self.tp

    @property
    def q_width(self) -> int:
        return self.heads * HEAD_DIM

    @property
    def row_tiles(self) -> int:
        """16-token column blocks of the MFMA B operand."""
        return math.ceil(self.rows / TILE_N)

    # -- task tables -------------------------------------------------------------------
    @property
    def seam_groups(self) -> int:
        return math.ceil(self.rows / SEAM_GROUP)

    @property
    def s1_tasks(self) -> int:
        return self.seam_groups * SEAM_CHUNKS

    @property
    def s3_tasks(self) -> int:
        return S3_TILES * S3_PARTS

    @property
    def s5_tasks(self) -> int:
        return self.q_width // (2 * TILE_N)

    @property
    def s5_tasks_per_head(self) -> int:
        return HEAD_DIM // (2 * TILE_N)  # 16

    @property
    def head_groups(self) -> int:
        return math.ceil(self.heads / HEADS_PER_TASK)

    @property
    def s6_tasks(self) -> int:
        return self.rows * self.head_groups

    # -- sync words (int32): epoch, exit and arrival counters, then a flag per producer task --
    @property
    def f1(self) -> int:
        return FIRST_FLAG

    @property
    def f2(self) -> int:
        return self.f1 + self.s1_tasks

    @property
    def f3(self) -> int:
        return self.f2 + self.rows

    @property
    def f4(self) -> int:
        return self.f3 + self.s3_tasks

    @property
    def f5(self) -> int:
        return self.f4 + self.rows

    @property
    def sync_words(self) -> int:
        return self.f5 + self.s5_tasks

    # -- what each stage waits for: (first flag, count) ---------------------------------------
    # Plain arithmetic on a row, task or m, so the kernel traces these on its DSL values and the
    # protocol model (tests/test_k1_protocol.py) runs them on ints.
    def s2_awaits(self, row):
        """S1's tasks of the row's group: all its column chunks."""
        return self.f1 + (row // SEAM_GROUP) * SEAM_CHUNKS, SEAM_CHUNKS

    def s3_awaits(self, m):
        """S2's rows below m."""
        return self.f2, m

    def s4_awaits(self):
        """Every S3 task (each row needs all 2048 outputs of both K halves)."""
        return self.f3, self.s3_tasks

    def s5_awaits(self, m):
        """S4's rows below m."""
        return self.f4, m

    def s6_awaits(self, task):
        """The S5 tasks of the task's 8 heads."""
        first_head = (task % self.head_groups) * HEADS_PER_TASK
        return self.f5 + first_head * self.s5_tasks_per_head, HEADS_PER_TASK * self.s5_tasks_per_head

    def s6_row(self, task):
        return task // self.head_groups

    def program(self, cta: int, m: int) -> list[tuple[str, int, int]]:
        """CTA `cta`'s hand-offs in one launch with m rows, in order: ("wait", first, count) and
        ("publish", flag, 1). The kernel's stage loops in the same order (kernel.make_kernel)."""
        steps: list[tuple[str, int, int]] = []
        steps += [("publish", self.f1 + task, 1) for task in range(cta, self.s1_tasks, CTAS)]
        for row in range(cta, self.rows, CTAS):
            steps += [("wait", *self.s2_awaits(row))] if row < m else []
            steps.append(("publish", self.f2 + row, 1))
        for task in range(cta, self.s3_tasks, CTAS):
            steps += [("wait", *self.s3_awaits(m)), ("publish", self.f3 + task, 1)]
        for row in range(cta, self.rows, CTAS):
            steps += [("wait", *self.s4_awaits())] if row < m else []
            steps.append(("publish", self.f4 + row, 1))
        for task in range(cta, self.s5_tasks, CTAS):
            steps += [("wait", *self.s5_awaits(m)), ("publish", self.f5 + task, 1)]
        steps += [("wait", *self.s6_awaits(task)) for task in range(cta, self.s6_tasks, CTAS)
                  if self.s6_row(task) < m]
        return steps

    # -- f32 scratch -------------------------------------------------------------------
    @property
    def partials(self) -> int:
        """[rows, 56, 25] S1 mix partials."""
        return 0

    @property
    def qkv_raw(self) -> int:
        """[2 K halves, rows, 2048] S3 output before its bf16 rounding."""
        return self.partials + self.rows * SEAM_CHUNKS * PARTIALS

    @property
    def q_raw(self) -> int:
        """[rows, q_width] S5 output."""
        return self.qkv_raw + S3_PARTS * self.rows * QKV

    @property
    def f32_words(self) -> int:
        return self.q_raw + self.rows * self.q_width

    # -- byte scratch: the GEMVs' MXFP8 operands, one row per token of the MFMA's B operand ----
    @property
    def operand_rows(self) -> int:
        """Token rows the GEMVs' B operand reads: whole 16-token tiles. Rows past `rows` are never
        written (their products reach only output columns that are never stored), but they are
        allocated, so a bucket of 1 reads 16 rows inside the buffer."""
        return self.row_tiles * TILE_N

    @property
    def x_codes(self) -> int:
        """[operand_rows, 7168] e4m3 of the normed row."""
        return 0

    @property
    def x_scales(self) -> int:
        """[operand_rows, 224] its E8M0 codes."""
        return self.x_codes + self.operand_rows * model.HIDDEN

    @property
    def qr_codes(self) -> int:
        """[operand_rows, 1536] e4m3 of the normed qr."""
        return self.x_scales + self.operand_rows * (model.HIDDEN // MX_BLOCK)

    @property
    def qr_scales(self) -> int:
        """[operand_rows, 48]."""
        return self.qr_codes + self.operand_rows * Q_LORA

    @property
    def bytes(self) -> int:
        return self.qr_scales + self.operand_rows * (Q_LORA // MX_BLOCK)
