"""A torch model of gfx950's v_mfma_scale_f32_16x16x128_f8f6f4 with e4m3 (fp8) or e2m1 (fp4)
operands, built on the emulator's one hardware model of that instruction
(`mono_jit/emulator/mfma_layout.py`: the operand, scale and result layouts with their sources,
code that runs on the hardware). mono-jit's addressing modules never import it, so a wrong
assumption in a kernel's addressing makes the tests that drive it through this model fail.

Mixed fp8 x fp4 is just cbsz != blgp: vLLM's routed experts pass (fp4 weights in A, fp8
activations in B) (stages/moe.py `fp4_pair_mfma`, `down_mfma`), AITER's A8W4 MoE the reverse.
"""

from __future__ import annotations

import torch

from mono_jit.emulator import mfma_layout as layout

FP8, FP4 = layout.FP8, layout.FP4
K_OF_BYTE = torch.from_numpy(layout.K_OF_BYTE)
K_OF_NIBBLE = torch.from_numpy(layout.K_OF_NIBBLE)
ROW_OF_LANE = torch.from_numpy(layout.ROW_OF_LANE)
SCALE_LANE = torch.from_numpy(layout.SCALE_LANE)
D_ROW = torch.from_numpy(layout.D_ROW)
D_COLUMN = torch.from_numpy(layout.D_COLUMN)
E2M1_VALUE = torch.from_numpy(layout.E2M1)


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
