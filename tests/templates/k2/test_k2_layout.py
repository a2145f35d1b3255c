"""K2Layout's task tables cover every row, head, key and output column exactly once, its regions
are disjoint and fit their buffers, and every wait fits one CTA (one thread a flag), for every
bucket and both ratios (CSA at 1024, HCA at 8192 and the widest spec)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from mono_jit import deepseek_v4
from mono_jit.spec import STANDARD_MAX_TOKENS, Spec
from mono_jit.templates import seam_layout
from mono_jit.templates.geometry import CTAS, SEAM_CHUNK, SEAM_GROUP, THREADS, TILE_N
from mono_jit.templates.k2.attention_layout import (BYTE_REGIONS, F32_REGIONS, HEAD_TILE, I32_REGIONS, O_LORA, SCHEDULE,
                                          TWO_HOP_ROWS, WOA_PARTS, WOB_TILES, K2Layout, allreduce_seconds,
                                          two_hop_threshold)
from mono_jit.templates.schedule import hand_off_errors
from mono_jit.templates.sync_words import FIRST_FLAG

WIDTHS = [(deepseek_v4.CSA_RATIO, 1024), (deepseek_v4.HCA_RATIO, 8192), (deepseek_v4.HCA_RATIO, 65536)]
LAYOUTS = [K2Layout.of(Spec(8, ratio, width, rows)) for ratio, width in WIDTHS for rows in STANDARD_MAX_TOKENS]


def _id(lay: K2Layout) -> str:
    return f"r{lay.ratio}-k{lay.topk_width}-m{lay.rows}"


@pytest.mark.parametrize("lay", LAYOUTS, ids=_id)
def test_attention_tasks_cover_every_row_head_and_key_once(lay):
    covered = Counter()
    for task in range(lay.tasks(2)):
        row, tile, chunk = lay.s2_task(task)
        for head in range(tile * HEAD_TILE, min((tile + 1) * HEAD_TILE, lay.heads)):
            covered[(row, head, chunk)] += 1
    assert set(covered.values()) == {1} and len(covered) == lay.rows * lay.heads * lay.chunks
    assert (lay.chunks - 1) * lay.chunk < lay.keys <= lay.chunks * lay.chunk  # no empty chunk
    assert lay.chunk % 64 == 0 and lay.tasks(2) <= CTAS  # one round


@pytest.mark.parametrize("lay", LAYOUTS, ids=_id)
def test_merge_and_output_tables_cover_once(lay):
    assert sorted(lay.s3_task(t) for t in range(lay.tasks(3))) == [
        (r, h) for r in range(lay.rows) for h in range(lay.heads)]
    woa = Counter()
    for task in range(lay.tasks(4)):
        tile, half = lay.s4_task(task)
        woa.update((col, half) for col in range(tile * TILE_N, (tile + 1) * TILE_N))
    assert set(woa.values()) == {1} and len(woa) == lay.o_width * WOA_PARTS
    assert lay.tasks(6) * TILE_N == deepseek_v4.HIDDEN == WOB_TILES * TILE_N
    seam = Counter()
    for task in range(lay.tasks(7)):
        group, chunk = lay.s7_task(task)
        seam.update((row, col) for row in range(group * SEAM_GROUP, min((group + 1) * SEAM_GROUP, lay.rows))
                    for col in range(chunk * SEAM_CHUNK, (chunk + 1) * SEAM_CHUNK))
    assert set(seam.values()) == {1} and len(seam) == lay.rows * deepseek_v4.HIDDEN


@pytest.mark.parametrize("lay", LAYOUTS, ids=_id)
def test_woa_half_waits_on_exactly_its_heads_merges(lay):
    """S4's awaited contiguous range is the merges of the K half's 4 heads, rows below m."""
    for m in {1, lay.rows}:
        for task in range(0, lay.tasks(4), 7):
            tile, half = lay.s4_task(task)
            group = tile * TILE_N // O_LORA
            heads = lay.heads // lay.groups
            want = {(r, h) for r in range(m) for h in range(group * heads + half * heads // 2,
                                                             group * heads + (half + 1) * heads // 2)}
            first, count = lay.awaits(4, task, m)
            got = {lay.s3_task(f - lay.f_merge) for f in range(first, first + count)}
            assert got == want


@pytest.mark.parametrize("lay", LAYOUTS, ids=_id)
def test_sync_words_regions_and_waits_fit(lay):
    flags = [(lay.f_keys, lay.tasks(1)), (lay.f_attn, lay.tasks(2)), (lay.f_merge, lay.tasks(3)),
             (lay.f_woa, lay.tasks(4)), (lay.f_z, lay.tasks(5)), (lay.f_seam, lay.tasks(7)),
             (lay.f_norm, lay.tasks(8))]
    _disjoint_and_within(flags, FIRST_FLAG, lay.sync_words)
    f32 = [(lay.attn_ml, lay.tasks(2) * 2 * HEAD_TILE), (lay.attn_acc, lay.tasks(2) * HEAD_TILE * 512),
           (lay.woa_raw, WOA_PARTS * lay.rows * lay.o_width), (lay.partials, lay.rows * 56 * 25)]
    _disjoint_and_within(f32, 0, lay.f32_words)
    _disjoint_and_within([(lay.key_slots, lay.rows * lay.keys), (lay.key_counts, 2 * lay.rows)], 0, lay.i32_words)
    rows = lay.operand_rows
    u8 = [(lay.xo_codes, rows * lay.heads * 512), (lay.xo_scales, rows * lay.heads * 16),
          (lay.z_codes, rows * lay.o_width), (lay.z_scales, rows * lay.o_width // 32),
          (lay.partial, 2 * lay.rows * deepseek_v4.HIDDEN), (lay.ffn_codes, rows * deepseek_v4.HIDDEN),
          (lay.ffn_scales, rows * deepseek_v4.HIDDEN // 32)]
    _disjoint_and_within(u8, 0, lay.bytes)
    for cta in (0, 1, CTAS - 1):
        for step in lay.program(cta, lay.rows, 0):
            if step[0] == "wait":
                assert step[2] <= THREADS and FIRST_FLAG <= step[1] and step[1] + step[2] <= lay.sync_words
    assert lay.f32_words * 4 < 16 << 20 and lay.bytes < 32 << 20 and lay.peer_bytes < 16 << 20


@pytest.mark.parametrize("lay", LAYOUTS, ids=_id)
def test_peer_pairs_fit_their_half_and_units_cover_once(lay):
    last_row, last_col = lay.rows - 1, deepseek_v4.HIDDEN - 2
    if lay.two_hop:
        assert lay.rs_pair(lay.tp - 1, last_row, last_col) + 8 <= lay.ag
        assert lay.ag_pair(last_row, last_col) + 8 <= lay.half_bytes
        assert lay.rs_pair(0, 0, lay.owned_cols) == lay.rs_pair(0, 0, 0)  # owner-local columns
    else:
        assert lay.part_pair(lay.tp - 1, last_row, last_col) + 8 == lay.half_bytes
    # every push made once; every reader's S7 tasks read each unit once a row group (a unit holds
    # every row), on two hops the RS units only on the owner, the AG units everywhere else
    for rank in range(lay.tp):
        pushed = Counter((peer, region, unit) for task in range(lay.tasks(6))
                         for peer, region, unit in lay.s6_pushes(task, rank))
        pushed += Counter((peer, region, unit) for task in range(lay.tasks(7))
                          for peer, region, unit in lay.s7_pushes(task, rank))
        assert set(pushed.values()) == {1}
    for reader in range(lay.tp):
        read = Counter()
        for task in range(lay.tasks(7)):
            for region, first, count in lay.s7_peer_awaits(task, reader):
                read.update((lay.s7_task(task)[0], region, u) for u in range(first, first + count))
                assert first + count <= lay.peer_units(region)
        assert set(read.values()) == {1}
        chunks_owned = lay.owned_cols // SEAM_CHUNK
        per_group = lay.tp * chunks_owned * 8 + (lay.tasks(7) // seam_layout.groups(lay.rows) - chunks_owned) \
            if lay.two_hop else lay.tp * WOB_TILES
        assert len(read) == seam_layout.groups(lay.rows) * per_group


def test_two_hop_threshold_on_paper():
    """M* = L x B / 21504 with the module's figures; buckets 32 and 64 take two hops; upstream's
    42 is the same model with L x B = 903 KB."""
    assert 17 < two_hop_threshold() < 18 and TWO_HOP_ROWS == 18
    assert allreduce_seconds(8, False) < allreduce_seconds(8, True)
    assert allreduce_seconds(32, True) < allreduce_seconds(32, False)
    assert [rows for rows in STANDARD_MAX_TOKENS if K2Layout(8, 4, 1024, rows).two_hop] == [32, 64]


def _disjoint_and_within(regions: list[tuple[int, int]], low: int, high: int) -> None:
    spans = sorted((start, start + size) for start, size in regions)
    assert spans[0][0] >= low and spans[-1][1] <= high
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))


def test_each_part_one_stage_reads_only_scratch_its_producer_wrote():
    """Part one's table: its scratch regions agree with its waits (S7 reads its peers' pushes,
    not scratch); a table whose S8 waits on nothing does not."""
    regions = F32_REGIONS + I32_REGIONS + BYTE_REGIONS
    assert hand_off_errors(SCHEDULE, regions) == []
    wrong = tuple(replace(s, waits=()) if s.number == 8 else s for s in SCHEDULE)
    assert hand_off_errors(wrong, regions) == ["S8 reads partials but waits on None, not its writer 7"]
