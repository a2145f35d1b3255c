"""K2 part one's stage decomposition, sync words, scratch and peer-buffer offsets, as plain
numbers of a spec (pure Python, like k1/layout.py: the kernel, the runner and the tests read the
same figures; tests/templates/k2/test_k2_protocol.py runs `program` on a model of 8 ranks x 256 CTAs).

Stages (CTA b runs tasks b, b + 256, ...; a stage waits only on earlier stages of its own rank,
or on peers' pushes of earlier stages, so with all CTAs of every rank resident nothing can
deadlock). Part one's SCHEDULE below states each stage's task count, wait, peer polls, pushes,
flags and scratch regions once; K2's whole table (moe_layout.SCHEDULE) is these stages and then
the MoE's: the sync words, the scratch offsets, the program the protocol model runs, the
kernel's stage loops and the stage-subset builds follow it (templates/schedule.py,
templates/stage_loop.py). Every task
publishes its flag, and every push is made, on every launch for all `rows` of the bucket, pad
rows (m <= row < rows) included with no wait and zero data: so every flag and every peer pair a launch may read was rewritten by the launch before it
on that word (sync area) or that half (peer buffer), and a 32-bit tag can wrap (see "Tags").

  S1 key table      task = row: the row's SWA window then its CSA / HCA slots (keytable).
  S2 attention      task = (row, head tile of 16, key chunk): the chunk's (m, l, acc) partial.
                    Chunks: the most per row that keep the stage to one round of 256 tasks
                    (chunks = 256 // (rows x head tiles), at most one per 64 keys), the chunk a
                    multiple of 64 keys. Why: one round means no tail (a second round of a few
                    tasks would double the stage for them), each task's keys are as few as 256
                    CTAs allow (the critical path), and the partials (32 KiB a task, the size of
                    56 records) stay at 256 x 32 KiB = 8 MiB whatever the width; finer chunks
                    would move more partial bytes than key bytes. CSA (1152 keys): 18 chunks of
                    64 at 1-8 rows ... 4 of 320 at 64; HCA 8192 (8320 keys): 130 of 64 at 1 row
                    ... 4 of 2112 at 64. The merge waits on a row's chunks, one thread a flag.
  S3 merge          task = (row, head): LSE merge with the sink, inverse RoPE, MXFP8 per 32.
                    Numbered (head block of 4, row, head in block) so a wo_a K half's wait is
                    one contiguous range of flags.
  S4 wo_a           task = (N tile of 16 of the groups x 1024 outputs, K half = 4 heads): 256
                    tasks (K1's S3 split), f32 halves to scratch.
  S5 z quant        task = row: the two halves summed, bf16, MXFP8 per 32 (K1's S4 role).
  S6 wo_b           task = N tile of 16 of the 7168 outputs (K = groups x 1024 in one task):
                    the bf16 tile to `partial`, then pushed as (bf16x2, tag) pairs: one hop, to
                    every rank's PART[this rank]; two hops, to the columns' owner's RS[this rank].
  S7 reduce + seam  the seam's fold tasks (row group of 16, column chunk of 128; K1's S1, both
                    stated once in templates/seam_layout.py): the task
                    reads its rows x 128 columns of y (one hop: PART of the 8 ranks, summed in
                    rank order; two hops: its owner sums RS in rank order and pushes the bf16
                    sums to every rank's AG, the others read AG), folds, mixes.
  S8 seam gate      the seam's gate stage (task = row; K1's S2): gate, Sinkhorn, collapse, ffn_norm, MXFP8 (the
                    flag is part two's hand-off to the MoE).

Tags: a launch reads its area's epoch e once; its flags and pairs carry e + 1 (mod 2^32, the
int32 word wrapping) and its pushes go to the peer half e & 1 (the low bit: parity survives the
wrap; never `e % 2`, negative in signed arithmetic). Within a half, every pair is rewritten every
second launch, so a pair read at e holds e + 1 (this launch) or e - 1 (two launches ago), never a
tag that wrapped round. A rank can be at most one launch ahead of any peer (finishing launch e
needs every peer's pushes of e, which a peer makes only after it finished e - 1): its pushes of
e + 1 go to the other half than the peers still reading e.

All-reduce: one hop or two (`TWO_HOP_ROWS`, per bucket since pad rows are pushed too).
Model: a pair carries two bf16 in 8 bytes (4 bytes a value). The 8 GPUs are fully connected,
7 links a GPU, each peer on its own link, so a step costs hops x L + (bytes on one link) / B.
  one hop   a rank sends its [M, 7168] partial to each of 7 peers: 4 x 7168 x M = 28672 M bytes
            a link (200704 M a rank), one hop:        T1 = L + 28672 M / B
  two hops  reduce-scatter 7 x 1/8 of the partial to the owners, then all-gather its 1/8 of
            the sums to 7 peers: 2 x 3584 M = 7168 M bytes a link (50176 M a rank, 2 / tp of one
            hop's), two hops:                          T2 = 2 L + 7168 M / B
  T2 < T1  when  M > L x B / 21504.
Figures: B = 76.8 GB/s a direction a link: MI355X's 153.6 GB/s bidirectional Infinity Fabric
link, 7 links (AMD's MI355X specifications, as quoted by humeconsulting.co "AMD MI355X: Strong
Node-Level Inference"); L = 5 us a hop (an ASSUMPTION, not measured: a system-scope store
crossing the fabric, the reader's s_sleep poll loop and the CTA barrier and fences around the
hand-off; rank skew is paid once either way). Then M* = 5e-6 x 76.8e9 / 21504 = 17.9 rows:
buckets of 32 and 64 take two hops (at 16 rows: T1 = 11.0 us, T2 = 11.5 us; at 32: 16.9 vs
13.0). Upstream's TWO_HOP_ROWS = 42 (vllm mono dims.py, exact row counts) puts L x B at 903 KB,
e.g. L = 11.8 us at the link's peak, or B = 32 GB/s effective at L = 5 us: 8-byte pairs from
CU stores reach well under the link's peak. Both schemes sum in rank order in f32: same bits.

Buffers (per K2 build, on every rank, allocated before capture): `sync` (int32, zeroed once),
`work` (f32 words: the f32, key-table and byte regions), and the peer buffer (`peer_bytes`,
symmetric across ranks, uncached, zeroed once, IPC-shared). The peer buffer belongs to the build's sync area: its tags are that
area's epochs, so two builds may not share one (an equal epoch of another area would read as
this launch's), and every rank's area must hold the same epoch (all created, and dropped, together).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar

from ... import deepseek_v4
from ...deepseek_v4 import HEAD_DIM
from ...spec import Spec
from ..geometry import (CTAS, LDS_ACC_WORDS, LDS_GATE_WORDS, LDS_RED_WORDS, MX_BLOCK, PAIR_BYTES, PARTIALS, PEERS,
                        SEAM_CHUNK, SEAM_CHUNKS, TILE_N)
from ...hsaco.resources import LDS_PER_CU
from .. import schedule as sched, seam_layout

HEAD_TILE = 16  # heads an attention MFMA takes
KEY_GRANULE = 64  # a chunk is a multiple of 64 keys
O_LORA = 1024  # wo_a's outputs a group
HEADS_PER_GROUP = deepseek_v4.HEADS // deepseek_v4.OUTPUT_GROUPS  # 8: a wo_a group's heads
WOA_PARTS = 2  # wo_a's K split
MERGE_BLOCK = HEADS_PER_GROUP // WOA_PARTS  # 4 heads: one wo_a K half
WOB_TILES = deepseek_v4.HIDDEN // TILE_N  # 448
ROW_ALIGN = 256  # bytes: every region starts on a 256-byte boundary

# LDS (f32 words): K1's block-reduction, gate and split-K areas (the shared seam and GEMV code
# use them), and the 128 reduced values of the S7 row being folded. The pin keeps one CTA a CU,
# as K1's (k1/layout.py PIN_LDS_BYTES).
LDS_Y_WORDS = SEAM_CHUNK
LDS_PEER_WORDS = 2 * PEERS  # every rank's peer-buffer address (low, high words)
LDS_MOE_WORDS = deepseek_v4.ROUTED_EXPERTS  # S11: the experts' chosen flags, then the union's slots
STATIC_LDS_BYTES = 4 * (LDS_RED_WORDS + LDS_GATE_WORDS + LDS_ACC_WORDS + LDS_Y_WORDS + LDS_PEER_WORDS + LDS_MOE_WORDS)
PIN_LDS_BYTES = LDS_PER_CU // 2 + 64 - STATIC_LDS_BYTES
# A cross-rank wait lasts at most the launch's `peer_wait_us` microseconds, measured on
# s_memrealtime's clock, then traps: a rank that died mid-step fails the launch, never hangs it,
# while one that is late (vLLM's compressor and indexer run on the host between K1 and K2 and
# may compile on their first call) is waited for. The clock is the device's fixed-frequency
# one, 100 MHz on every GFX9-family chip whatever the shader clock (vLLM 0.33's in-tree mono,
# common/ops.py memrealtime: "the 100 MHz device clock"; LLVM's libc, src/time/gpu/
# time_utils.h: the cards of the GFX9 ISAs use a 100 MHz clock; the driver reports the real
# rate as the device's wall-clock rate).
TICKS_PER_US = 100

# The layer's weights reach K2 as one int64 table (the runner fills one a layer, once: weights
# do not move): the weights' device addresses, then wo_a's and wo_b's row stride in bytes and
# whether each is AITER-preshuffled (1) or row-major (0; a preshuffled weight's stride is its
# K). A value read in the stage that uses it holds no SGPRs across the persistent kernel; as
# arguments they would (the AMDGPU backend loads every kernel argument in the entry block), and
# with every weight an argument K2 spilled SGPRs. Part one's: wo_a [groups x 1024, woa_stride]
# e4m3 (row-major with vLLM's padded rows, or preshuffled with stride 4096) and its E8M0 codes
# [groups x 8, 32], wo_b [7168, wob_stride] e4m3 (preshuffled: stride groups x 1024) and its codes
# [56, groups x 8], attn_sink [heads] f32, the rope table [P, 64] f32, hc_ffn_fn [24, 4 x 7168],
# hc_ffn_base [24] and hc_ffn_scale [3] f32, ffn_norm [7168] bf16.
WEIGHT_TABLE = ("w_oa", "s_oa", "w_ob", "s_ob", "attn_sink", "rope", "hc_fn", "hc_base", "hc_scale", "ffn_norm",
                "woa_stride", "woa_shuffled", "wob_stride", "wob_shuffled",
                # part two (the MoE): the router's gate [384, 7168] bf16 and bias [384] f32 (0 on a
                # hash layer: never dereferenced), the experts' w13 [384, 2 x inter, 3584] and w2
                # [384, 7168, inter / 2] fp4x2 in AITER's A8W4 layout and their shuffled E8M0
                # scales, the shared expert's gate_up [2 x inter, 7168] and down [7168, inter]
                # e4m3 with 128 x 128 E8M0 codes, their row strides and layouts
                "gate", "bias", "w13", "w13_s", "w2", "w2_s", "sgu", "sgu_s", "sw2", "sw2_s",
                "sgu_stride", "sgu_shuffled", "sw2_stride", "sw2_shuffled")
# The runner's buffers K2 reads and writes reach it the same way, one table a runner (they are
# allocated once, at the widest bucket, and never move): K1's q_out, r_out, post_out and
# comb_out (K2's inputs: q [rows, heads, 512] bf16, residual [rows, 4, 7168] bf16, post_in [rows, 4]
# and comb_in [rows, 4, 4] f32), then K2's outputs: r_out [rows, 4, 7168] bf16 (R after the
# attention's fold; may be K1's r_out), post_out [rows, 4] and comb_out [rows, 4, 4] f32 (the FFN
# seam's mixes), pre_out [rows, 4] f32 (the FFN seam's pre, vLLM's pre_out), x_norm [rows, 7168]
# bf16 (ffn_norm of the collapse; its MXFP8 stays in `work`), out [rows, 7168] bf16 (the reduced
# MoE output); each at least `rows` rows.
STATE_TABLE = ("q", "residual", "post_in", "comb_in", "r_out", "post_out", "comb_out", "pre_out", "x_norm", "out")

# The all-reduce's model (module docstring): link bandwidth a direction, latency a hop.
LINK_BYTES_PER_S = 76.8e9
HOP_SECONDS = 5e-6
PAIR_BYTES_PER_VALUE = PAIR_BYTES // 2


def allreduce_seconds(rows: int, two_hop: bool, tp: int = 8) -> float:
    """The model's time of one all-reduce of [rows, 7168] bf16 at TP `tp`."""
    per_link = PAIR_BYTES_PER_VALUE * deepseek_v4.HIDDEN * rows
    if two_hop:
        return 2 * HOP_SECONDS + 2 * per_link / tp / LINK_BYTES_PER_S
    return HOP_SECONDS + per_link / LINK_BYTES_PER_S


