"""The routed experts' MXFP4 x MXFP8 GEMVs on the CPU: the fp4 operand of the MFMA model
(tests/support/mfma_model.py) against a plain dequantised matmul and against plausible wrong lane layouts,
then an expert's gate / up and down GEMVs emulated MFMA by MFMA through the kernel's addressing
(templates/k2/moe_addressing.py for the weights, templates/addressing.py for the activations) over
weights laid out by AITER's shuffles, which are re-implemented here from their documented
permutations (aiter/ops/shuffle.py `shuffle_weight(is_guinterleave=True)` and `shuffle_scale(...,
is_guinterleave=True)`, as vLLM's AITER_MXFP4_BF16 loading calls them) and checked against
AITER's own functions where AITER is importable."""

from __future__ import annotations

import mfma_model as mm
import pytest
import torch
from gemv_model import Mxfp8Scratch

from mono_jit import deepseek_v4
from mono_jit.templates import addressing as shared_addressing
from mono_jit.templates import reference_math as rmath
from mono_jit.templates.k2 import moe_addressing as ma

H = deepseek_v4.HIDDEN
INTER = deepseek_v4.MOE_INTERMEDIATE // 8  # a routed expert's rank share at TP 8
EXPERTS = 3  # the emulated expert is the last: its offsets carry a non-zero expert base
LANES = torch.arange(64)
BYTES16 = torch.arange(16)
ELEMENTS = torch.arange(4)


# -- fp4 data and AITER's shuffles, re-implemented --------------------------------------------

def _codes(shape, g: torch.Generator) -> torch.Tensor:
    """Random e2m1 codes (every one of the 16 is a finite value)."""
    return torch.randint(0, 16, shape, generator=g, dtype=torch.uint8)


def _pack(codes: torch.Tensor) -> torch.Tensor:
    """Two e2m1 codes a byte along the last dim, the even one in the low nibble (torch's
    float4_e2m1fn_x2, AITER's fp4 packing)."""
    return codes[..., 0::2] + codes[..., 1::2] * 16


