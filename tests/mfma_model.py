"""A model of gfx950's v_mfma_scale_f32_16x16x128_f8f6f4 with e4m3 operands, written as data
from code that runs on the hardware, not from mono-jit's addressing module, so that a wrong
assumption in the kernel's addressing makes the tests that drive it through this model fail.

Operand lanes (A and B alike; lane = 16 g + r holds row r of A, column r of B):
  - words 0-3: K 16 g .. 16 g + 15 of the 128-step; words 4-7: K 64 + 16 g .. 64 + 16 g + 15.
    vLLM 0.33 deepseek_v4/amd/mono/attention/gemv.py `_step_load` loads the weight at
    `128 * st + 16 * j` and `+ 64`, and `_step_mfma` the activations at words `st * 32 + j * 4`
    and `+ 16`; AITER bmm_a8w8_mxscale_gfx950.py `_pair` ("fp8 halves 64 K apart form one
    i32[8] MFMA operand"); Triton AccelerateAMDMatmul.cpp gives fp8 kWidth = kBase / 2 = 16.
  - the lane's scale byte is the E8M0 of K block g (K 32 g .. 32 g + 31): vLLM `_step_load`
    `wsi = ... + st * 4 + j` and `_step_mfma` `xsl + ... + st * 4 + j`; Triton
    LinearLayoutConversions.cpp `chooseScaledMfmaScaleLayout` (lane bits 4-5 select the scale
    column); AITER bmm_a8w8_mxscale_gfx950.py `scale_col` (`col + kgrp`).
Result: lane 16 g + c, element e is D[4 g + e, c] (vLLM gemv_mfmas' docstring; FlyDSL CDNA4
MmaAtom.cpp getThrValLayoutC).
"""

from __future__ import annotations

import torch

# Lane group g -> first K of its two 16-byte pieces, and the K block its scale covers.
PIECE_K = {0: (0, 64), 1: (16, 80), 2: (32, 96), 3: (48, 112)}
SCALE_BLOCK = {0: (0, 32), 1: (32, 64), 2: (64, 96), 3: (96, 128)}  # [first K, end K)
RESULT_ROW = {(g, e): 4 * g + e for g in range(4) for e in range(4)}


# The tables above as index tensors: the K of each lane byte, the lane whose scale applies at
# (row, K), and the (row, column) of each result lane element.
_LANES = range(64)
K_OF_BYTE = torch.tensor([[PIECE_K[lane // 16][byte // 16] + byte % 16 for byte in range(32)] for lane in _LANES])
ROW_OF_LANE = torch.tensor([lane % 16 for lane in _LANES])
SCALE_LANE = torch.tensor([[16 * next(g for g, (lo, hi) in SCALE_BLOCK.items() if lo <= k < hi) + row
                            for k in range(128)] for row in range(16)])
D_ROW = torch.tensor([[RESULT_ROW[lane // 16, e] for e in range(4)] for lane in _LANES])
D_COLUMN = torch.tensor([[lane % 16] * 4 for lane in _LANES])


def operand_matrix(lane_bytes: torch.Tensor, lane_scales: torch.Tensor) -> torch.Tensor:
    """The 16 x 128 scaled operand the hardware forms from [64, 32] lane bytes (uint8) and [64]
    E8M0 codes."""
    values = torch.zeros(16, 128, dtype=torch.float64)
    values[ROW_OF_LANE[:, None], K_OF_BYTE] = lane_bytes.view(torch.float8_e4m3fn).to(torch.float64)
    scale = torch.exp2(lane_scales.to(torch.float64)[SCALE_LANE] - 127)
    return values * scale


def mfma(a_bytes, a_scales, b_bytes, b_scales, acc: torch.Tensor) -> torch.Tensor:
    """acc [64, 4] (lane, element) plus A B^T, in the hardware's result lane order."""
    d = operand_matrix(a_bytes, a_scales) @ operand_matrix(b_bytes, b_scales).T
    return acc + d[D_ROW, D_COLUMN]
