"""Pure-torch reference of the key table: the semantics the kernel must match.

Row r: the SWA slots swa_indices[r, :swa_lens[r]] that are >= 0, in order; then the compressed
keys in order, skipping -1: CSA (ratio 4) maps local index i to
block_table[token_req[r], i // P] * P + i % P (P entries per page), HCA (ratio 128) takes the
global slot as given. The row is padded with -1 to width W + 128; lens[r] counts the keys.
"""

from __future__ import annotations

import torch

from ... import deepseek_v4


def key_table(
    swa_indices: torch.Tensor,
    swa_lens: torch.Tensor,
    topk: torch.Tensor,
    ratio: int,
    token_req: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    entries_per_page: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(slots [M, W + 128] int32, lens [M] int32)."""
    rows, width = topk.shape
    swa = swa_indices.reshape(rows, deepseek_v4.SWA_WINDOW)
    out = torch.full((rows, width + deepseek_v4.SWA_WINDOW), -1, dtype=torch.int32)
    lens = torch.zeros(rows, dtype=torch.int32)
    for r in range(rows):
        window = swa[r, : int(swa_lens[r])]
        keys = [window[window >= 0]]
        compressed = topk[r][topk[r] >= 0].long()
        if ratio == deepseek_v4.CSA_RATIO:
            if token_req is None or block_table is None or not entries_per_page:
                raise ValueError("CSA needs token_req, block_table and entries_per_page")
            pages = block_table[int(token_req[r])].long()
            compressed = pages[compressed // entries_per_page] * entries_per_page + compressed % entries_per_page
        keys.append(compressed.to(torch.int32))
        row = torch.cat([k.to(torch.int32) for k in keys])
        out[r, : row.numel()] = row
        lens[r] = row.numel()
    return out, lens
