"""gfx950's `v_mfma_scale_f32_16x16x128_f8f6f4` operand and result layout: the emulator's one
hardware model of the scaled MFMA, written as data from code that runs on the hardware (never
from mono-jit's addressing modules, which must not import it).

Formats (cbsz for A, blgp for B): 0 = fp8 e4m3, 4 = fp4 e2m1. vLLM 0.33 deepseek_v4/amd/mono/
common/mx.py (`FP8, FP4 = 0, 4`, the f8f6f4 MFMA's operand formats); AITER
aiter/ops/flydsl/kernels/mixed_moe_gemm_2stage_common.py (`cbsz = 0 if is_f8_a else 4`,
`blgp = 0 if is_f8_b else 4`); LLVM's verifier of the intrinsic (formats 0/1 take 8 i32
registers, 4 takes four).

Operand lanes (A and B alike; lane = 16 g + r holds row r of A, column r of B):
  - fp8: words 0-3 hold K 16 g .. 16 g + 15 of the 128-step, words 4-7 K 64 + 16 g .. + 15.
    vLLM 0.33 mono/attention/gemv.py `_step_load` (the weight at `128 * st + 16 * j` and `+ 64`)
    and `_step_mfma`; AITER bmm_a8w8_mxscale_gfx950.py `_pair` ("fp8 halves 64 K apart form one
    i32[8] MFMA operand"); Triton AccelerateAMDMatmul.cpp (fp8 kWidth = kBase / 2 = 16).
  - fp4: words 0-3 hold K 32 g .. 32 g + 31, two values a byte, the lower K in the low nibble;
    words 4-7 are not read. Triton LinearLayoutConversions.cpp `chooseScaledMfmaScaleLayout`
    ("with fp4 input, each lane takes 32 consecutive elements"); AITER
    mixed_moe_gemm_2stage_common.py (an fp4 operand is one 16-byte read, upper half zero); vLLM
    mono common/mx.py `fp4_tile_load`. Nibble order: torch's float4_e2m1fn_x2 (val0 in bits 0-3),
    AITER fp4_utils.py `mxfp4_to_f32` (even K the low nibble).
  - the scale of (row r, K k) is byte 0 of lane 16 (k // 32) + r's scale VGPR, the E8M0 of K
    block k // 32, for either format: vLLM `_step_load` / `_step_mfma` and moe.py
    `gemv_fp4_pair`; Triton `chooseScaledMfmaScaleLayout` (lane bits 4-5 select the scale
    column); AITER bmm_a8w8_mxscale_gfx950.py `scale_col`.
Result: lane 16 g + c, element e is D[4 g + e, c] (vLLM gemv_mfmas' docstring and moe.py
`down_mfma`, row `4 * (lane // 16) + q`; FlyDSL CDNA4 MmaAtom.cpp getThrValLayoutC).
"""

from __future__ import annotations

import numpy as np

FP8, FP4 = 0, 4  # cbsz / blgp format codes
OPERAND_WORDS = {FP8: 8, FP4: 4}  # VGPRs an operand occupies

# Lane group g -> first K of its two 16-byte fp8 pieces, the first K of its 32 fp4 values, and
# the K block its scale covers.
PIECE_K = {0: (0, 64), 1: (16, 80), 2: (32, 96), 3: (48, 112)}
FP4_K = {0: 0, 1: 32, 2: 64, 3: 96}
SCALE_BLOCK = {0: (0, 32), 1: (32, 64), 2: (64, 96), 3: (96, 128)}  # [first K, end K)
RESULT_ROW = {(g, e): 4 * g + e for g in range(4) for e in range(4)}
# fp4 (OCP e2m1) code -> value: codes 0-7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign.
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])

_LANES = range(64)
# K of each lane byte (fp8), of each lane nibble (fp4: nibble 2 b + h is byte b's low (h = 0) or
# high half), the lane whose scale applies at (row, K), and the (row, column) of each result
# lane element.
K_OF_BYTE = np.array([[PIECE_K[lane // 16][byte // 16] + byte % 16 for byte in range(32)] for lane in _LANES])
K_OF_NIBBLE = np.array([[FP4_K[lane // 16] + nibble for nibble in range(32)] for lane in _LANES])
ROW_OF_LANE = np.array([lane % 16 for lane in _LANES])
SCALE_LANE = np.array([[16 * next(g for g, (lo, hi) in SCALE_BLOCK.items() if lo <= k < hi) + row
                        for k in range(128)] for row in range(16)])
D_ROW = np.array([[RESULT_ROW[lane // 16, e] for e in range(4)] for lane in _LANES])
D_COLUMN = np.array([[lane % 16] * 4 for lane in _LANES])
