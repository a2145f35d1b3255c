"""K2's routed-expert index arithmetic: which bytes of AITER's A8W4 expert weights and scales a
lane of the scaled MFMA reads. Like templates/addressing.py, plain + - * // % on ints, torch tensors or
FlyDSL values: the kernel's address code is traced from these functions, and the CPU tests
(tests/templates/k2/test_k2_moe_addressing.py) emulate an expert's GEMVs through them and the independent
MFMA model (tests/support/mfma_model.py) and bound every offset.

The MFMA (v_mfma_scale_f32_16x16x128_f8f6f4): the fp4 weights are operand A, format code
cbsz = 4 (e2m1), the MXFP8 activations operand B, blgp = 0 (e4m3), as vLLM 0.33's in-tree mono
passes them (deepseek_v4/amd/mono/stages/moe.py `fp4_pair_mfma`, `down_mfma`; common/mx.py
`FP8, FP4 = 0, 4`); AITER's A8W4 MoE swaps the sides (mixed_moe_gemm_2stage_common.py:
`cbsz = 0 if is_f8_a else 4`, `blgp = 0 if is_f8_b else 4`). An fp4 operand lane l holds row
l % 16 and the 32 consecutive K 128 s + 32 (l / 16) .. + 31 of K step s in its words 0-3 (16
bytes, the lower K in a byte's low nibble; words 4-7 unread), and passes the E8M0 of that
K block, 4 s + l / 16 (Triton LinearLayoutConversions.cpp `chooseScaledMfmaScaleLayout`, AITER
mixed_moe_gemm_2stage_common.py's fp4 operand loads, vLLM mx.py `fp4_tile_load`; the model's
docstring has the details). The activations side is K1's fp8 lane map unchanged
(addressing.operand_pieces / operand_block / operand_token: K 16 (l / 16) .. and 64 + 16
(l / 16) .., scale block 4 s + l / 16), and so is the result map (addressing.result_lane:
lane l element e is (weight row 4 (l / 16) + e of the tile, token l % 16)).

Weights after vLLM's loading (model_executor/layers/fused_moe/oracle/mxfp4.py, the
AITER_MXFP4_BF16 branch DeepSeek-V4 takes, interleaved unless the A4W4 variant (separated)
is on, which the mono path refuses: AITER `shuffle_weight(w, is_guinterleave=True, gate_up=...)`,
the same permutation as `shuffle_weight_a16w4(w, 16, gate_up)`; layout (16, 16):
NLane 16, KLane 4, KPack 16 bytes; AITER aiter/ops/shuffle.py):
  w13 [E, 2 I, H / 2] bytes, rows gate 0 .. I - 1 then up: viewed [E, 2, I / 16, 16, H / 128, 4,
      16] and permuted to [E][I / 16][gate, up][H / 128][KLane 4][NLane 16][16 bytes];
  w2  [E, H, I / 2]: viewed [E, H / 16, 16, I / 128, 4, 16], permuted to [E][H / 16][I / 128]
      [KLane 4][NLane 16][16 bytes].
So a weight is a sequence of 16-row tiles (w13's gate and up tiles of the same 16 intermediate
columns interleaved: tile 2 b gate, 2 b + 1 up), each K step of a tile 1024 contiguous bytes in
which lane l's operand is bytes 16 l .. 16 l + 15: KLane = l / 16, NLane = l % 16, exactly the
fp4 lane map above. vLLM's mono reads it so (`fp4_tile_load`: dword rg * 2 k + 256 st + 4 lane).

Scales after loading: AITER `shuffle_scale(s [E * N, K / 32], E, is_guinterleave=True, gate_up)`
(`shuffle_scale_a16w4`'s permutation): columns padded to a multiple of 8 with 0x7F, then
  gate_up: viewed [E, NPack 2, N / 32, NLane 16, K1, KPack 2, KLane 4] (NPack: gate or up);
  down:    viewed [E, N / 32, NPack 2, NLane 16, K1, KPack 2, KLane 4] (NPack: 16-row half);
both permuted to [E][N / 32][K1][KLane 4][NLane 16][KPack 2][NPack 2]. In the weight's tile order
both read alike: tile t's scales sit in the 256-byte group (t / 2, K step / 2), lane l's dword is
bytes 4 l .. 4 l + 3 of it (KLane l / 16, NLane l % 16), and within the dword byte 2 (s % 2) +
t % 2: a gate tile and its up tile, and two consecutive K steps, share a lane's dword (AITER's
opsel `ikxdl * pack_N + inxdl`; vLLM mx.py `scale_index`, the same byte as (interleaved row,
column) of `shuffle_scale`'s non-interleaved order).
"""

