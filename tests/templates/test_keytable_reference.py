"""The key-table reference against hand-worked rows."""

import torch

from mono_jit.templates.keytable.reference import key_table


def test_hca_row_swa_then_global_slots_skipping_padding():
    swa = torch.full((1, 128), -1, dtype=torch.int32)
    swa[0, :3] = torch.tensor([10, -1, 12])
    topk = torch.tensor([[900, -1, 901, -1]], dtype=torch.int32).repeat(1, 32)[:, :128]
    slots, lens = key_table(swa, torch.tensor([3]), topk, ratio=128)
    expected = [10, 12] + [900, 901] * 32
    assert lens.tolist() == [len(expected)]
    assert slots[0, : len(expected)].tolist() == expected
    assert (slots[0, len(expected):] == -1).all()
    assert slots.shape == (1, 256)


def test_swa_entries_past_len_are_ignored():
    swa = torch.arange(128, dtype=torch.int32).reshape(1, 128)
    topk = torch.full((1, 128), -1, dtype=torch.int32)
    slots, lens = key_table(swa, torch.tensor([5]), topk, ratio=128)
    assert lens.item() == 5 and slots[0, :6].tolist() == [0, 1, 2, 3, 4, -1]


def test_csa_maps_local_indices_through_block_table():
    per_page = 64  # a 256-token kv block / ratio 4
    block_table = torch.tensor([[7, 3, 9], [2, 5, 1]], dtype=torch.int32)
    topk = torch.full((2, 1024), -1, dtype=torch.int32)
    topk[0, :3] = torch.tensor([0, 65, 130])
    topk[1, 5] = 63
    swa = torch.full((2, 128), -1, dtype=torch.int32)
    slots, lens = key_table(swa, torch.tensor([0, 0]), topk, ratio=4, token_req=torch.tensor([0, 1]),
                            block_table=block_table, entries_per_page=per_page)
    assert slots[0, :3].tolist() == [7 * 64 + 0, 3 * 64 + 1, 9 * 64 + 2]
    assert slots[1, :1].tolist() == [2 * 64 + 63]
    assert lens.tolist() == [3, 1]
