"""K2's index arithmetic beyond the layout's regions: which lane reads which q, record and
operand bytes, and which thread pushes which pair. Like templates/addressing.py, plain + - * // %
(and comparisons) on ints, torch tensors or FlyDSL values: the kernel's address code is traced
from these functions, and the CPU tests run them to emulate wo_a and wo_b through the
independent MFMA model and to bound every access (tests/templates/k2/test_k2_addressing.py)."""

from __future__ import annotations

from ..addressing import result_lane, split_steps
from ...deepseek_v4 import HEAD_DIM, NOPE
from ..geometry import MX_BLOCK, TILE_N, WAVE
from .attention_layout import HEADS_PER_GROUP, O_LORA, WOA_PARTS, K2Layout

RECORD_CHUNK = 16  # bytes: S2 reads a record's data as 16-byte chunks of the cache (byte offset // 16)
SLICE = HEAD_DIM // 32  # S2: 16 dims a lane, 32 lanes a head
NOPE_SLICES = NOPE // SLICE  # 28 lanes of a head read e4m3 bytes, the last 4 bf16 RoPE dims
GROUP_K = HEADS_PER_GROUP * HEAD_DIM  # wo_a's K a group: its 8 heads' 512 dims
WOA_STEPS = GROUP_K // 128 // WOA_PARTS  # K steps a wo_a task (one K half)


# -- S2 --------------------------------------------------------------------------------------

def s2_lane(tid):
    """(head in the tile, slice) of S2 thread `tid`: head tid / 32, dims 16 (tid % 32) .. + 15."""
    return tid // 32, tid % 32


def q_chunk(lay: K2Layout, row, head, s):
    """The first of the two 8-element chunks of q (bf16 [rows, heads, 512]) lane slice s reads."""
    return ((row * lay.heads + head) * HEAD_DIM + s * SLICE) // 8


def record_piece(data, s):
    """Byte offset of lane slice s's first 16 of the 32 bytes it reads from a record whose data
    starts at `data`: e4m3 dims 16 s .. + 15 (s < 28), or bf16 RoPE dims (s >= 28, 32 bytes);
    an e4m3 lane's second 16 bytes are read and not used (they stay inside the record)."""
    rope = s // NOPE_SLICES  # 1 for the RoPE lanes (s < 32)
    return data + s * SLICE + rope * (NOPE + (s - NOPE_SLICES) * 2 * SLICE - s * SLICE)


def record_code(scales, s):
    """Byte of the UE8M0 code of lane slice s's 64-dim block (RoPE lanes read block 6's)."""
    return scales + (s - s // NOPE_SLICES * (s - NOPE_SLICES + 1)) * SLICE // 64


# -- S3 / S5: the MXFP8 operand rows -------------------------------------------------------------

def xo_row(lay: K2Layout, row, head):
    """(first code byte, first E8M0 byte) of head `head`'s 512 values of wo_a's operand row."""
    width = lay.heads * HEAD_DIM
    return lay.xo_codes + row * width + head * HEAD_DIM, lay.xo_scales + (row * width + head * HEAD_DIM) // MX_BLOCK


def z_row(lay: K2Layout, row):
    """(first code byte, first E8M0 byte) of row `row` of wo_b's operand."""
    return lay.z_codes + row * lay.o_width, lay.z_scales + row * lay.o_width // MX_BLOCK


# -- S4: wo_a --------------------------------------------------------------------------------------

def woa_task(lay: K2Layout, task):
    """(first output row, K half, group) of wo_a task `task` (K2Layout.s4_task)."""
    tile, part = lay.s4_task(task)
    n0 = tile * TILE_N
    return n0, part, n0 // O_LORA


def woa_operand(lay: K2Layout, group):
    """(codes base, scales base, row width) of group `group`'s activations: its heads' columns
    of the xo rows, so K step s of the group reads xo columns group x 4096 + 128 s .. + 127."""
    return lay.xo_codes + group * GROUP_K, lay.xo_scales + group * GROUP_K // MX_BLOCK, lay.heads * HEAD_DIM


def woa_steps(part, wave):
    """(K step within the group, keep) of one wave of a wo_a task in K half `part`."""
    return split_steps(part * WOA_STEPS, WOA_STEPS, wave)


def wob_steps(lay: K2Layout, wave):
    """(K step, keep) of one wave of a wo_b task: the o_width / 128 steps over 8 waves."""
    return split_steps(0, lay.o_width // 128, wave)


# -- S6: the pairs a wo_b task pushes ---------------------------------------------------------------

def wob_pair(index, row_tiles: int):
    """(row tile, source lane, first element, real) of S6 pair slot `index` (a CTA runs slots
    tid, tid + 512): a slot adds elements e0, e0 + 1 of one result lane over the 8 waves, two
    neighbouring output columns of one token (result_lane), so they travel as one pair.
    Slots past the real ones (real false) name a row tile past the last: clamp before reading."""
    return index // (WAVE * 2), index % (WAVE * 2) // 2, index % 2 * 2, index < row_tiles * WAVE * 2


def wob_pair_target(task, src_lane, e0, t):
    """(token, first column) the pair of slot (t, src_lane, e0) of wo_b task `task` carries."""
    column, token = result_lane(src_lane, e0)
    return t * TILE_N + token, task * TILE_N + column
