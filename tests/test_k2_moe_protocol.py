"""K2 with part two's stages (moe_layout.K2MoeLayout.program) on the protocol model of
tests/test_k2_protocol.py: 8 ranks x 256 CTAs under random scheduling, launches in a row, a rank
ahead, narrow tags that wrap, the MoE all-reduce in its own peer regions. The data each part-two
task reads is written down here from the stages' semantics (moe_reference.py) and the routing of
the launch, independently of the waits the program makes, so a wait one flag short shows as a
stale read."""

from __future__ import annotations

import functools
import random

import pytest
from test_k2_protocol import World, needs

from mono_jit.spec import STANDARD_MAX_TOKENS
from mono_jit.templates.geometry import CTAS, TILE_N
from mono_jit.templates.k2.layout import K2Layout
from mono_jit.templates.k2.moe_layout import DOWN_TILES, TOPK, K2MoeLayout
from mono_jit.spec import STANDARD_MAX_TOKENS
from mono_jit.templates.sync_words import EPOCH_WORD

EXPERTS = 384
POOL = (0, 5, 37, 64, 100, 191, 250, 383, -1)  # a launch's ids: rows share experts; -1 chooses none


@functools.lru_cache(maxsize=None)
def routing(m: int) -> tuple[tuple[int, ...], ...]:
    """The six ids of each of a launch's m live rows, drawn from POOL (seeded by m, so the program
    and the needs of a launch see the same): rows share experts, a row may name one twice as a
    hash row can, and an id of -1 chooses nothing."""
    rng = random.Random(m)
    return tuple(tuple(rng.choice(POOL) for _ in range(TOPK)) for _ in range(m))


def _picks(m: int) -> dict[int, dict[int, int]]:
    """{expert: {row: its pick}} of a launch, as S11 defines the picks: a row's pick of an expert
    is its last entry naming it."""
    picks: dict[int, dict[int, int]] = {}
    for row, ids in enumerate(routing(m)):
        for j, expert in enumerate(ids):
            if 0 <= expert < EXPERTS:
                picks.setdefault(expert, {})[row] = row * TOPK + j
    return picks


def _slot(m: int, expert: int) -> int:
    """The union slot of a chosen expert: the chosen experts below it."""
    return sorted(_picks(m)).index(expert)


@functools.lru_cache(maxsize=None)
def _writers(lay: K2MoeLayout, m: int) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """({pick: the S15 tasks that write its gate / up}, {16-column tile: the S17 tasks that write
    that tile of some pick's down output}) of a launch: S15 task (slot, block) and S17 task
    (slot, tiles) write for the picks of their slot's expert, and only a slot of the union has
    an expert."""
    union = sorted(_picks(m))
    gate_up: dict[int, list[int]] = {}
    for task in range(lay.s15_tasks):
        slot, _ = lay.s15_task(task)
        for pick in _picks(m)[union[slot]].values() if slot < len(union) else ():
            gate_up.setdefault(pick, []).append(task)
    down: dict[int, list[int]] = {}
    for task in range(lay.s17_tasks):
        slot, first = lay.s17_task(task)
        for tile in range(first, first + DOWN_TILES) if slot < len(union) else ():
            down.setdefault(tile, []).append(task)
    return gate_up, down


