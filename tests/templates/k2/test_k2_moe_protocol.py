"""K2 with part two's stages (moe_layout.K2MoeLayout.program, from K2's schedule table, the one
the kernel's stage loops run) on the protocol model of tests/templates/k2/test_k2_protocol.py: 8 ranks x 256
CTAs under random scheduling, launches in a row, a rank ahead, narrow tags that wrap, the MoE
all-reduce in its own peer regions. The data each part-two task reads is written down here from
the stages' semantics (moe_reference.py) and the routing of the launch, independently of the
waits the program makes, so a wait one flag short shows as a stale read."""

from __future__ import annotations

import functools
import random
from dataclasses import replace

import pytest
from test_k2_protocol import World, needs

from mono_jit.spec import STANDARD_MAX_TOKENS
from mono_jit.templates.geometry import CTAS, TILE_N
from mono_jit.templates.k2.attention_layout import K2Layout
from mono_jit.templates.k2.moe_layout import DOWN_TILES, SCHEDULE, TOPK, K2MoeLayout
from mono_jit.templates.schedule import Wait, hand_off_errors, stage
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
    for task in range(lay.tasks(15)):
        slot, _ = lay.s15_task(task)
        for pick in _picks(m)[union[slot]].values() if slot < len(union) else ():
            gate_up.setdefault(pick, []).append(task)
    down: dict[int, list[int]] = {}
    for task in range(lay.tasks(17)):
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
        if consumer[2] == "mag":  # S19 on a chunk's owner: its peers' units only
            return ()
        tile = consumer[3] % lay.tasks(14)  # S18: its shared tile, its tile of each entry's pick, the ids
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
    if flag < lay.sync_words:  # the MoE reduce: its peers' units only
        return ()
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
    assert lay.sync_words == lay.f_out + lay.tasks(7) and lay.f_logits > lay.f_norm


def test_every_wait_fits_the_cta_s_threads():
    lay = K2MoeLayout(8, 4, 1024, 64)
    assert max(s[2] for c in (0, 7) for s in lay.program(c, 64, 0, routing(64)) if s[0] == "wait") <= 512


def _gate_up_flags(lay: K2MoeLayout, slot: int) -> tuple[int, int]:
    """(first, count): the S15 tasks of union slot `slot`, every 16-column block of its expert."""
    blocks = lay.inter // TILE_N
    return lay.f_rgu + slot * blocks, blocks


