"""K2 with part two's stages (moe_layout.K2MoeLayout.program) on the protocol model of
tests/test_k2_protocol.py: 8 ranks x 256 CTAs under random scheduling, launches in a row, a rank
ahead, narrow tags that wrap, the MoE all-reduce in its own peer regions. The data each part-two
task reads is written down here from the stages' semantics (moe_reference.py), independently of
the waits the program makes, so a wait one stage short shows as a stale read."""

from __future__ import annotations

import functools

import pytest
from test_k2_protocol import World, needs

from mono_jit.templates.k1.layout import CTAS
from mono_jit.templates.k2.layout import K2Layout
from mono_jit.templates.k2.moe_layout import TOPK, K2MoeLayout, waits
from mono_jit.templates.sync_area import EPOCH_WORD


@functools.lru_cache(maxsize=None)
def moe_needs(lay: K2MoeLayout, consumer: tuple, m: int) -> tuple[int, ...]:
    """The flags whose data a part-two task reads (transitively written flags included: a task
    reads the MoE input and the ids its producers' producers wrote); part one's from `needs`."""
    live_norm = tuple(lay.f_norm + r for r in range(m))
    live_top = tuple(lay.f_top + r for r in range(m))
    if consumer[0] == "push":
        if consumer[2] in ("part", "rs"):
            return needs(lay, consumer, m)
        tile = consumer[3] % lay.s14_tasks  # S18: its shared tile, every routed output, the weights
        return (lay.f_sdown + tile, *range(lay.f_rdown, lay.f_rdown + lay.s17_tasks), *live_top)
    flag = consumer[1]
    if flag < lay.f_logits:
        return needs(lay, consumer, m)
    if flag < lay.f_top:  # logits: the live rows' x_norm
        return live_norm
    if flag < lay.f_union:  # top-6: every logit of its row
        return tuple(range(lay.f_logits, lay.f_top))
    if flag < lay.f_sgu:  # union: the live rows' ids
        return live_top
    if flag < lay.f_sact:  # shared gate/up: the live rows' MXFP8 input
        return live_norm
    if flag < lay.f_sdown:  # shared act: every quarter of every tile
        return tuple(range(lay.f_sgu, lay.f_sact))
    if flag < lay.f_rgu:  # shared down: the live rows' MXFP8 h
        return tuple(lay.f_sact + r for r in range(m))
    if flag < lay.f_ract:  # routed gate/up: the union, the ids, the MXFP8 input
        return (lay.f_union, *live_top, *live_norm)
    if flag < lay.f_rdown:  # routed act: its expert's gate/up (some slot), its row's ids
        return (*range(lay.f_rgu, lay.f_ract), lay.f_top + (flag - lay.f_ract) // TOPK)
    if flag < lay.f_out:  # routed down: the live rows' picks of its expert, the union
        return (*range(lay.f_ract, lay.f_ract + TOPK * m), lay.f_union)
    raise AssertionError(f"no stage waits before {consumer}")


def world(lay: K2MoeLayout, ms: list[int], seed: int, **kw) -> World:
    return World(lay, ms, seed, needs=moe_needs, **kw)


@pytest.mark.parametrize("ratio, width, rows", [(4, 1024, 1), (128, 8192, 4), (4, 1024, 32)])
def test_part_two_launches_on_8_ranks_finish_and_read_only_their_own_words(ratio, width, rows):
    lay = K2MoeLayout(8, ratio, width, rows)
    wd = world(lay, [rows, 1, rows] if rows < 32 else [rows, 3], seed=rows)
    wd.run()
    assert not wd.stale, wd.stale[:3]
    assert all(r.words[EPOCH_WORD] == len(wd.ms) for r in wd.ranks)


def test_a_rank_ahead_and_narrow_tags_stay_safe():
    lay = K2MoeLayout(8, 4, 1024, 2)
    wd = world(lay, [2, 1, 1, 2, 1, 1, 1, 1, 2], seed=4, tag_bits=3, ahead=3, lag=CTAS - 1)
    wd.run()
    assert not wd.stale, wd.stale[:3]
    assert wd.max_lead == 1


def test_the_moe_regions_follow_part_ones_in_each_half():
    """The two all-reduces push with the same launch tag, so their pairs must never share bytes:
    the MoE's regions start past every byte of part one's (the model tracks tags, not values)."""
    lay = K2MoeLayout(8, 4, 1024, 32)
    assert lay.moe_at >= lay.ag + 8 * lay.rows * 7168 // 2 and lay.half_bytes == 2 * lay.moe_at
    assert lay.peer_units("mag") == lay.peer_units("ag") and lay.peer_regions()[-3:] == ("mpart", "mrs", "mag")
    assert lay.sync_words == lay.f_out + lay.s7_tasks and lay.f_logits > lay.f_norm


def test_long_waits_split_into_thread_sized_pieces():
    assert waits(10, 1200) == [("wait", 10, 512), ("wait", 522, 512), ("wait", 1034, 176)]
    lay = K2MoeLayout(8, 4, 1024, 64)
    assert max(s[2] for c in (0, 7) for s in lay.program(c, 64, 0) if s[0] == "wait") <= 512


def test_routed_act_waiting_on_one_gate_up_task_too_few_reads_a_stale_word():
    """S16 waiting on every routed gate/up task but the last, whose CTA lags: a pick's SwiGLU
    reads the previous launch's gate/up."""
    def short(lay: K2MoeLayout, cta: int, m: int, rank: int) -> list:
        full = waits(lay.f_rgu, lay.s15_tasks)
        cut = [*full[:-1], ("wait", full[-1][1], full[-1][2] - 1)]
        steps, out, i = lay.program(cta, m, rank), [], 0
        while i < len(steps):
            if steps[i:i + len(full)] == full:
                out += cut
                i += len(full)
            else:
                out.append(steps[i])
                i += 1
        return out

    lay = K2MoeLayout(8, 4, 1024, 1)
    last = lay.s15_tasks - 1
    wd = world(lay, [1, 1], seed=0, program=short, lag=last % CTAS)
    wd.run()
    assert any(f == lay.f_rgu + last for _, _, f, _ in wd.stale)


def _disjoint_within(regions: list[tuple[int, int]], low: int, high: int) -> None:
    spans = sorted((start, start + size) for start, size in regions)
    assert spans[0][0] >= low and spans[-1][1] <= high, (spans[0], spans[-1], low, high)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))


