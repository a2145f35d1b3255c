"""A model of gfx950's v_mfma_scale_f32_16x16x128_f8f6f4 with e4m3 (fp8) or e2m1 (fp4) operands,
written as data from code that runs on the hardware, not from mono-jit's addressing modules, so
that a wrong assumption in a kernel's addressing makes the tests that drive it through this
model fail.

Formats (cbsz for A, blgp for B): 0 = fp8 e4m3, 4 = fp4 e2m1. vLLM 0.33 deepseek_v4/amd/mono/
common/mx.py (`FP8, FP4 = 0, 4`, "the f8f6f4 MFMA's operand formats (cbsz / blgp)");
AITER aiter/ops/flydsl/kernels/mixed_moe_gemm_2stage_common.py (`cbsz = 0 if is_f8_a else 4`,
`blgp = 0 if is_f8_b else 4`); LLVM's verifier of the intrinsic (formats 0/1 take 8 i32 registers,
2/3 six, 4 four; excess registers allowed). Mixed fp8 x fp4 is just cbsz != blgp: vLLM's routed
experts pass (fp4 weights in A, FP4; fp8 activations in B, FP8) (stages/moe.py `fp4_pair_mfma`,
`down_mfma`), AITER's A8W4 MoE (fp8 activations in A, fp4 weights in B).

Operand lanes (A and B alike; lane = 16 g + r holds row r of A, column r of B):
  - fp8: words 0-3 hold K 16 g .. 16 g + 15 of the 128-step, words 4-7 K 64 + 16 g .. + 15.
    vLLM 0.33 deepseek_v4/amd/mono/attention/gemv.py `_step_load` loads the weight at
    `128 * st + 16 * j` and `+ 64`, and `_step_mfma` the activations at words `st * 32 + j * 4`
    and `+ 16`; AITER bmm_a8w8_mxscale_gfx950.py `_pair` ("fp8 halves 64 K apart form one
    i32[8] MFMA operand"); Triton AccelerateAMDMatmul.cpp gives fp8 kWidth = kBase / 2 = 16.
  - fp4: words 0-3 hold K 32 g .. 32 g + 31, two values a byte, the lower K in the low nibble;
    words 4-7 are not read. Triton LinearLayoutConversions.cpp `chooseScaledMfmaScaleLayout`
    ("with fp4 input, each lane takes 32 consecutive elements ... the first 16 lanes handle
    A[0:16][0:32], another 16 lanes A[0:16][32:64]"); AITER mixed_moe_gemm_2stage_common.py
    (an fp4 A operand is one 16-byte LDS read at `lane_div_16 * 16 + k * 128 / 2` of the packed
    row, upper i64 pair zero; an fp4 B one 16-byte load, fp8 B two 64 apart); vLLM mono
    common/mx.py `fp4_tile_load` ("32 fp4, K block lane / 16 of row lane % 16"). Nibble order:
    torch's float4_e2m1fn_x2 (val0 in bits 0-3), AITER fp4_utils.py `mxfp4_to_f32` (even K the
    low nibble), the packing those kernels feed the MFMA unchanged.
  - the lane's scale byte is the E8M0 of K block g (K 32 g .. 32 g + 31) for either format:
    vLLM `_step_load` `wsi = ... + st * 4 + j`, `_step_mfma` `xsl + ... + st * 4 + j` and
    moe.py `gemv_fp4_pair` (scale column `(st0 + i) * 4 + lane // 16`); Triton
    `chooseScaledMfmaScaleLayout` (lane bits 4-5 select the scale column, one scale a lane for
    fp4); AITER bmm_a8w8_mxscale_gfx950.py `scale_col` (`col + kgrp`).
Result: lane 16 g + c, element e is D[4 g + e, c] (vLLM gemv_mfmas' docstring and moe.py
`down_mfma`, row `4 * (lane // 16) + q`; FlyDSL CDNA4 MmaAtom.cpp getThrValLayoutC).
"""

from __future__ import annotations

import torch

FP8, FP4 = 0, 4  # cbsz / blgp format codes

# Lane group g -> first K of its two 16-byte fp8 pieces, the first K of its 32 fp4 values, and
# the K block its scale covers.
PIECE_K = {0: (0, 64), 1: (16, 80), 2: (32, 96), 3: (48, 112)}
FP4_K = {0: 0, 1: 32, 2: 64, 3: 96}
SCALE_BLOCK = {0: (0, 32), 1: (32, 64), 2: (64, 96), 3: (96, 128)}  # [first K, end K)
RESULT_ROW = {(g, e): 4 * g + e for g in range(4) for e in range(4)}
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # codes 0-7; bit 3 is the sign


# The tables above as index tensors: the K of each lane byte (fp8) or nibble (fp4, nibble
# 2 b + h is byte b's low (h = 0) or high half), the lane whose scale applies at (row, K), and
# the (row, column) of each result lane element.
_LANES = range(64)
K_OF_BYTE = torch.tensor([[PIECE_K[lane // 16][byte // 16] + byte % 16 for byte in range(32)] for lane in _LANES])
K_OF_NIBBLE = torch.tensor([[FP4_K[lane // 16] + nibble for nibble in range(32)] for lane in _LANES])
ROW_OF_LANE = torch.tensor([lane % 16 for lane in _LANES])
SCALE_LANE = torch.tensor([[16 * next(g for g, (lo, hi) in SCALE_BLOCK.items() if lo <= k < hi) + row
                            for k in range(128)] for row in range(16)])
D_ROW = torch.tensor([[RESULT_ROW[lane // 16, e] for e in range(4)] for lane in _LANES])
D_COLUMN = torch.tensor([[lane % 16] * 4 for lane in _LANES])
E2M1_VALUE = torch.tensor(E2M1 + tuple(-v for v in E2M1), dtype=torch.float64)


def e2m1_value(codes: torch.Tensor) -> torch.Tensor:
    """float64 values of 4-bit e2m1 codes (0 .. 15)."""
    return E2M1_VALUE[codes.long()]


def operand_matrix(lane_bytes: torch.Tensor, lane_scales: torch.Tensor, fmt: int = FP8) -> torch.Tensor:
    """The 16 x 128 scaled operand the hardware forms from [64, 32] lane bytes (uint8; fp4 reads
    the first 16) and [64] E8M0 codes, in format `fmt`."""
    values = torch.zeros(16, 128, dtype=torch.float64)
    if fmt == FP8:
        values[ROW_OF_LANE[:, None], K_OF_BYTE] = lane_bytes.view(torch.float8_e4m3fn).to(torch.float64)
    elif fmt == FP4:
        words = lane_bytes[:, :16].long()
        nibbles = torch.stack([words % 16, words // 16], dim=2).flatten(1)
        values[ROW_OF_LANE[:, None], K_OF_NIBBLE] = e2m1_value(nibbles)
    else:
        raise ValueError(f"format {fmt} is not modelled")
    scale = torch.exp2(lane_scales.to(torch.float64)[SCALE_LANE] - 127)
    return values * scale


def mfma(a_bytes, a_scales, b_bytes, b_scales, acc: torch.Tensor, cbsz: int = FP8, blgp: int = FP8) -> torch.Tensor:
    """acc [64, 4] (lane, element) plus A B^T, in the hardware's result lane order; `cbsz` and
    `blgp` are A's and B's formats."""
    d = operand_matrix(a_bytes, a_scales, cbsz) @ operand_matrix(b_bytes, b_scales, blgp).T
    return acc + d[D_ROW, D_COLUMN]