def _dequantise(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float64 values of e2m1 codes [..., k] with one E8M0 code per 32 along k."""
    return mm.e2m1_value(codes) * torch.exp2(scales.double() - 127).repeat_interleave(32, dim=-1)


def shuffle_weight(w: torch.Tensor, gate_up: bool) -> torch.Tensor:
    """AITER shuffle_weight(w [E, N, K / 2], layout=(16, 16), is_guinterleave=True, gate_up):
    NLane 16, KLane 4, KPack 16; gate_up views the rows as (2, N / 32, 16) and moves the gate /
    up axis inside the 16-row tile index."""
    e, n, kb = w.shape
    if gate_up:
        view = w.view(e, 2, n // 32, 16, kb // 64, 4, 16).permute(0, 2, 1, 4, 5, 3, 6)
    else:
        view = w.view(e, n // 16, 16, kb // 64, 4, 16).permute(0, 1, 3, 4, 2, 5)
    return view.contiguous().view(e, n, kb)


def shuffle_scale(s: torch.Tensor, experts: int, gate_up: bool) -> torch.Tensor:
    """AITER shuffle_scale(s [E N, K / 32], experts, is_guinterleave=True, gate_up): columns
    padded to a multiple of 8 with 0x7F, then [E][N / 32][K1][KLane 4][NLane 16][KPack 2][NPack 2],
    NPack the outermost row axis (gate / up) for gate_up, the 16-row half of 32 for down."""
    rows, cols = s.shape
    padded = torch.full((rows, -(-cols // 8) * 8), 0x7F, dtype=torch.uint8)
    padded[:, :cols] = s
    n, k1 = rows // experts, padded.shape[1] // 8
    if gate_up:
        view = padded.view(experts, 2, n // 32, 16, k1, 2, 4).permute(0, 2, 4, 6, 3, 5, 1)
    else:
        view = padded.view(experts, n // 32, 2, 16, k1, 2, 4).permute(0, 1, 4, 6, 3, 5, 2)
    return view.contiguous().view(rows, padded.shape[1])


class Expert:
    """E experts' fp4 weight [E, rows, k] (w13: rows = 2 inter, gate rows first) with its E8M0
    codes, raw and as vLLM's loading leaves them (flat bytes)."""

    def __init__(self, rows: int, k: int, gate_up: bool, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.rows, self.k, self.gate_up = rows, k, gate_up
        self.codes = _codes((EXPERTS, rows, k), g)
        self.scales = torch.randint(118, 128, (EXPERTS, rows, k // 32), generator=g, dtype=torch.uint8)
        self.raw = _pack(self.codes)
        self.flat = shuffle_weight(self.raw, gate_up).flatten()
        self.scale_flat = shuffle_scale(self.scales.view(EXPERTS * rows, -1), EXPERTS, gate_up).flatten()

    def dequantised(self, expert: int) -> torch.Tensor:
        return _dequantise(self.codes[expert], self.scales[expert])

    def tile_row(self, tile, row):
        """The raw row a tile row is: w13_row for w13, plain 16-row tiles for w2."""
        return ma.w13_row(tile, row, self.rows // 2) if self.gate_up else tile * 16 + row


@pytest.fixture(scope="module")
def w13() -> Expert:
    return Expert(2 * INTER, H, gate_up=True, seed=11)


@pytest.fixture(scope="module")
def w2() -> Expert:
    return Expert(H, INTER, gate_up=False, seed=12)


def test_the_reimplemented_shuffles_are_aiters():
    shuffle = pytest.importorskip("aiter.ops.shuffle", reason="AITER is not installed here (no ROCm)")
    w = Expert(64, 512, gate_up=True, seed=1)
    raw = w.raw.view(torch.float4_e2m1fn_x2)
    assert torch.equal(shuffle.shuffle_weight_a16w4(raw, 16, True).view(torch.uint8).flatten(), w.flat)
    aiter_scales = shuffle.shuffle_scale_a16w4(w.scales.view(EXPERTS * 64, -1), EXPERTS, True)
    assert torch.equal(aiter_scales.view(torch.uint8).flatten(), w.scale_flat)


# -- the fp4 operand of the MFMA model ----------------------------------------------------------

def _lanes_fp4(codes: torch.Tensor, k_of_group) -> torch.Tensor:
    """[64, 32] lane bytes of a 16 x 128 code tile: lane 16 g + r gets row r's 32 values at the
    K `k_of_group(g)` lists, packed (words 4-7 zero, as AITER passes an fp4 operand)."""
    lanes = torch.zeros(64, 32, dtype=torch.uint8)
    for lane in range(64):
        lanes[lane, :16] = _pack(codes[lane % 16, k_of_group(lane // 16)])
    return lanes


def _contiguous_32(g: int) -> torch.Tensor:
    """The sources' fp4 lane map: K 32 g .. 32 g + 31."""
    return torch.arange(32 * g, 32 * g + 32)


def _operand(fmt: int, g: torch.Generator, k_of_group=_contiguous_32):
    """(lane bytes, lane scales, dequantised 16 x 128 matrix) of a random operand whose four K
    blocks a row have different scales."""
    scales = torch.randint(120, 134, (16, 4), generator=g, dtype=torch.uint8)
    if fmt == mm.FP4:
        codes = _codes((16, 128), g)
        lanes, values = _lanes_fp4(codes, k_of_group), _dequantise(codes, scales)
    else:
        data = (torch.randn(16, 128, generator=g) * 8).to(torch.float8_e4m3fn).view(torch.uint8)
        lanes = torch.stack([torch.cat([data[lane % 16, 16 * (lane // 16):][:16],
                                        data[lane % 16, 64 + 16 * (lane // 16):][:16]]) for lane in range(64)])
        values = data.view(torch.float8_e4m3fn).double() * torch.exp2(scales.double() - 127).repeat_interleave(32, 1)
    lane_scales = scales[LANES % 16, LANES // 16]
    return lanes, lane_scales, values


def _as_result_lanes(d: torch.Tensor) -> torch.Tensor:
    """D [16, 16] in the result lane order: lane 16 g + c, element e is D[4 g + e, c]."""
    return d[4 * (LANES[:, None] // 16) + ELEMENTS[None, :], LANES[:, None] % 16]


@pytest.mark.parametrize("cbsz, blgp", [(mm.FP4, mm.FP8), (mm.FP8, mm.FP4), (mm.FP4, mm.FP4), (mm.FP8, mm.FP8)])
def test_the_mfma_model_is_a_dequantised_matmul(cbsz, blgp):
    g = torch.Generator().manual_seed(cbsz * 8 + blgp)
    a, sa, a_values = _operand(cbsz, g)
    b, sb, b_values = _operand(blgp, g)
    acc = torch.randn(64, 4, generator=g, dtype=torch.float64)
    got = mm.mfma(a, sa, b, sb, acc, cbsz=cbsz, blgp=blgp)
    torch.testing.assert_close(got, acc + _as_result_lanes(a_values @ b_values.T), rtol=1e-12, atol=1e-12)


def test_the_fp4_model_ignores_words_4_to_7():
    g = torch.Generator().manual_seed(2)
    a, sa, _ = _operand(mm.FP4, g)
    b, sb, _ = _operand(mm.FP8, g)
    noisy = a.clone()
    noisy[:, 16:] = torch.randint(0, 256, (64, 16), generator=g, dtype=torch.uint8)
    zero = torch.zeros(64, 4, dtype=torch.float64)
    assert torch.equal(mm.mfma(noisy, sa, b, sb, zero, mm.FP4, mm.FP8), mm.mfma(a, sa, b, sb, zero, mm.FP4, mm.FP8))


def _fp8_like_split(g: int) -> torch.Tensor:
    """fp8's piece split carried over to fp4: K 16 g .. + 15 in bytes 0-7, 64 + 16 g .. in 8-15."""
    return torch.cat([torch.arange(16 * g, 16 * g + 16), torch.arange(64 + 16 * g, 80 + 16 * g)])


def _nibbles_swapped(g: int) -> torch.Tensor:
    """The high nibble taken as the lower K."""
    return (torch.arange(32 * g, 32 * g + 32).view(16, 2).flip(1)).flatten()


@pytest.mark.parametrize("wrong", [_fp8_like_split, _nibbles_swapped])
def test_the_fp4_model_rejects_plausible_wrong_lane_layouts(wrong):
    """Lane bytes packed by a wrong map give a product far from the dequantised matmul."""
    g = torch.Generator().manual_seed(3)
    a, sa, a_values = _operand(mm.FP4, g, k_of_group=wrong)
    b, sb, b_values = _operand(mm.FP8, g)
    got = mm.mfma(a, sa, b, sb, torch.zeros(64, 4, dtype=torch.float64), mm.FP4, mm.FP8)
    want = _as_result_lanes(a_values @ b_values.T)
    assert (got - want).norm() / want.norm() > 0.3


def test_the_fp4_lane_map_is_the_models():
    assert torch.equal(mm.K_OF_NIBBLE, mm.K_OF_NIBBLE[:, :1] + torch.arange(32))  # 32 consecutive K a lane
    for step in range(3):
        k0 = ma.fp4_operand_k(step, LANES)
        assert torch.equal(k0 - step * 128, mm.K_OF_NIBBLE[:, 0])
        block = ma.fp4_operand_block(step, LANES)
        assert torch.equal(16 * (block - 4 * step) + LANES % 16, mm.SCALE_LANE[LANES % 16, k0 % 128])
        assert torch.equal(block, shared_addressing.operand_block(step, LANES))  # the activations' block, lane by lane


# -- an expert's GEMVs through the addressing ----------------------------------------------------

def _activations(m: int, k: int, seed: int) -> tuple[Mxfp8Scratch, torch.Tensor]:
    """MXFP8 rows whose per-32 codes differ inside every 128-step, in K1's operand scratch, and
    their dequantised values."""
    g = torch.Generator().manual_seed(seed)
    block_scale = torch.exp2(torch.randint(-6, 7, (m, k // 32), generator=g).float())
    codes, scales = rmath.mxfp8_quantize(torch.randn(m, k, generator=g) * block_scale.repeat_interleave(32, dim=1))
    return Mxfp8Scratch(codes, scales, m, 16, k), rmath.mxfp8_dequantize(codes, scales).double()


def _emulate(w: Expert, expert: int, acts: Mxfp8Scratch, m: int) -> torch.Tensor:
    """[m, rows] in the weight's tile order: per 16-row tile, the MFMAs over every K step with the
    fp4 weight tile in A (cbsz FP4) and 16 activation rows in B (blgp FP8)."""
    steps = w.k // 128
    bs = [acts.operand(shared_addressing.operand_token(0, LANES), step) for step in range(steps)]
    out = torch.zeros(16, w.rows, dtype=torch.float64)
    i, j = shared_addressing.result_lane(LANES[:, None], ELEMENTS[None, :])
    for tile in range(w.rows // 16):
        acc = torch.zeros(64, 4, dtype=torch.float64)
        for step, (b, sb) in enumerate(bs):
            a = w.flat[ma.weight_offset(expert, tile, step, LANES, w.rows, w.k)[:, None] + BYTES16]
            sa = w.scale_flat[ma.scale_offset(expert, tile, step, LANES, w.rows, w.k)]
            acc = mm.mfma(a, sa, b, sb, acc, cbsz=mm.FP4, blgp=mm.FP8)
        out[j, tile * 16 + i] = acc
    return out[:m]


@pytest.mark.slow
def test_gate_up_through_the_addressing_is_the_dequantised_gemv_interleaved_by_16_row_tiles(w13):
    m, expert = 5, EXPERTS - 1
    acts, x = _activations(m, H, seed=13)
    got = _emulate(w13, expert, acts, m)
    weight = w13.dequantised(expert)
    gate, up = x @ weight[:INTER].T, x @ weight[INTER:].T
    interleaved = torch.stack([gate.view(m, -1, 16), up.view(m, -1, 16)], dim=2).flatten(1)
    torch.testing.assert_close(got, interleaved, rtol=1e-9, atol=1e-9)
    for block in (0, 7, INTER // 16 - 1):  # tile 2 b: gate columns 16 b .., tile 2 b + 1: up
        cols = torch.arange(16)
        assert torch.equal(got[:, ma.w13_tile(block, 0) * 16 + cols], gate[:, block * 16 + cols])
        assert torch.equal(got[:, ma.w13_tile(block, 1) * 16 + cols], up[:, block * 16 + cols])


def test_down_through_the_addressing_is_the_dequantised_gemv(w2):
    m, expert = 3, EXPERTS - 1
    acts, x = _activations(m, INTER, seed=14)
    got = _emulate(w2, expert, acts, m)
    torch.testing.assert_close(got, x @ w2.dequantised(expert).T, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("which", ["w13", "w2"])
def test_every_lane_reads_its_rows_k_values_and_block_code(which, request):
    """Byte for byte: the 16 bytes at weight_offset are the lane's row's fp4 K fp4_operand_k ..
    + 31 as loaded, and the code at scale_offset is that row's E8M0 of fp4_operand_block."""
    w: Expert = request.getfixturevalue(which)
    tiles = torch.arange(w.rows // 16)[:, None, None]
    steps = torch.arange(w.k // 128)[None, :, None]
    lanes = LANES[None, None, :]
    for expert in range(EXPERTS):
        rows = w.tile_row(tiles, lanes % 16)
        first = ma.fp4_operand_k(steps, lanes) // 2
        want = w.raw[expert][rows[..., None], first[..., None] + BYTES16]
        got = w.flat[ma.weight_offset(expert, tiles, steps, lanes, w.rows, w.k)[..., None] + BYTES16]
        assert torch.equal(got, want)
        codes = w.scale_flat[ma.scale_offset(expert, tiles, steps, lanes, w.rows, w.k)]
        assert torch.equal(codes, w.scales[expert][rows, ma.fp4_operand_block(steps, lanes)])


@pytest.mark.parametrize("rows, k", [(2 * INTER, H), (H, INTER)])
def test_offsets_cover_one_experts_bytes_once_and_stay_inside_it(rows, k):
    """Real geometry: over every tile, K step and lane of experts 0, 1 and the last, the weight
    pieces tile the expert's bytes exactly and the scale codes hit each real code once, only the
    padding columns unread, all inside the expert's weight and scale bytes."""
    tiles = torch.arange(rows // 16)[:, None, None]
    steps = torch.arange(k // 128)[None, :, None]
    weight_bytes, scale_bytes = ma.expert_weight_bytes(rows, k), ma.expert_scale_bytes(rows, k)
    assert scale_bytes == rows * -(-(k // 32) // 8) * 8
    for expert in (0, 1, deepseek_v4.ROUTED_EXPERTS - 1):
        pieces = ma.weight_offset(expert, tiles, steps, LANES, rows, k).flatten()
        assert torch.equal(pieces.sort().values, expert * weight_bytes + torch.arange(0, weight_bytes, 16))
        codes = ma.scale_offset(expert, tiles, steps, LANES, rows, k).flatten() - expert * scale_bytes
        assert codes.min() >= 0 and codes.max() < scale_bytes
        assert codes.unique().numel() == codes.numel() == rows * (k // 32)
    shuffled = shuffle_scale(torch.zeros(rows, k // 32, dtype=torch.uint8), 1, rows == 2 * INTER).flatten()
    padding = (shuffled == 0x7F).nonzero().flatten()  # the 0x7F columns shuffle_scale appends
    assert padding.numel() == rows * (ma.scale_cols(k) - k // 32) and not torch.isin(padding, codes).any()


def test_a_scale_dword_serves_the_tile_pair_and_the_step_pair(w13):
    """scale_word_offset is 4-aligned, the same for tiles 2 t, 2 t + 1 and steps 2 s, 2 s + 1, and
    the code sits at byte 2 (step % 2) + tile % 2 of it."""
    tiles = torch.arange(w13.rows // 16)[:, None, None]
    steps = torch.arange(H // 128)[None, :, None]
    word = ma.scale_word_offset(1, tiles, steps, LANES, w13.rows, H)
    code = ma.scale_offset(1, tiles, steps, LANES, w13.rows, H)
    assert (word % 4 == 0).all() and torch.equal(code - word, (2 * (steps % 2) + tiles % 2).expand_as(word))
    assert torch.equal(word[0::2], word[1::2]) and torch.equal(word[:, 0::2], word[:, 1::2])