def test_routed_waits_take_one_round_each():
    """S16 waits on the union and its expert's gate/up tasks (not on every slot's; on none for an
    id that chooses nothing), S18 on its shared tile and one down task a slot (not on every down
    task): one wait of at most 512 flags each, at the widest bucket."""
    lay = K2MoeLayout(8, 4, 1024, 64)
    for cta in range(CTAS):
        steps = lay.program(cta, 64, 0, routing(64))
        for i, step in enumerate(steps):
            if step[0] == "publish" and lay.f_ract <= step[1] < lay.f_rdown:
                pick = step[1] - lay.f_ract
                expert = routing(64)[pick // TOPK][pick % TOPK]
                assert steps[i - 3] == ("wait", lay.f_union, 1) and steps[i - 1] == ("run", 16, pick)
                if expert < 0:
                    assert steps[i - 2][0] == "wait" and steps[i - 2][2] == 0
                else:
                    assert steps[i - 2] == ("wait", *_gate_up_flags(lay, _slot(64, expert)))
            if step[0] == "wait" and lay.f_sdown <= step[1] < lay.f_rgu:  # S18 task: its shared tile
                task = step[1] - lay.f_sdown
                assert steps[i + 1] == ("wait", lay.f_rdown + task // DOWN_TILES, 384, lay.tasks(17) // 384)


def _mutated(lay: K2MoeLayout, stage: int, **change) -> K2MoeLayout:
    return replace(lay, schedule=tuple(replace(s, **change) if s.number == stage else s for s in lay.schedule))


def _gate_up_short(lay: K2MoeLayout, pick, m, data) -> tuple:
    first, count = _S16_SLOT.flags(lay, pick, m, data)
    return first, count - 1


def _next_slots_gate_up(lay: K2MoeLayout, pick, m, data) -> tuple:
    first, count = _S16_SLOT.flags(lay, pick, m, data)
    return first + lay.inter // TILE_N, count


def _downs_but_slot_0(lay: K2MoeLayout, task, m, data) -> tuple:
    first, count, stride = _S18_DOWN.flags(lay, task, m, data)
    return first + stride, count - 1, stride


_S16_UNION, _S16_SLOT = stage(SCHEDULE, 16).waits  # S16's waits: the union, its expert's slot's gate / up tasks
_S18_SHARED, _S18_DOWN = stage(SCHEDULE, 18).waits  # S18's: its shared down task, its tiles' routed down tasks
WRONG_TABLES = {  # name: (stage, its wrong fields, the lagging CTA whose task the wait misses), at 1 row
    "S9 waits on nothing": (9, {"waits": ()}, lambda lay: 0),
    "S10 misses the last logits task": (10, {"waits": (Wait(9, lambda lay, row, m, data: (0, lay.tasks(9) - 1)),)},
                                        lambda lay: (lay.tasks(9) - 1) % CTAS),
    "S16 skips its slot's gate/up": (16, {"waits": (_S16_UNION,)}, lambda lay: lay.inter // TILE_N - 1),
    # the last chosen expert's slot's last gate/up task lags: a pick's SwiGLU reads the previous
    # launch's gate/up
    "S16 waits on one gate/up task too few": (16, {"waits": (_S16_UNION, Wait(15, _gate_up_short))},
                                              lambda lay: (_slot(1, max(_picks(1))) + 1) * lay.inter // TILE_N - 1),
    # the first chosen expert's first gate/up task lags
    "S16 waits on the next slot's gate/up": (16, {"waits": (_S16_UNION, Wait(15, _next_slots_gate_up))},
                                             lambda lay: 0),
    "S17 waits on nothing": (17, {"waits": ()}, lambda lay: 0),
    "S18 skips the down tasks": (18, {"waits": (_S18_SHARED,)}, lambda lay: 0),
    # S17 task 0 (slot 0, tiles 0-7) lags: the partial sums the previous launch's down output of the
    # first chosen expert
    "S18 skips slot 0's down task": (18, {"waits": (_S18_SHARED, Wait(17, _downs_but_slot_0))}, lambda lay: 0),
}


@pytest.mark.parametrize("wrong", sorted(WRONG_TABLES))
def test_a_moe_table_with_a_wait_missing_or_short_reads_a_stale_word(wrong):
    """A schedule table whose MoE wait misses a task, that task's CTA lagging: the consumer
    starts its work before that task of its launch has published and reads the previous
    launch's data. The program is the table's (the kernel's stage loops read the same table)."""
    stage, change, lag = WRONG_TABLES[wrong]
    lay = _mutated(K2MoeLayout(8, 4, 1024, 1), stage, **change)
    wd = world(lay, [1], seed=0, lag=lag(lay))
    wd.run()
    assert wd.stale, f"{wrong}: the model saw no stale read"


def test_the_right_moe_table_with_the_same_laggards_reads_nothing_stale():
    lay = K2MoeLayout(8, 4, 1024, 1)
    for lag in sorted({lag(lay) for _, _, lag in WRONG_TABLES.values()}):
        wd = world(lay, [1], seed=0, lag=lag)
        wd.run()
        assert not wd.stale, (lag, wd.stale[:3])


def test_each_stage_reads_only_scratch_a_stage_it_waits_on_wrote():
    """K2's whole table: every scratch region a stage reads was written by a stage it waits on,
    directly or through that stage's waits (S15 reads S8's MXFP8 input through the union); a table
    whose S16 skips its slot's gate / up, or whose S18 skips the down tasks, does not."""
    lay = K2MoeLayout(8, 4, 1024, 1)
    regions = lay.f32_regions + lay.i32_regions + lay.byte_regions
    assert hand_off_errors(SCHEDULE, regions) == []
    assert hand_off_errors(_mutated(lay, 16, waits=(_S16_UNION,)).schedule, regions) == [
        "S16 reads gu but waits on 11, not its writer 15"]
    assert hand_off_errors(_mutated(lay, 18, waits=(_S18_SHARED,)).schedule, regions) == [
        "S18 reads ids but waits on 14, not its writer 10", "S18 reads routed_y but waits on 14, not its writer 17"]


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
