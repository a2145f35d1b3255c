"""The scaled-MFMA FP8 GEMV of the persistent kernels (FlyDSL; kernel modules only): e4m3
weights with 128 x 128 E8M0 block codes (row-major or AITER-preshuffled) times MXFP8 activation
rows, 16 weight rows x 16 tokens per v_mfma_scale_f32_16x16x128_f8f6f4.

The operand layout is templates/addressing.py's (cited there from vLLM's, Triton's and AITER's gfx950
code, and tested through tests/support/mfma_model.py): K1's two GEMVs and K2's wo_a and wo_b all build
their operands here, so one layout serves both launches.
"""


import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl.expr import gpu, range_constexpr

from . import addressing
from ._dsl import dsl, load, load_code, pointer_code, store_scalar
from .geometry import THREADS, TILE_N, WAVE, WAVES


FP8, FP4 = 0, 4  # the scaled MFMA's operand format codes (cbsz for A, blgp for B): e4m3, e2m1


def mfma(a, b, acc, scale_a, scale_b, a_format: int = FP8):
    """v_mfma_scale_f32_16x16x128_f8f6f4: acc + (A x 2^scale_a) (B x 2^scale_b); B is e4m3, A is
    e4m3 or (a_format FP4) e2m1 in its words 0-3 (k2/moe_addressing.py has the fp4 layout)."""
    f32x4 = ir.VectorType.get([4], ir.F32Type.get())
    out = fx.rocdl.mfma_scale_f32_16x16x128_f8f6f4(f32x4, [a, b, acc, a_format, FP8, 0, scale_a, 0, scale_b])
    return fx.Vector(out, (4,), fx.Float32)


def operand(view16, lo, hi):
    """Two 16-byte pieces at 16-aligned byte offsets as the 8 x i32 of an f8 MFMA operand."""
    first = load(view16, lo // 16, fx.Uint8, 16).bitcast(fx.Int32)
    second = load(view16, hi // 16, fx.Uint8, 16).bitcast(fx.Int32)
    return first.shuffle(second, list(range(8)))


class Fp8Weight:
    """An e4m3 weight [N, K] with E8M0 codes per 128 x 128 block, as vLLM may hold it: row-major
    with a row stride in bytes (rows padded by VLLM_ROCM_FP8_PADDING), or AITER's (16, 16)
    preshuffle, [N/16][K/32][2][16 rows][16 bytes] (aiter/ops/shuffle.py, shuffle_weight).
    `view` is a 16-byte-chunk view of its bytes, `scales` a pointer to its codes."""

    def __init__(self, view, scales, k: int, stride, shuffled):
        self.view, self.scales, self.k = view, scales, k
        self.stride, self.shuffled = stride, shuffled != 0

    def _offset(self, row, k0):
        return self.shuffled.select(addressing.preshuffled_offset(row, k0, self.k),
                                    addressing.row_major_offset(row, k0, self.stride))

    def operand(self, row, pieces):
        """The two 16-byte pieces (K pieces[0] .. + 15, pieces[1] .. + 15) of `row`."""
        return operand(self.view, self._offset(row, pieces[0]), self._offset(row, pieces[1]))

    def scale(self, row, step):
        return pointer_code(self.scales, addressing.block_scale_index(row, step, self.k))


class Mxfp8Rows:
    """MXFP8 activations in the byte scratch: rows of k e4m3 bytes at `codes`, k / 32 codes at `scales`."""

    def __init__(self, u8x16, u8, codes, scales, k: int):
        self.u8x16, self.u8, self.codes, self.scales, self.k = u8x16, u8, codes, scales, k

    def row(self, token):
        """The row a token's operand lanes read: its own (PickRows reads another's)."""
        return token

    def operand(self, token, pieces):
        return operand(self.u8x16, addressing.mx_code_offset(self.codes, token, pieces[0], self.k),
                        addressing.mx_code_offset(self.codes, token, pieces[1], self.k))

    def scale(self, token, block):
        return load_code(self.u8, addressing.mx_scale_offset(self.scales, token, block, self.k))


def gemv_steps(weight, acts, w_row, steps, lane, row_tiles):
    """Accumulators [row tile] over K steps for weight rows w_row .. w_row + 15 x all tokens.

    `steps` lists (step, keep): keep None, or a predicate under which the step counts (a wave
    with nothing to do computes a duplicate step and drops it, keeping control flow uniform).
    Operand lanes follow addressing.py's layout: two 16-byte pieces 64 K apart and the scale of
    K block lane / 16, for the weight and the activations alike.
    """
    accs = [fx.Vector.filled(4, 0.0, fx.Float32) for _ in range_constexpr(row_tiles)]
    row = w_row + addressing.operand_row(lane)
    for step, keep in steps:
        pieces = addressing.operand_pieces(step, lane)
        block = addressing.operand_block(step, lane)
        a, scale_a = weight.operand(row, pieces), weight.scale(row, step)
        for t in range_constexpr(row_tiles):
            token = addressing.operand_token(t, lane)
            acc = mfma(a, acts.operand(token, pieces), accs[t], scale_a, acts.scale(token, block))
            accs[t] = acc if keep is None else keep.select(acc, accs[t])
    return accs


@dsl
def gemv_reduce(accs, lds_acc, tid, wave, lane, waves_per_tile, row_tiles, out, out_base, out_width, n0, m):
    """Add the accumulators of the `waves_per_tile` waves of each tile; store rows < m (f32).

    Wave w works on tile w // waves_per_tile; lane l's accumulator element e is output row
    n0(tile) + 4 (l / 16) + e for token l % 16 (+ 16 per row tile).
    """
    for t in range_constexpr(row_tiles):
        for e in range_constexpr(4):
            fx.memref_store(accs[t][e], lds_acc, addressing.lds_acc_slot(wave, t, lane, e, row_tiles))
    gpu.barrier()
    tiles = WAVES // waves_per_tile
    for rep in range_constexpr((tiles * row_tiles * WAVE * 4 + THREADS - 1) // THREADS):
        tile, t, src_lane, e, real = addressing.split_k_sum(tid + rep * THREADS, waves_per_tile, row_tiles)
        tile = fx.min(tile, tiles - 1)  # spare slots read a real accumulator and store nothing
        total = fx.Float32(0.0)
        for w in range_constexpr(waves_per_tile):
            total = total + fx.memref_load(lds_acc, addressing.lds_acc_slot(tile * waves_per_tile + w, t, src_lane, e,
                                                                     row_tiles))
        row, column = addressing.result_lane(src_lane, e)
        token = t * TILE_N + column
        if real & (token < m):
            store_scalar(out, out_base + token * out_width + n0 + tile * TILE_N + row, total, fx.Float32)