from __future__ import annotations

from ..geometry import MX_BLOCK, TILE_K, TILE_N

FP4_BYTES = TILE_K // 2  # bytes of one row's K step: 128 e2m1 values
LANE_BYTES = FP4_BYTES // 4  # an fp4 operand lane's 16 bytes: 32 values
TILE_STEP_BYTES = TILE_N * FP4_BYTES  # 1024: one 16-row tile's K step, the 64 lanes' operands
SCALE_PACK = 8  # shuffle_scale pads the E8M0 columns to a multiple of KPack x KLane
SCALE_GROUP = 2 * TILE_N * SCALE_PACK  # 256 bytes: two tiles' (NPack) two K steps (KPack)


# -- the fp4 operand lane map ----------------------------------------------------------------

def fp4_operand_k(step, lane):
    """The first of the 32 consecutive K an fp4 operand lane holds in K step `step`."""
    return step * TILE_K + (lane // TILE_N) * MX_BLOCK


def fp4_operand_block(step, lane):
    """The K block (of 32) whose E8M0 scale an fp4 operand lane passes in K step `step`."""
    return step * (TILE_K // MX_BLOCK) + lane // TILE_N


# -- gate / up interleave ----------------------------------------------------------------------

def w13_tile(block, up):
    """w13's 16-row tile holding the gate (up 0) or up (up 1) rows of intermediate columns
    16 block .. 16 block + 15."""
    return 2 * block + up


def w13_row(tile, row, inter):
    """The row of w13 as loaded ([gate; up], [2 inter, ...]) that row `row` of tile `tile` is."""
    return (tile % 2) * inter + (tile // 2) * TILE_N + row


# -- expert weights and scales ---------------------------------------------------------------

def expert_weight_bytes(rows, k):
    """Bytes of one expert's fp4 weight [rows, k]."""
    return rows * (k // 2)


def scale_cols(k):
    """E8M0 columns a row after shuffle_scale's padding: k / 32 up to a multiple of 8."""
    return (k // MX_BLOCK + SCALE_PACK - 1) // SCALE_PACK * SCALE_PACK


def expert_scale_bytes(rows, k):
    """Bytes of one expert's shuffled E8M0 scales."""
    return rows * scale_cols(k)


def weight_offset(expert, tile, step, lane, rows, k):
    """Byte offset of the 16 bytes fp4 operand lane `lane` loads for expert `expert`'s 16-row
    tile `tile` (w13: `w13_tile`'s order) at K step `step`, in a shuffled [E, rows, k / 2]."""
    return expert * expert_weight_bytes(rows, k) + (tile * (k // TILE_K) + step) * TILE_STEP_BYTES + lane * LANE_BYTES


def scale_offset(expert, tile, step, lane, rows, k):
    """Byte offset of the E8M0 code fp4 operand lane `lane` passes for expert `expert`'s tile
    `tile` at K step `step`, in the shuffled scales [E * rows, scale_cols(k)]."""
    group = (tile // 2) * (scale_cols(k) // SCALE_PACK) + step // 2
    return expert * expert_scale_bytes(rows, k) + group * SCALE_GROUP + lane * 4 + (step % 2) * 2 + tile % 2


def scale_word_offset(expert, tile, step, lane, rows, k):
    """Byte offset of the aligned dword holding that code: one load serves the tile pair
    (2 (t / 2), + 1) and the step pair (2 (s / 2), + 1); the code is its byte
    2 (step % 2) + tile % 2 (the MFMA's scale opsel)."""
    return scale_offset(expert, tile, step, lane, rows, k) - (step % 2) * 2 - tile % 2
