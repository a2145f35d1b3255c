"""`k2`: the second persistent launch of the decode layer, after vLLM's compressor and indexer.

Part one, in stage order (semantics: `reference.py`, one function a stage):
  1. key table     each row's keys: its SWA window (SWA cache), then its CSA top-k through the
                   compressed block table or its HCA global slots (compressed cache); graph-pad
                   rows (slot_mapping -1) have no keys and read nothing
  2. sparse MQA    the rank's 16 heads of K1's q over the keys' 584-byte fp8_ds_mla records,
                   scale 512^-0.5, base-2 softmax with the per-head sink in the denominator,
                   split over keys and merged exactly (log-sum-exp)
  3. output        inverse RoPE of dims 448..511, MXFP8, wo_a per group, MXFP8, wo_b: the
                   rank's bf16 partial [M, 7168]
  4. all-reduce    the ranks' partials summed in f32 in rank order, then bf16
  5. FFN seam      the fold into K1's residual, the mixes with hc_ffn_*, Sinkhorn, collapse,
                   ffn_norm and the MXFP8 of the normed row (the MoE's input, part two)

`layout.py` holds the stage decomposition, sync words, scratch and peer-buffer offsets and each
CTA's hand-offs (tests/test_k2_protocol.py runs them on 8 ranks). Only the torch reference exists: the kernel and its template registration are not built yet,
so nothing here registers and the runner keeps declining K2.
"""