@functools.lru_cache(maxsize=None)
def moe_needs(lay: K2MoeLayout, consumer: tuple, m: int) -> tuple[int, ...]:
    """The flags whose data a part-two task reads (transitively written flags included: a task
    reads the MoE input and the ids its producers' producers wrote); part one's from `needs`.
    A routed task's producers come from what each task writes: S15 task (slot, block) the gate /
    up of its slot's expert's picks, S17 task (slot, tiles) those picks' down outputs."""
    live_norm = tuple(lay.f_norm + r for r in range(m))
    live_top = tuple(lay.f_top + r for r in range(m))
    if consumer[0] == "push":
        if consumer[2] in ("part", "rs", "ag"):  # part one's
            return needs(lay, consumer, m)
        tile = consumer[3] % lay.s14_tasks  # S18: its shared tile, its tile of each entry's pick, the ids
        downs = _writers(lay, m)[1].get(tile, [])
        return (lay.f_sdown + tile, *(lay.f_rdown + t for t in downs), *live_top)
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
    if flag < lay.f_rdown:  # routed act: the gate/up tasks that wrote its pick, its row's ids, the union
        pick = flag - lay.f_ract
        ups = _writers(lay, m)[0].get(pick, [])
        return (*(lay.f_rgu + t for t in ups), lay.f_top + pick // TOPK, lay.f_union)
    if flag < lay.f_out:  # routed down: the live rows' picks of its expert, the union
        return (*range(lay.f_ract, lay.f_ract + TOPK * m), lay.f_union)
    raise AssertionError(f"no stage waits before {consumer}")


def routed(lay: K2MoeLayout, cta: int, m: int, rank: int) -> list:
    """The program of a launch of m rows with that launch's routing."""
    return lay.program(cta, m, rank, routing(m))


def world(lay: K2MoeLayout, ms: list[int], seed: int, **kw) -> World:
    return World(lay, ms, seed, needs=moe_needs, **{"program": routed, **kw})


@pytest.mark.slow
@pytest.mark.parametrize("ratio, width, rows", [(4, 1024, 1), (128, 8192, 4), (4, 1024, 32)])
def test_part_two_launches_on_8_ranks_finish_and_read_only_their_own_words(ratio, width, rows):
    lay = K2MoeLayout(8, ratio, width, rows)
    wd = world(lay, [rows, 1, rows] if rows < 32 else [rows, 3], seed=rows)
    wd.run()
    assert not wd.stale, wd.stale[:3]
    assert all(r.words[EPOCH_WORD] == len(wd.ms) for r in wd.ranks)


@pytest.mark.slow
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


def test_every_wait_fits_the_cta_s_threads():
    lay = K2MoeLayout(8, 4, 1024, 64)
    assert max(s[2] for c in (0, 7) for s in lay.program(c, 64, 0, routing(64)) if s[0] == "wait") <= 512


def test_routed_waits_take_one_round_each():
    """S16 waits on the union and its expert's gate/up tasks (not on every slot's), S18 on its
    shared tile and one down task a slot (not on every down task): one wait of at most 512 flags
    each, at the widest bucket."""
    lay = K2MoeLayout(8, 4, 1024, 64)
    blocks = lay.inter // TILE_N
    for cta in range(CTAS):
        steps = lay.program(cta, 64, 0, routing(64))
        for i, step in enumerate(steps):
            if step[0] == "publish" and lay.f_ract <= step[1] < lay.f_rdown:
                pick = step[1] - lay.f_ract
                expert = routing(64)[pick // TOPK][pick % TOPK]
                if expert < 0:
                    assert steps[i - 1] == ("wait", lay.f_union, 1)
                else:
                    assert steps[i - 2:i] == [("wait", lay.f_union, 1), lay.s16_awaits(_slot(64, expert))]
                    assert steps[i - 1][2] == blocks
            if step[0] == "wait" and lay.f_sdown <= step[1] < lay.f_rgu:  # S18 task: its shared tile
                task = step[1] - lay.f_sdown
                assert steps[i + 1] == lay.s18_awaits(task) == ("wait", lay.f_rdown + task // DOWN_TILES, 384,
                                                                 lay.s17_tasks // 384)


def _cut(program, first_flag, last_flag, cut):
    """`program` with every wait on flags in [first_flag, last_flag) replaced by cut(wait)."""
    def short(lay: K2MoeLayout, cta: int, m: int, rank: int) -> list:
        return [cut(s) if s[0] == "wait" and first_flag(lay) <= s[1] < last_flag(lay) else s
                for s in program(lay, cta, m, rank)]
    return short


def test_routed_act_waiting_on_one_gate_up_task_too_few_reads_a_stale_word():
    """S16 waiting on its expert's gate/up tasks but the last, whose CTA lags: a pick's SwiGLU
    reads the previous launch's gate/up."""
    lay = K2MoeLayout(8, 4, 1024, 1)
    _, first, count = lay.s16_awaits(_slot(1, max(_picks(1))))
    short = _cut(routed, lambda lay: lay.f_rgu, lambda lay: lay.f_ract, lambda s: (*s[:2], s[2] - 1))
    wd = world(lay, [1, 1], seed=0, program=short, lag=(first + count - 1 - lay.f_rgu) % CTAS)
    wd.run()
    assert any(f == first + count - 1 for _, _, f, _ in wd.stale)


def test_routed_act_waiting_on_another_slots_gate_up_reads_a_stale_word():
    """S16 waiting on the next slot's gate/up tasks instead of its own expert's (whose first
    task's CTA lags): its pick's gate/up is the previous launch's."""
    lay = K2MoeLayout(8, 4, 1024, 2)
    _, first, count = lay.s16_awaits(0)
    short = _cut(routed, lambda lay: lay.f_rgu, lambda lay: lay.f_ract, lambda s: (s[0], s[1] + count, s[2]))
    wd = world(lay, [2, 2], seed=1, program=short, lag=(first - lay.f_rgu) % CTAS)
    wd.run()
    assert any(first <= f < first + count for _, _, f, _ in wd.stale)


def test_partial_waiting_on_one_down_slot_too_few_reads_a_stale_word():
    """S18 waiting on every slot's down task of its tiles but slot 0's (whose CTA lags): the
    partial sums the previous launch's down output of the first chosen expert."""
    lay = K2MoeLayout(8, 4, 1024, 1)
    short = _cut(routed, lambda lay: lay.f_rdown, lambda lay: lay.f_out,
                 lambda s: (s[0], s[1] + s[3], s[2] - 1, s[3]))
    wd = world(lay, [1, 1], seed=0, program=short, lag=0)  # S17 task 0: slot 0, tiles 0-7
    wd.run()
    assert any(f == lay.f_rdown for _, _, f, _ in wd.stale)


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
                      (lay.pick_of, lay.union_max * rows), (lay.slot_of, 384)], 0, lay.i32_words)
    _disjoint_within([(0, one.bytes), (lay.sh_codes, lay.operand_rows * inter),
                      (lay.sh_scales, lay.operand_rows * inter // 32), (lay.rh_codes, lay.pick_rows * inter),
                      (lay.rh_scales, lay.pick_rows * inter // 32)], 0, lay.bytes)
    assert lay.u8_at + lay.bytes == 4 * lay.work_words and lay.u8_at % 256 == 0
    assert lay.pick_rows >= lay.picks and lay.union_max == min(384, TOPK * rows)


@pytest.mark.parametrize("rows", STANDARD_MAX_TOKENS)
@pytest.mark.parametrize("ratio, width", [(4, 1024), (128, 8192)])
def test_the_gate_up_parts_start_where_sixteen_byte_loads_can_read_them(ratio, width, rows):
    """S13 and S16 read each row's gate / up parts (shared, then routed) eight f32 at a time, as two
    16-byte buffer loads whose index is the word offset divided by 4 (rounded down): every row of
    those regions must start on a whole 16 bytes, or h is computed from the columns before. At 1 row
    the 6 routing weights before them left sgu_raw 6 words past an 8-word boundary (K2 at bucket 1
    through vLLM's hook on the emulator: every h column was swiglu of the column 2 before it)."""
    lay = K2MoeLayout(8, ratio, width, rows)
    starts = [lay.sgu_raw + part * rows * 2 * lay.inter + row * 2 * lay.inter + half * lay.inter
              for part in range(4) for row in range(rows) for half in range(2)]
    starts += [lay.gu + pick * 2 * lay.inter + half * lay.inter for pick in range(lay.picks) for half in range(2)]
    assert all(start % 4 == 0 for start in starts), sorted({start % 4 for start in starts})
