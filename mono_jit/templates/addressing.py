"""The index arithmetic K1 and K2 share: the scaled MFMA's operand and result lanes, a weight's
bytes (row-major or preshuffled) and block codes, MXFP8 activation rows, the split-K sum and the
KV record's bytes. The templates' own task tables are their addressing modules' (k1/addressing.py,
k2/attention_addressing.py, k2/moe_addressing.py).

Every function here uses only + - * // % and comparisons, so the kernel calls it on FlyDSL
values (it becomes the kernel's address code) and the CPU tests call it on Python ints or torch
tensors to emulate the GEMV stages element by element and to bound every buffer access
(tests/templates/k1/test_k1_addressing.py, tests/templates/k1/test_k1_bounds.py, tests/templates/k2/test_k2_addressing.py). Arguments
are non-negative, where // and % agree between Python and the DSL's signed ops.

The operand layout of the scaled MFMA v_mfma_scale_f32_16x16x128_f8f6f4 with fp8 operands, as
code that runs on gfx950 uses it: lane l holds row l % 16 and two 16-byte pieces of the
128-wide K step, K 16 (l / 16) .. + 15 in its words 0-3 and K 64 + 16 (l / 16) .. + 15 in its
words 4-7; its E8M0 scale byte is that of K block l / 16 (K 32 (l / 16) .. + 31), so the four
lanes holding one K block's pieces are the lanes whose scales the hardware applies to it.
Result lane l element e is D[4 (l / 16) + e, l % 16]. Sources (read for this module):
  - vLLM 0.33 in-tree DeepSeek-V4 mono K1: vllm/models/deepseek_v4/amd/mono/attention/gemv.py
    `_step_load` (weight pieces at 128 st + 16 j and + 64, scale of block st * 4 + j) and
    `_step_mfma` (LDS activations at the same two pieces, scale st * 4 + j),
    attention/device.py `mfma_scaled` (the layout in its docstring), gemv_mfmas (the result map);
  - Triton, lib/Dialect/TritonGPU/IR/LinearLayoutConversions.cpp `chooseScaledMfmaScaleLayout`
    (mxfp8 operands: "2 16-consecutive elements blocks" a lane; lane bits 4-5 pick the scale
    column), AccelerateAMDMatmul.cpp ScaledBlockedToScaledMFMAF8F6F4 (fp8 kWidth = kBase / 2 =
    16) and the gfx950 lowering in third_party/amd/.../DotOpToLLVM/MFMA.cpp (kBase 32);
  - AITER, aiter/ops/flydsl/kernels/bmm_a8w8_mxscale_gfx950.py (`_pair`: "fp8 halves 64 K apart
    form one i32[8] MFMA operand"; `scale_col`: col + kgrp), and its fp8 x fp4 MoE GEMMs
    (mixed_moe_gemm_2stage_common.py: fp8 A loads a second pack at col_base + 64, fp4 B none),
    which multiply correctly only if the hardware reads fp8 words 4-7 as K 64 + 16 g.
FlyDSL's CDNA4 atom (MmaAtom.cpp, 32 contiguous K a lane) disagrees; an earlier K1 followed it
and misapplied per-32 activation scales. The test model
of the hardware (tests/support/mfma_model.py) is written from the sources above, not from this module.
K1 puts 16 weight rows in operand A and 16 tokens in operand B.
"""

from __future__ import annotations

from .geometry import KV_DATA, KV_SCALES, MX_BLOCK, TILE_K, TILE_N, WAVE, WAVES

PRESHUFFLE_TILE = TILE_N * MX_BLOCK  # 16 rows x 32 bytes
PRESHUFFLE_HALF = TILE_N * 16  # 16 rows x 16 bytes


# -- the MFMA lane maps ---------------------------------------------------------------------

PIECE = 16  # bytes of one operand piece (four of an operand lane's eight i32 words)
PIECE_GAP = TILE_K // 2  # K distance between a lane's two pieces
BLOCKS_PER_STEP = TILE_K // MX_BLOCK  # 4 E8M0 blocks in one K step


def operand_row(lane):
    """The row (weight row or token) within the 16-row tile that operand lane `lane` holds."""
    return lane % TILE_N


def operand_pieces(step, lane):
    """(first K of the lane's words 0-3, first K of its words 4-7) in K step `step`."""
    first = step * TILE_K + (lane // TILE_N) * PIECE
    return first, first + PIECE_GAP


def operand_block(step, lane):
    """The K block (of 32) whose E8M0 scale operand lane `lane` passes in K step `step`."""
    return step * BLOCKS_PER_STEP + lane // TILE_N


def operand_token(row_tile, lane):
    """The token operand-B lane `lane` holds in row tile `row_tile`."""
    return row_tile * TILE_N + operand_row(lane)


def result_lane(lane, e):
    """(A row, B column) = (weight row, token) within the tile of result lane `lane`, element e."""
    return (lane // TILE_N) * 4 + e, lane % TILE_N


# -- weights --------------------------------------------------------------------------------

def row_major_offset(row, k0, stride):
    """Byte offset of (row, k0) in a row-major byte matrix whose rows are `stride` bytes apart."""
    return row * stride + k0


def preshuffled_offset(row, k0, k):
    """Byte offset of the 16 bytes (row, k0 .. k0 + 15), k0 % 16 == 0, of an [N, k] byte matrix
    in AITER's (16, 16) preshuffle: [N / 16][k / 32][2][16 rows][16 bytes]."""
    tile = (row // TILE_N) * (k // MX_BLOCK) + k0 // MX_BLOCK
    return tile * PRESHUFFLE_TILE + ((k0 % MX_BLOCK) // 16) * PRESHUFFLE_HALF + (row % TILE_N) * 16


def block_scale_index(row, step, k):
    """Index of the E8M0 code of the 128 x 128 block holding (row, K step) in [N / 128, k / 128]."""
    return (row // TILE_K) * (k // TILE_K) + step


# -- MXFP8 activation rows in the byte scratch ----------------------------------------------

def mx_code_offset(codes, token, k0, k):
    """Byte of token `token`'s e4m3 value k0 in rows of k values starting at byte `codes`."""
    return codes + token * k + k0


def mx_scale_offset(scales, token, block, k):
    """Byte of token `token`'s E8M0 code of K block `block` (k / 32 codes a row from `scales`)."""
    return scales + token * (k // MX_BLOCK) + block


# -- split K over a CTA's waves -------------------------------------------------------------

def split_steps(first, count: int, wave):
    """(K step, keep) of one wave when the CTA's 8 waves share `count` K steps from `first`: steps
    w, w + 8, ... for every wave, then first + 8 full + w for the waves below the remainder; the
    others compute the remainder's step w % extra again and drop it (keep false), which keeps
    control flow uniform."""
    full = count // WAVES
    steps = [(first + wave + WAVES * s, None) for s in range(full)]
    extra = count - full * WAVES
    if extra:
        steps.append((first + full * WAVES + wave % extra, wave < extra))
    return steps


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