@pytest.mark.parametrize("ratio, width, rows", [(4, 1024, 1), (4, 1024, 32), (128, 8192, 64)])
def test_part_twos_scratch_regions_are_disjoint_and_inside_the_work_buffer(ratio, width, rows):
    lay = K2MoeLayout(8, ratio, width, rows)
    one = K2Layout(8, ratio, width, rows)
    inter, h = lay.inter, 7168
    _disjoint_within([(0, one.f32_words), (lay.logits, rows * 384), (lay.route_weights, rows * TOPK),
                      (lay.sgu_raw, 4 * rows * 2 * inter), (lay.shared_raw, rows * h), (lay.gu, lay.picks * 2 * inter),
                      (lay.routed_y, lay.picks * h)], 0, lay.f32_words)
    _disjoint_within([(0, one.i32_words), (lay.ids, rows * TOPK), (lay.union, 384), (lay.union_size, 1),
                      (lay.pick_of, lay.union_max * rows)], 0, lay.i32_words)
    _disjoint_within([(0, one.bytes), (lay.sh_codes, lay.operand_rows * inter),
                      (lay.sh_scales, lay.operand_rows * inter // 32), (lay.rh_codes, lay.pick_rows * inter),
                      (lay.rh_scales, lay.pick_rows * inter // 32)], 0, lay.bytes)
    assert lay.u8_at + lay.bytes == 4 * lay.work_words and lay.u8_at % 256 == 0
    assert lay.pick_rows >= lay.picks and lay.union_max == min(384, TOPK * rows)
