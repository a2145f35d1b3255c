"""The figures the persistent kernels share, each stated once: the launch's shape, the scaled
MFMA's tiles and operand formats, vLLM's fp8_ds_mla KV record, the mHC seam's split into tasks and
the LDS areas the shared seam and GEMV code use.

Pure Python (no FlyDSL, no torch): K1, K2, the stand-alone templates, the shared device helpers,
the runner, the self-checks and the tests read them from here. A template's layout module states
only what is its own; DeepSeek-V4's widths are mono_jit/deepseek_v4.py's.
"""

from ..deepseek_v4 import HIDDEN, MAX_DECODE_TOKENS, MIXES
from ..hsaco.resources import MI355X_CUS

# -- the persistent launch: every CTA resident, one a CU ---------------------------------------
CTAS = MI355X_CUS  # 256
THREADS = 512
WAVE = 64  # gfx950's wavefront
WAVES = THREADS // WAVE  # 8
PEERS = 8  # entries of K2's peer-address table: always eight, 0 past tp (a stable ABI)
PAIR_BYTES = 8  # a peer buffer's (value, tag) pair: one 8-byte store

# -- the scaled MFMA v_mfma_scale_f32_16x16x128_f8f6f4 and its operands' formats ---------------
TILE_N = 16  # 16 weight rows x 16 tokens an instruction
TILE_K = 128
MX_BLOCK = 32  # MXFP8 / MXFP4: one E8M0 code per 32 values
WEIGHT_BLOCK = 128  # checkpoint block scales: 128 x 128
E4M3_MAX = 448.0

# -- vLLM's fp8_ds_mla KV record: 448 e4m3 NoPE dims, 64 bf16 RoPE dims, 7 UE8M0 codes, a pad ---
KV_RECORD = 584
KV_DATA = 576  # a page holds its records' data rows first ..
KV_SCALES = 8  # .. then their scale rows
KV_SCALE_BLOCK = 64  # NoPE dims a UE8M0 code covers

# -- the mHC seam's tasks: (row group, column chunk) partial sums, then a row's gate -----------
PARTIALS = MIXES + 1  # the 24 mix dot products and the sum of squares
SEAM_CHUNK = 128  # columns of a fold task (x 4 streams = one a thread)
SEAM_CHUNKS = HIDDEN // SEAM_CHUNK  # 56
SEAM_GROUP = 16  # rows of a fold task

# -- LDS (f32 words): block-reduction partials (32 slots a wave), the seam gate's 25 sums, and the
# GEMVs' split-K accumulators for up to 64 rows (4 row tiles of 16 x 16 a wave) ------------------
RED_SLOTS = 32
LDS_RED_WORDS = WAVES * RED_SLOTS
LDS_GATE_WORDS = 32
LDS_ACC_WORDS = WAVES * (MAX_DECODE_TOKENS // TILE_N) * WAVE * 4
