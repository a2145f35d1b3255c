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

Arguments: `K2Template.arguments`, in launch order, each with its dtype, shape and role (M =
rows this step, 1 <= M <= spec.max_tokens; flat row-major buffers; fp8 as bytes); the entries of
its `weights` and `state` tables: `layout.WEIGHT_TABLE` / `STATE_TABLE`. The layer's weights and
the runner's buffers go in by address, through those tables, because the AMDGPU backend keeps
every kernel argument live from the entry block (K2 spilled SGPRs with them as arguments).

Specialised by (TP, ratio, top-k width, max tokens): the key-table width and the attention's
chunking follow the ratio and width. Layer kind is not a build: every K2 folds (the attention
output into K1's R), and hash routing is the run-time `use_hash`.

Host side: the runner (runtime/runner.py) fills the weights table once a layer
(runtime/tables.py), the state table once per output set, exchanges the peer buffers at its
construction, and launches K2 after vLLM's select. The reference backend runs `contract.run`,
the same contract in torch, with the all-reduces through the same peer buffers.
"""

from __future__ import annotations

from ...spec import Spec
from ..base import Argument, WorkBuffer
from ..geometry import PAIR_BYTES, PEERS
from ..persistent import PersistentTemplate
from .attention_layout import PIN_LDS_BYTES, STATE_TABLE, WEIGHT_TABLE
from .moe_layout import TOPK, K2MoeLayout


class K2Template(PersistentTemplate):
    name = "k2"
    spec_fields = ("tp", "ratio", "topk_width", "max_tokens")
    reference_module = ".contract"
    pinned_lds = PIN_LDS_BYTES

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
            t("swa_cache", "uint8", "SWA cache bytes: pages of swa_block 584-byte fp8_ds_mla records (K1's "
              "layout), swa_page_stride bytes a page; read through 64-bit addresses, so it may pass 4 GiB",
              unbounded=True),
            t("comp_cache", "uint8", "compressed cache bytes: pages of comp_block 584-byte fp8_ds_mla records, "
              "comp_page_stride bytes a page; read through 64-bit addresses, so it may pass 4 GiB",
              unbounded=True),
            t("weights", "int64", f"[{len(WEIGHT_TABLE)}] the layer's table, filled once a layer: "
              f"{', '.join(WEIGHT_TABLE)}"),
            t("state", "int64", f"[{len(STATE_TABLE)}] the runner's buffers, filled once, each at least max_tokens "
              f"rows: {', '.join(STATE_TABLE)}"),
            t("sync", "int32", f"[{lay.sync_words}] epoch, counters, flags; zeroed once (as K1's)"),
            t("work", "float32", f"[{lay.work_words}] scratch: the f32, i32 and byte regions"),
            t("mailbox", "int64", f"[{lay.peer_bytes // PAIR_BYTES}] this rank's peer buffer (uncached, zeroed once, "
              "IPC-shared: runtime/peer.py)"),
            t("peers", "int64", f"[{PEERS}] every rank's peer-buffer address by TP rank (entries past tp unused)"),
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
            i("peer_wait_us", "microseconds (s_memrealtime's 100 MHz clock) a cross-rank wait may last before the "
              "launch traps (1 or more; the runner passes MONO_JIT_PEER_WAIT, default 30 s)"),
        )

    def work_buffers(self, spec: Spec) -> tuple[WorkBuffer, ...]:
        lay = K2MoeLayout.of(spec)
        return (WorkBuffer("sync", "int32", lay.sync_words, zeroed_once=True),
                WorkBuffer("work", "float32", lay.work_words),
                WorkBuffer("mailbox", "int64", lay.peer_bytes // PAIR_BYTES, zeroed_once=True, peers="peers"))
