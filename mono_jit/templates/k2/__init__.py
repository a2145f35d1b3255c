"""`k2`: the second persistent launch of the decode layer (256 CTAs x 512 threads, gfx950), after
vLLM's compressor and indexer: from the key table through the attention, its all-reduce, the
FFN seam, the MoE and its all-reduce, in 19 stages.

Part one, in stage order (semantics: `reference.py`, one function a stage; decomposition:
`layout.py`; device code: `kernel.py`):
  1. key table     each row's keys: its SWA window (SWA cache), then its CSA top-k through the
                   compressed block table or its HCA global slots (compressed cache); graph-pad
                   rows (slot_mapping -1) have no keys and read nothing
  2. sparse MQA    the rank's heads of K1's q over the keys' 584-byte fp8_ds_mla records,
                   scale 512^-0.5, base-2 softmax with the per-head sink in the denominator,
                   split over keys and merged exactly (log-sum-exp)
  3. output        inverse RoPE of dims 448..511, MXFP8, wo_a per group, MXFP8, wo_b: the
                   rank's bf16 partial [M, 7168]
  4. all-reduce    the ranks' partials summed in f32 in rank order, then bf16, inside the
                   kernel: (bf16 pair, tag) pushes into the peers' buffers, one hop or two
  5. FFN seam      the fold into K1's residual, the mixes with hc_ffn_*, Sinkhorn, collapse,
                   ffn_norm and the MXFP8 of the normed row (the MoE's input, part two)

Part two (semantics: `moe_reference.py`; decomposition: `moe_layout.py`; device code:
`moe_kernel.py`): the sqrt-softplus router (top-6 with bias, or a hash layer's ids), the union
of the step's experts, the shared expert (MXFP8 x FP8), the routed experts over the union
(MXFP4 x MXFP8 scaled MFMAs, each expert's weights read once a step), the clamped SwiGLU, the
rank's partial bf16(routed + shared) and its all-reduce into `out`.

Contract (M = rows this step, 1 <= M <= spec.max_tokens; flat buffers, row-major; fp8 as bytes):
  in   positions    [M] int64;  slot_mapping [M] int64 (-1: a graph-pad row)
       swa_indices  [M, 128] int32 global SWA slots (-1 padded);  swa_lens [M] int32
       topk         [M, W] int32: CSA indexer top-k (local indices) or HCA global slots
       token_req    [M] int32 (CSA);  block_table [R, bt_stride] int32 compressed pages (CSA)
       swa_cache, comp_cache   the caches' bytes: pages of `*_block` 584-byte records,
                    `*_page_stride` bytes a page (K1's record layout); read through 64-bit
                    addresses (page x stride in i64), so a cache may pass 4 GiB
       weights      [28] int64, the layer's table (layout.WEIGHT_TABLE), filled once a layer:
                    addresses of wo_a [groups x 1024, woa_stride] e4m3 (row-major with vLLM's
                    padded rows, or AITER-preshuffled with stride 4096), its E8M0 codes
                    [groups x 8, 32], wo_b [7168, wob_stride] e4m3 (preshuffled: stride
                    groups x 1024), its codes [56, groups x 8], attn_sink [heads] f32, the rope
                    table [P, 64] f32, hc_ffn_fn [24, 4 x 7168] f32, hc_ffn_base [24],
                    hc_ffn_scale [3] f32, ffn_norm [7168] bf16; then woa_stride, woa_shuffled,
                    wob_stride, wob_shuffled as integers; then the MoE's: gate [384, 7168]
                    bf16, bias [384] f32 (0 on a hash layer), w13 [384, 2 x inter, 3584] and w2
                    [384, 7168, inter / 2] fp4x2 in AITER's A8W4 layout and their shuffled E8M0
                    scales, the shared gate_up [2 x inter, sgu_stride] and down [7168,
                    sw2_stride] e4m3 with 128 x 128 E8M0 codes; sgu_stride, sgu_shuffled,
                    sw2_stride, sw2_shuffled
       state        [10] int64, the runner's table (layout.STATE_TABLE), filled once: addresses
                    of K1's q_out [rows, heads, 512] bf16, r_out [rows, 4, 7168] bf16 (K2's
                    residual), post_out [rows, 4] and comb_out [rows, 4, 4] f32; then K2's
                    outputs: r_out [rows, 4, 7168] bf16 (R after the attention's fold; may be
                    K1's r_out), post_out [rows, 4], comb_out [rows, 4, 4] f32 (the FFN seam's
                    mixes), x_norm [rows, 7168] bf16 (ffn_norm of the collapse; its MXFP8 stays
                    in `work`), pre_out [rows, 4] f32 (the FFN seam's pre, vLLM's pre_out),
                    out [rows, 7168] bf16 (the reduced MoE output), each at least `rows` rows
  work sync         [K2MoeLayout.sync_words] int32, zeroed once (as K1's: epochs, counters, flags)
       work         [K2MoeLayout.work_words] f32: scratch (f32, i32 and byte regions)
       mailbox      [peer_bytes / 8] int64: this rank's peer buffer (uncached, zeroed once,
                    IPC-shared: runtime/peer.py);  peers [8] int64: every rank's buffer address
                    by TP rank (entries past tp unused)
       route_ids    [M, 6] int32: a hash layer's experts (tid2eid[input_ids]), read with use_hash
  i32  m, rank, swa_page_stride, swa_block, comp_page_stride, comp_block, bt_stride, per_page,
       use_hash, peer_wait_us (how long a cross-rank wait may last, in microseconds of
       s_memrealtime's 100 MHz clock, before the launch traps; the runner passes the
       `peer_wait` setting, MONO_JIT_PEER_WAIT, default 30 s)

Why tables: the AMDGPU backend loads every kernel argument in the entry block and keeps it
live, so with each weight and buffer an argument K2 spilled up to 48 SGPRs; an address read
from a table in the stage that uses it holds registers only there. The weights and the
runner's buffers never move, so their tables are written once.

Specialised by (TP, ratio, top-k width, max tokens): the key-table width and the attention's
chunking follow the ratio and width. Layer kind is not a build: every K2 folds (the attention
output into K1's R), and hash routing is the run-time `use_hash`.

Host side: the runner (runtime/runner.py) fills the weights table once a layer
(runtime/tables.py), the state table once per output set, exchanges the peer buffers at its
construction, and launches K2 after vLLM's select. The reference backend runs `contract.run`,
the same contract in torch, with the all-reduces through the same peer buffers.
"""

