"""K1's index arithmetic: which lane, wave and task touches which element.

Every function here uses only + - * // % and comparisons, so the kernel calls it on FlyDSL
values (it becomes the kernel's address code) and the CPU tests call it on Python ints to
emulate the GEMV stages element by element against the reference (tests/test_k1_addressing.py).
Arguments are non-negative, where // and % agree between Python and the DSL's signed ops.

The scaled MFMA v_mfma_scale_f32_16x16x128_f8f6f4 (FlyDSL's CDNA4 MFMA_Scale atom layout):
operand lane l holds row l % 16 and the 32 K values 32 (l / 16) + v of the 128-wide step, with
the E8M0 scale of exactly those 32 values; result lane l holds column l % 16 and rows
4 (l / 16) + e, e = 0..3. K1 puts 16 weight rows in operand A and 16 tokens in operand B.
"""

from __future__ import annotations

from .layout import (KV_DATA, KV_SCALES, MX_BLOCK, Q_LORA, S3_PART_STEPS, S3_TILES, SEAM_CHUNKS, TILE_K, TILE_N,
                     WAVES)

WAVE = 64
PRESHUFFLE_TILE = TILE_N * MX_BLOCK  # 16 rows x 32 bytes
PRESHUFFLE_HALF = TILE_N * 16  # 16 rows x 16 bytes


# -- the MFMA lane maps ---------------------------------------------------------------------

def operand_lane(lane):
    """(row within the tile, first K within the step) of operand lane `lane`."""
    return lane % TILE_N, (lane // TILE_N) * MX_BLOCK


def result_lane(lane, e):
    """(A row, B column) = (weight row, token) within the tile of result lane `lane`, element e."""
    return (lane // TILE_N) * 4 + e, lane % TILE_N


def step_k(step, lane):
    """The first of this lane's 32 K values in K step `step`."""
    return step * TILE_K + operand_lane(lane)[1]


# -- weights --------------------------------------------------------------------------------

def preshuffled_offset(row, k0, k):
    """Byte offset of the 16 bytes (row, k0 .. k0 + 15), k0 % 16 == 0, of an [N, k] byte matrix
    in AITER's (16, 16) preshuffle: [N / 16][k / 32][2][16 rows][16 bytes]."""
    tile = (row // TILE_N) * (k // MX_BLOCK) + k0 // MX_BLOCK
    return tile * PRESHUFFLE_TILE + ((k0 % MX_BLOCK) // 16) * PRESHUFFLE_HALF + (row % TILE_N) * 16


def block_scale_index(row, step, k):
    """Index of the E8M0 code of the 128 x 128 block holding (row, K step) in [N / 128, k / 128]."""
    return (row // TILE_K) * (k // TILE_K) + step


# -- task tables ----------------------------------------------------------------------------

def s1_task(task):
    """(row group, column chunk) of S1 task `task`."""
    return task // SEAM_CHUNKS, task % SEAM_CHUNKS


def s3_task(task):
    """(first weight row of the tile, K half) of S3 task `task`."""
    return (task % S3_TILES) * TILE_N, task // S3_TILES


def s3_steps(part, wave):
    """(K step, keep) of one wave in K half `part`: 28 steps over 8 waves are w, w + 8, w + 16
    for every wave and 24 + w for waves 0..3; waves 4..7 compute 24 + w - 4 again and drop it
    (keep false), which keeps control flow uniform."""
    first = part * S3_PART_STEPS
    full = S3_PART_STEPS // WAVES
    steps = [(first + wave + WAVES * s, None) for s in range(full)]
    extra = S3_PART_STEPS - full * WAVES
    steps.append((first + full * WAVES + wave % extra, wave < extra))
    return steps


S5_WAVES_PER_TILE = WAVES // 2
S5_STEPS = Q_LORA // TILE_K // S5_WAVES_PER_TILE  # 3


def s5_tile(task, wave):
    """(first weight row, first K step) of one wave of S5 task `task`: two 16-row tiles per
    task, four waves per tile, three consecutive K steps per wave."""
    return (task * 2 * TILE_N + (wave // S5_WAVES_PER_TILE) * TILE_N,
            (wave % S5_WAVES_PER_TILE) * S5_STEPS)


def split_k_sum(index, waves_per_tile, row_tiles):
    """What reduction thread-slot `index` adds up: (tile, row tile, source lane, element) and
    whether the slot is real. Slots are numbered tile-major; a CTA runs slots tid, tid + 512."""
    per_tile = row_tiles * WAVE * 4
    tiles = WAVES // waves_per_tile
    tile = index // per_tile
    real = index < tiles * per_tile
    return tile, (index % per_tile) // (WAVE * 4), (index % (WAVE * 4)) // 4, index % 4, real


def lds_acc_slot(wave, row_tile, lane, e, row_tiles):
    """Where wave `wave` parks accumulator element e of row tile `row_tile` for the split-K sum."""
    return ((wave * row_tiles + row_tile) * WAVE + lane) * 4 + e


# -- the KV record --------------------------------------------------------------------------

def kv_offsets(slot, block, page_stride):
    """(first data byte, first scale byte) of the fp8_ds_mla record at `slot`: a page holds its
    `block` records' 576 data bytes first, then their 8 scale bytes each."""
    page, row = slot // block, slot % block
    base = page * page_stride
    return base + row * KV_DATA, base + block * KV_DATA + row * KV_SCALES