def two_hop_threshold(tp: int = 8) -> float:
    """Rows above which two hops win: L x B / (bytes a link saved a row)."""
    saved = PAIR_BYTES_PER_VALUE * deepseek_v4.HIDDEN * (1 - 2 / tp)
    return HOP_SECONDS * LINK_BYTES_PER_S / saved


TWO_HOP_ROWS = math.ceil(two_hop_threshold())  # 18: buckets 32 and 64 take two hops


def _align(n: int) -> int:
    return -(-n // ROW_ALIGN) * ROW_ALIGN


# -- part one's schedule: stages in launch order (a stage waits only on earlier stages of its own
# rank, or on peers' pushes of earlier stages, so with all CTAs of every rank resident nothing can
# deadlock) ------------------------------------------------------------------------------------

def _row(lay: "K2Layout", task):
    return task


def _s2_awaits(lay: "K2Layout", task, m, data):
    """The key table of the task's row."""
    return lay.s2_task(task)[0], 1


def _s3_awaits(lay: "K2Layout", task, m, data):
    """Every chunk of the task's row and head tile."""
    row, head = lay.s3_task(task)
    return (row * lay.head_tiles + head // HEAD_TILE) * lay.chunks, lay.chunks


def _s4_awaits(lay: "K2Layout", task, m, data):
    """The merges of the task's K half's 4 heads for the rows below m (contiguous)."""
    tile, half = lay.s4_task(task)
    block = tile * TILE_N // O_LORA * WOA_PARTS + half
    return block * lay.rows * MERGE_BLOCK, MERGE_BLOCK * m


SCHEDULE: tuple[sched.Stage, ...] = (
    sched.Stage(1, "key table", tasks=lambda lay: lay.rows, writes=("key_slots", "key_counts")),
    sched.Stage(2, "attention", tasks=lambda lay: lay.rows * lay.head_tiles * lay.chunks,
                row_of=lambda lay, task: lay.s2_task(task)[0], waits=(sched.Wait(1, _s2_awaits),),
                reads=("key_slots", "key_counts"), writes=("attn_ml", "attn_acc")),
    sched.Stage(3, "merge", tasks=lambda lay: lay.rows * lay.heads,
                row_of=lambda lay, task: lay.s3_task(task)[0], waits=(sched.Wait(2, _s3_awaits),),
                reads=("attn_ml", "attn_acc"), writes=("xo_codes", "xo_scales")),
    sched.Stage(4, "wo_a", tasks=lambda lay: lay.o_tiles * WOA_PARTS, waits=(sched.Wait(3, _s4_awaits),),
                reads=("xo_codes", "xo_scales"), writes=("woa_raw",)),
    sched.Stage(5, "z quant", tasks=lambda lay: lay.rows, row_of=_row,
                waits=(sched.Wait(4, lambda lay, row, m, data: (0, lay.tasks(4))),), reads=("woa_raw",),
                writes=("z_codes", "z_scales")),
    sched.Stage(6, "wo_b", tasks=lambda lay: WOB_TILES, waits=(sched.Wait(5, sched.rows_below_m),),
                publishes=False, pushes=lambda lay, task, rank: lay.s6_pushes(task, rank),
                reads=("z_codes", "z_scales"), writes=("partial",)),
    sched.Stage(7, "reduce + seam", tasks=seam_layout.fold_tasks, row_of=seam_layout.fold_row,
                peer_awaits=lambda lay, task, rank: lay.s7_peer_awaits(task, rank),
                pushes=lambda lay, task, rank: lay.s7_pushes(task, rank), writes=("partials",)),
    sched.Stage(8, "seam gate", tasks=lambda lay: lay.rows, row_of=_row, waits=(sched.Wait(7, seam_layout.gate_awaits),),
                reads=("partials",), writes=("ffn_codes", "ffn_scales")),
)

F32_REGIONS: tuple[sched.Region, ...] = (
    sched.Region("attn_ml", lambda lay: lay.tasks(2) * 2 * HEAD_TILE,
                 "[S2 tasks, 2, 16] each chunk's base-2 max and sum per head of its tile"),
    sched.Region("attn_acc", lambda lay: lay.tasks(2) * HEAD_TILE * HEAD_DIM,
                 "[S2 tasks, 16, 512] each chunk's unnormalised sum of 2^(s - m) v per head"),
    sched.Region("woa_raw", lambda lay: WOA_PARTS * lay.rows * lay.o_width,
                 "[2 K halves, rows, o_width] wo_a's f32 halves (S5 sums them)"),
    sched.Region("partials", lambda lay: lay.rows * SEAM_CHUNKS * PARTIALS,
                 "[rows, 56, 25] the FFN seam's mix partials (K1's partials' layout)"),
)

I32_REGIONS: tuple[sched.Region, ...] = (
    sched.Region("key_slots", lambda lay: lay.rows * lay.keys, "[rows, keys] a row's slots (SWA ones first), -1 after its keys"),
    sched.Region("key_counts", lambda lay: 2 * lay.rows, "[rows, 2]: a row's keys and its leading SWA keys"),
)

# Every byte region starts on a 256-byte boundary (ROW_ALIGN).
BYTE_REGIONS: tuple[sched.Region, ...] = (
    sched.Region("xo_codes", lambda lay: lay.operand_rows * lay.heads * HEAD_DIM,
                 "[operand_rows, heads x 512] e4m3 of the merged, inverse-RoPE'd o (wo_a's input)"),
    sched.Region("xo_scales", lambda lay: lay.operand_rows * lay.heads * HEAD_DIM // MX_BLOCK,
                 "[operand_rows, heads x 16] its E8M0 codes"),
    sched.Region("z_codes", lambda lay: lay.operand_rows * lay.o_width,
                 "[operand_rows, o_width] e4m3 of wo_a's bf16 output (wo_b's input)"),
    sched.Region("z_scales", lambda lay: lay.operand_rows * lay.o_width // MX_BLOCK, "[operand_rows, o_width / 32]"),
    sched.Region("partial", lambda lay: 2 * lay.rows * deepseek_v4.HIDDEN,
                 "[rows, 7168] bf16: the rank's partial (wo_b's tiles, as they are pushed)"),
    sched.Region("ffn_codes", lambda lay: lay.operand_rows * deepseek_v4.HIDDEN,
                 "[operand_rows, 7168] e4m3 of the FFN seam's normed row (part two's MoE input)"),
    sched.Region("ffn_scales", lambda lay: lay.operand_rows * deepseek_v4.HIDDEN // MX_BLOCK, "[operand_rows, 224] its E8M0 codes"),
)


@dataclass(frozen=True)
class K2Layout(sched.ScheduledLayout):
    """Every width, task count and offset of one K2 part-one build (the accessors over the
    schedule and the scratch tables: sched.ScheduledLayout)."""

    tp: int
    ratio: int
    topk_width: int
    rows: int  # max_tokens: the bucket
    schedule: tuple[sched.Stage, ...] = field(default=SCHEDULE, repr=False)  # part one's (K2MoeLayout's: K2's)
    # the scratch regions, packed in order (K2MoeLayout's add the MoE's after these)
    f32_regions: ClassVar[tuple[sched.Region, ...]] = F32_REGIONS
    i32_regions: ClassVar[tuple[sched.Region, ...]] = I32_REGIONS
    byte_regions: ClassVar[tuple[sched.Region, ...]] = BYTE_REGIONS
    byte_align: ClassVar[int] = ROW_ALIGN

    @classmethod
    def of(cls, spec: Spec) -> "K2Layout":
        return cls(tp=spec.tp, ratio=spec.ratio, topk_width=spec.topk_width, rows=spec.max_tokens)

    # -- widths ------------------------------------------------------------------------
    @property
    def heads(self) -> int:
        return deepseek_v4.per_rank(self.tp).heads

    @property
    def head_tiles(self) -> int:
        return math.ceil(self.heads / HEAD_TILE)

    @property
    def groups(self) -> int:
        return deepseek_v4.per_rank(self.tp).groups

    @property
    def o_width(self) -> int:
        """wo_a's outputs on this rank (wo_b's K)."""
        return self.groups * O_LORA

    @property
    def keys(self) -> int:
        """A row's key-table width: SWA window, then the top-k."""
        return deepseek_v4.SWA_WINDOW + self.topk_width

    @cached_property
    def chunk(self) -> int:
        """Keys a S2 task (module docstring: one round of 256 tasks)."""
        chunks = max(1, min(math.ceil(self.keys / KEY_GRANULE), CTAS // (self.rows * self.head_tiles)))
        return math.ceil(self.keys / chunks / KEY_GRANULE) * KEY_GRANULE

    @property
    def chunks(self) -> int:
        return math.ceil(self.keys / self.chunk)

    @property
    def two_hop(self) -> bool:
        return self.rows >= TWO_HOP_ROWS

    @property
    def owned_cols(self) -> int:
        """Two hops: the columns a rank sums (rank r owns [r x owned_cols, (r + 1) x owned_cols))."""
        return deepseek_v4.HIDDEN // self.tp

    # -- task tables (part one's schedule) ------------------------------------------------
    @property
    def o_tiles(self) -> int:
        return self.o_width // TILE_N

    # task -> its coordinates
    def s2_task(self, task):
        """(row, head tile, chunk); chunks innermost, so a row's chunks are adjacent flags."""
        return task // (self.head_tiles * self.chunks), task // self.chunks % self.head_tiles, task % self.chunks

    def s3_task(self, task):
        """(row, head): numbered (head block, row, head in block)."""
        block = task // (self.rows * MERGE_BLOCK)
        return task // MERGE_BLOCK % self.rows, block * MERGE_BLOCK + task % MERGE_BLOCK

    def s4_task(self, task):
        """(N tile, K half); the K half's 4 heads are head block tile's group x 2 + half."""
        return task // WOA_PARTS, task % WOA_PARTS

    def s7_task(self, task):
        """(row group of 16, column chunk of 128): the seam's fold task (seam_layout)."""
        return seam_layout.fold_task(task)

    def wob_owner(self, tile: int) -> int:
        return tile * TILE_N // self.owned_cols

    def seam_owner(self, chunk: int) -> int:
        return chunk * SEAM_CHUNK // self.owned_cols

    # -- sync words: a flag base per publishing stage --------------------------------------
    @property
    def f_keys(self) -> int:
        return self.flag_base(1)

    @property
    def f_attn(self) -> int:
        return self.flag_base(2)

    @property
    def f_merge(self) -> int:
        return self.flag_base(3)

    @property
    def f_woa(self) -> int:
        return self.flag_base(4)

    @property
    def f_z(self) -> int:
        return self.flag_base(5)

    @property
    def f_seam(self) -> int:
        """S7's flags (S6 has none: its hand-off is its pushes)."""
        return self.flag_base(7)

    @property
    def f_norm(self) -> int:
        return self.flag_base(8)

    # -- peer hand-offs: units of pairs a task writes, in the half of the launch's parity -----
    # A unit is what one task pushes to one rank: PART / RS unit src x 448 + tile (a wo_b tile's
    # 16 columns x all rows, from rank src); AG unit = S7 task (its group's rows x 128 columns).
    def s6_pushes(self, task, rank):
        """(peer, region, unit) of wo_b tile `task` on `rank`, peers in rank order (as the kernel
        unrolls them)."""
        unit = rank * WOB_TILES + task
        if self.two_hop:
            return [(self.wob_owner(task), "rs", unit)]
        return [(peer, "part", unit) for peer in range(self.tp)]

    def s7_peer_awaits(self, task, rank):
        """(region, first unit, count) the S7 task reads on `rank`: the 8 tiles of its chunk
        from every rank (one hop; two hops on the chunk's owner), or the owner's AG unit."""
        _, chunk = self.s7_task(task)
        tiles = SEAM_CHUNK // TILE_N
        if self.two_hop and self.seam_owner(chunk) != rank:
            return [("ag", task, 1)]
        region = "rs" if self.two_hop else "part"
        return [(region, src * WOB_TILES + chunk * tiles, tiles) for src in range(self.tp)]

    def s7_pushes(self, task, rank):
        """Two hops, on the chunk's owner: its sums to every rank's AG (its own included, where
        nothing reads them: one uniform loop in the kernel)."""
        if not self.two_hop or self.seam_owner(self.s7_task(task)[1]) != rank:
            return []
        return [(peer, "ag", task) for peer in range(self.tp)]

    def peer_units(self, region: str) -> int:
        return self.tasks(7) if region == "ag" else self.tp * WOB_TILES

    def peer_regions(self) -> tuple[str, ...]:
        return ("part", "rs", "ag")

    @staticmethod
    def peer_half(epoch: int) -> int:
        """The half a launch that read `epoch` pushes to and reads: its low bit."""
        return epoch & 1

    # -- f32 scratch (words; F32_REGIONS) -------------------------------------------------
    @property
    def attn_ml(self) -> int:
        return self._f32("attn_ml")

    @property
    def attn_acc(self) -> int:
        return self._f32("attn_acc")

    @property
    def woa_raw(self) -> int:
        return self._f32("woa_raw")

    @property
    def partials(self) -> int:
        return self._f32("partials")

    @property
    def f32_words(self) -> int:
        return self._f32("end")

    def attn_ml_at(self, task, which, head):
        """Word of S2 task `task`'s base-2 max (which 0) or sum (which 1) of its tile's head."""
        return self.attn_ml + (task * 2 + which) * HEAD_TILE + head

    def attn_acc_at(self, task, head, dim):
        """Word of S2 task `task`'s accumulator of its tile's head at dim `dim`."""
        return self.attn_acc + (task * HEAD_TILE + head) * HEAD_DIM + dim

    # -- the work buffer: f32 words, then the key table (i32 words), then the byte scratch ------
    @property
    def i32_at(self) -> int:
        """Byte offset of the i32 region in the work buffer."""
        return 4 * self.f32_words

    @property
    def u8_at(self) -> int:
        """Byte offset of the byte region in the work buffer."""
        return _align(self.i32_at + 4 * self.i32_words)

    @property
    def work_words(self) -> int:
        """The work buffer's size in f32 words (one f32 buffer holds all three regions)."""
        return (self.u8_at + self.bytes) // 4

    # -- i32 scratch (words; I32_REGIONS): the key table --------------------------------------
    @property
    def key_slots(self) -> int:
        return self._i32("key_slots")

    @property
    def key_counts(self) -> int:
        return self._i32("key_counts")

    @property
    def i32_words(self) -> int:
        return self._i32("end")

    # -- byte scratch ------------------------------------------------------------------
    @property
    def xo_codes(self) -> int:
        return self._byte("xo_codes")

    @property
    def xo_scales(self) -> int:
        return self._byte("xo_scales")

    @property
    def z_codes(self) -> int:
        return self._byte("z_codes")

    @property
    def z_scales(self) -> int:
        return self._byte("z_scales")

    @property
    def partial(self) -> int:
        return self._byte("partial")

    @property
    def ffn_codes(self) -> int:
        return self._byte("ffn_codes")

    @property
    def ffn_scales(self) -> int:
        return self._byte("ffn_scales")

    @property
    def bytes(self) -> int:
        return self._byte("end")

    # -- the peer buffer: two halves (epoch parity), each the attention all-reduce's region ----
    @property
    def part(self) -> int:
        """One hop: PART [tp sources, rows, 3584] pairs of (bf16x2, tag)."""
        return 0

    @property
    def rs(self) -> int:
        """Two hops: RS [tp sources, rows, owned_cols / 2] pairs (this rank's columns)."""
        return 0

    @property
    def ag(self) -> int:
        """Two hops: AG [rows, 3584] pairs: the owners' bf16 sums (own columns unused)."""
        return _align(self.rs + PAIR_BYTES * self.tp * self.rows * self.owned_cols // 2)

    @property
    def half_bytes(self) -> int:
        if self.two_hop:
            return _align(self.ag + PAIR_BYTES * self.rows * deepseek_v4.HIDDEN // 2)
        return _align(self.part + PAIR_BYTES * self.tp * self.rows * deepseek_v4.HIDDEN // 2)

    @property
    def peer_bytes(self) -> int:
        return 2 * self.half_bytes

    def part_pair(self, src, row, col):
        """Byte offset in a half of PART's pair (src, row, columns col, col + 1)."""
        return self.part + PAIR_BYTES * ((src * self.rows + row) * (deepseek_v4.HIDDEN // 2) + col // 2)

    def rs_pair(self, src, row, col):
        """Byte offset in the owner's half of RS's pair (src, row, col, col + 1)."""
        local = col % self.owned_cols
        return self.rs + PAIR_BYTES * ((src * self.rows + row) * (self.owned_cols // 2) + local // 2)

    def ag_pair(self, row, col):
        return self.ag + PAIR_BYTES * (row * (deepseek_v4.HIDDEN // 2) + col // 2)