from __future__ import annotations

from ...resources import Budget
from ...spec import Spec
from ..base import COMMON_SOURCES, Argument, LaunchShape, Template, WorkBuffer
from ..geometry import CTAS, PAIR_BYTES, PEERS, THREADS
from .layout import PIN_LDS_BYTES, STATE_TABLE, WEIGHT_TABLE
from .moe_layout import TOPK, K2MoeLayout


class K2Template(Template):
    name = "k2"
    spec_fields = ("tp", "ratio", "topk_width", "max_tokens")
    source_files = COMMON_SOURCES + (
        "templates/sync_device.py", "templates/sync_words.py", "templates/schedule.py", "templates/_numerics.py",
        "templates/_gemv.py", "templates/addressing.py", "templates/k2/allreduce.py",
        "templates/_seam.py", "templates/k1/__init__.py", "templates/k1/layout.py",
        "templates/reference_math.py", "templates/keytable/__init__.py", "templates/keytable/kernel.py",
        "templates/keytable/reference.py", "templates/k2/__init__.py", "templates/k2/layout.py",
        "templates/k2/reference.py", "templates/k2/addressing.py", "templates/k2/kernel.py",
        "templates/k2/moe_layout.py", "templates/k2/moe_reference.py", "templates/k2/moe_addressing.py",
        "templates/k2/moe_kernel.py", "templates/router/__init__.py", "templates/router/kernel.py",
        "templates/router/reference.py")
    kernel_module = ".kernel"
    persistent = True
    budget = Budget(scratch_bytes=0, spills=0)
    reference_module = ".contract"

    def launch_shape(self, spec: Spec) -> LaunchShape:
        return LaunchShape(grid=(CTAS, 1, 1), block=(THREADS, 1, 1), dynamic_lds=PIN_LDS_BYTES)

    def arguments(self, spec: Spec) -> tuple[Argument, ...]:
        lay = K2MoeLayout.of(spec)
        t, i = Argument.tensor, Argument.i32
        return (
            t("positions", "int64", "[M]"),
            t("slot_mapping", "int64", "[M] SWA slots, -1 = graph padding"),
            t("swa_indices", "int32", "[M, 128] global SWA slots, -1 padded"),
            t("swa_lens", "int32", "[M]"),
            t("topk", "int32", f"[M, {lay.topk_width}] CSA local indices / HCA global slots"),
            t("token_req", "int32", "[M] request of each token (CSA)"),
            t("block_table", "int32", "[R, bt_stride] compressed block table (CSA)"),
            t("swa_cache", "uint8", "SWA cache bytes (fp8_ds_mla pages), read through 64-bit addresses",
              unbounded=True),
            t("comp_cache", "uint8", "compressed cache bytes (fp8_ds_mla pages), read through 64-bit addresses",
              unbounded=True),
            t("weights", "int64", f"[{len(WEIGHT_TABLE)}] the layer's table: {', '.join(WEIGHT_TABLE)}"),
            t("state", "int64", f"[{len(STATE_TABLE)}] the runner's buffers: {', '.join(STATE_TABLE)}"),
            t("sync", "int32", f"[{lay.sync_words}] epoch, counters, flags"),
            t("work", "float32", f"[{lay.work_words}] scratch"),
            t("mailbox", "int64", f"[{lay.peer_bytes // PAIR_BYTES}] this rank's peer buffer"),
            t("peers", "int64", f"[{PEERS}] every rank's peer-buffer address"),
            t("route_ids", "int32", f"[M, {TOPK}] a hash layer's experts (tid2eid[input_ids]); unread otherwise"),
            i("m", "rows this step (1..max_tokens)"),
            i("rank", "this TP rank"),
            i("swa_page_stride", "swa_cache.stride(0) in bytes"),
            i("swa_block", "records per SWA page"),
            i("comp_page_stride", "comp_cache.stride(0) in bytes"),
            i("comp_block", "records per compressed page"),
            i("bt_stride", "block_table.stride(0) (CSA)"),
            i("per_page", "compressed entries per page (CSA)"),
            i("use_hash", "1 on a hash layer (experts from route_ids, no bias), else 0"),
            i("peer_wait_us", "microseconds a cross-rank wait may last before the launch traps (1 or more)"),
        )

    def work_buffers(self, spec: Spec) -> tuple[WorkBuffer, ...]:
        lay = K2MoeLayout.of(spec)
        return (WorkBuffer("sync", "int32", lay.sync_words, zeroed_once=True),
                WorkBuffer("work", "float32", lay.work_words),
                WorkBuffer("mailbox", "int64", lay.peer_bytes // PAIR_BYTES, zeroed_once=True, peers="peers"))
