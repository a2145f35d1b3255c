"""K2 part two's stage decomposition (the MoE), after part one's S1-S8 in the same persistent
launch: task tables, sync words and what each stage waits for, as plain numbers of a spec (pure
Python, like layout.py; tests/templates/k2/test_k2_moe_protocol.py runs `program` on 8 ranks x 256 CTAs).
Semantics: moe_reference.py; device code: moe_kernel.py.

  S9  router logits  task = 8 experts (one a wave): each expert's bf16 gate row read once for
                     all rows (a task per row would read the 5.5 MB gate once per row).
  S10 top-6          task = row: the `router` template's selection on the row's 384 logits (or
                     a hash layer's ids), the weights renormalised x 2.5.
  S11 union          one task: the step's union of chosen experts, compacted (slot -> expert),
                     and each (slot, row)'s pick index, so the routed tasks run only for the
                     experts chosen and read each one's weights once.
  S12 shared gate/up task = (16-row tile of the 2 x 384 rows, K quarter): 192 tasks.
  S13 shared act     task = row: clamped SwiGLU of the summed quarters, bf16, MXFP8.
  S14 shared down    task = 16-row tile of the 7168 outputs (K = 384: 3 steps).
  S15 routed gate/up task = (union slot, 16-column block of the 384): the gate tile and its up
                     tile (AITER's interleave), MXFP4 x MXFP8; slots past the step's union only
                     publish.
  S16 routed act     task = pick (row, top-k slot): clamped SwiGLU, bf16, MXFP8.
  S17 routed down    task = (union slot, 8 tiles of 16 outputs), a wave a tile (K = 384 needs no
                     split-K): each pick's output times its routing weight.
  S18 partial        task = 16-column tile: bf16(bf16(sum of the row's top-k entries in order,
                     each its expert's pick: a hash row naming an expert twice has one pick, the
                     last entry, counted for both) + bf16(shared)) pushed as (bf16 pair, tag),
                     as S6 pushes (one or two hops), into the MoE region of the peers' buffers.
  S19 reduce         K1's S1 table: the ranks' partials summed in rank order (S7's scheme) into
                     the layer's `out`.

SCHEDULE below is K2's whole table: part one's stages (layout.py) and then these, each with its
task count, waits, pushes, flags and scratch regions (templates/schedule.py). The sync words, the
scratch offsets, the protocol model's `program`, the kernel's stage loops (templates/stage_loop.py)
and the stage-subset builds all follow it.

A routed task waits only on the producer tasks that write what it reads. S16 (a pick) reads the
gate / up S15 wrote for its expert's union slot: it waits on the union (S11 also writes each
expert's slot, `slot_of`), reads its expert's slot, then waits on that slot's S15 tasks (24
flags at TP8): a wait that depends on the routing, which the table states once as a function of
what S10 and S11 wrote (`_s16_slot_awaits`; the kernel reads those words from its scratch, the
model from the step's ids). S18 (a 16-column tile) reads, for every live row's entries, the down
output of its tile that S17 wrote for the entry's slot: it waits on the S17 task of its tiles in
every slot the step may use (one flag a slot, a strided wait), whatever the routing. Every task
publishes on every launch (slots past the union only publish), so a slot past the step's union
passes at once. A wait is at most 512 flags (one thread a flag).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from ... import deepseek_v4
from .. import schedule as sched, seam_layout
from ..geometry import CTAS, TILE_N
from .attention_layout import BYTE_REGIONS, F32_REGIONS, I32_REGIONS, WOB_TILES, K2Layout
from .attention_layout import SCHEDULE as PART_ONE

EXPERTS = deepseek_v4.ROUTED_EXPERTS  # 384
TOPK = deepseek_v4.EXPERTS_PER_TOKEN  # 6
LOGIT_EXPERTS = 8  # S9: experts a task, one a wave
SHARED_K_PARTS = 4  # S12: K quarters
DOWN_TILES = 8  # S17: output tiles a task, one a wave
F32_VECTOR = 8  # f32 words load8_f32 reads at once (two 16-byte loads)
MOE_REGIONS = {"part": "mpart", "rs": "mrs", "ag": "mag"}  # part one's region -> the MoE's twin


def routing_words(ids: Sequence[Sequence[int]]) -> sched.Words:
    """What S10 and S11 write that S16's wait reads, for a launch whose live rows chose `ids`
    (six each): the ids row by row, and each expert's union slot (the chosen experts below it,
    as S11 numbers the union), -1 for an expert no live row chose (an id outside 0 .. 383
    chooses nothing)."""
    chosen = sorted({e for row in ids for e in row if 0 <= e < EXPERTS})
    slot_of = [-1] * EXPERTS
    for slot, expert in enumerate(chosen):
        slot_of[expert] = slot
    return sched.Words({"ids": [e for row in ids for e in row], "slot_of": slot_of})


# -- part two's schedule, after part one's in the same launch ----------------------------------

def _row(lay: "K2MoeLayout", task):
    return task


def _s16_slot_awaits(lay: "K2MoeLayout", pick, m, data: sched.Lookup):
    """The S15 tasks of the union slot of the pick's expert (every 16-column block of its gate
    and up: the only tasks that write the pick), found through S10's ids and S11's slot_of; none
    for an id outside 0 .. 383 (it chooses nothing)."""
    expert = data.read("ids", pick)
    chosen = (expert >= 0) & (expert < EXPERTS)
    slot = data.read("slot_of", data.select(chosen, expert, 0))
    blocks = lay.inter // TILE_N
    return data.max(slot, 0) * blocks, data.select(chosen & (slot >= 0), blocks, 0)


def _s18_down_awaits(lay: "K2MoeLayout", task, m, data: sched.Lookup):
    """The S17 task of the task's tile in every union slot (each writes that tile of its
    expert's picks' down outputs): one flag a slot, `stride` apart, whatever the routing."""
    per_slot = WOB_TILES // DOWN_TILES
    return task // DOWN_TILES, lay.union_max, per_slot


def _s18_shared_awaits(lay: "K2MoeLayout", task, m, data: sched.Lookup):
    """The shared down task of the task's tile."""
    return task, 1


def _union(lay: "K2MoeLayout", task, m, data: sched.Lookup):
    """S11's one flag."""
    return 0, 1


MOE_STAGES: tuple[sched.Stage, ...] = (
    sched.Stage(9, "router logits", tasks=lambda lay: EXPERTS // LOGIT_EXPERTS,
                waits=(sched.Wait(8, sched.rows_below_m),), writes=("logits",)),
    sched.Stage(10, "top-6", tasks=lambda lay: lay.rows, row_of=_row,
                waits=(sched.Wait(9, lambda lay, row, m, data: (0, lay.tasks(9))),), reads=("logits",),
                writes=("ids", "route_weights")),
    sched.Stage(11, "union", tasks=1, waits=(sched.Wait(10, sched.rows_below_m),), reads=("ids",),
                writes=("union", "union_size", "pick_of", "slot_of")),
    sched.Stage(12, "shared gate/up", tasks=lambda lay: 2 * lay.inter // TILE_N * SHARED_K_PARTS,
                waits=(sched.Wait(8, sched.rows_below_m),), reads=("ffn_codes", "ffn_scales"), writes=("sgu_raw",)),
    sched.Stage(13, "shared act", tasks=lambda lay: lay.rows, row_of=_row,
                waits=(sched.Wait(12, lambda lay, row, m, data: (0, lay.tasks(12))),), reads=("sgu_raw",),
                writes=("sh_codes", "sh_scales")),
    sched.Stage(14, "shared down", tasks=lambda lay: WOB_TILES, waits=(sched.Wait(13, sched.rows_below_m),),
                reads=("sh_codes", "sh_scales"), writes=("shared_raw",)),
    sched.Stage(15, "routed gate/up", tasks=lambda lay: lay.union_max * (lay.inter // TILE_N),
                waits=(sched.Wait(11, _union),),
                reads=("union", "union_size", "pick_of", "ffn_codes", "ffn_scales"), writes=("gu",)),
    sched.Stage(16, "routed act", tasks=lambda lay: lay.picks, row_of=lambda lay, pick: pick // TOPK,
                waits=(sched.Wait(11, _union), sched.Wait(15, _s16_slot_awaits)),
                reads=("ids", "slot_of", "gu"), writes=("rh_codes", "rh_scales")),
    sched.Stage(17, "routed down", tasks=lambda lay: lay.union_max * (WOB_TILES // DOWN_TILES),
                waits=(sched.Wait(16, lambda lay, task, m, data: (0, TOPK * m)),),
                reads=("union", "union_size", "pick_of", "rh_codes", "rh_scales", "route_weights"),
                writes=("routed_y",)),
    sched.Stage(18, "MoE partial", tasks=lambda lay: WOB_TILES,
                waits=(sched.Wait(14, _s18_shared_awaits), sched.Wait(17, _s18_down_awaits)), publishes=False,
                pushes=lambda lay, task, rank: lay.s18_pushes(task, rank), reads=("ids", "routed_y", "shared_raw")),
    sched.Stage(19, "MoE reduce", tasks=seam_layout.fold_tasks, row_of=seam_layout.fold_row,
                peer_awaits=lambda lay, task, rank: lay.s19_peer_awaits(task, rank),
                pushes=lambda lay, task, rank: lay.s19_pushes(task, rank)),
)
SCHEDULE: tuple[sched.Stage, ...] = PART_ONE + MOE_STAGES  # K2's whole table, as the kernel runs it

MOE_F32_REGIONS: tuple[sched.Region, ...] = (
    sched.Region("logits", lambda lay: lay.rows * EXPERTS, "[rows, 384] the router's f32 logits"),
    sched.Region("route_weights", lambda lay: lay.rows * TOPK, "[rows, 6] the routing weights (renormalised x 2.5)"),
    # S13 / S16 read the gate / up parts (and the routed gate / up after them) eight at a time as
    # two 16-byte loads (load8_f32), and a 16-byte load's word offset rounds down: after 1 row of
    # 6 routing weights an unaligned start made every h column swiglu of the column 2 before it.
    sched.Region("sgu_raw", lambda lay: SHARED_K_PARTS * lay.rows * 2 * lay.inter,
                 "[4 K quarters, rows, 2 x inter] the shared gate / up's f32 parts", align=F32_VECTOR),
    sched.Region("shared_raw", lambda lay: lay.rows * deepseek_v4.HIDDEN, "[rows, 7168] the shared expert's f32 output"),
    sched.Region("gu", lambda lay: lay.picks * 2 * lay.inter, "[picks, 2 x inter] each pick's routed gate then up"),
    sched.Region("routed_y", lambda lay: lay.picks * deepseek_v4.HIDDEN,
                 "[picks, 7168] each pick's down output times its routing weight"),
)

MOE_I32_REGIONS: tuple[sched.Region, ...] = (
    sched.Region("ids", lambda lay: lay.rows * TOPK, "[rows, 6] the chosen experts (a hash layer's as given)"),
    sched.Region("union", lambda lay: EXPERTS, "[384] union slot -> expert"),
    sched.Region("union_size", lambda lay: 1, "[1] the union's size"),
    sched.Region("pick_of", lambda lay: lay.union_max * lay.rows,
                 "[union_max, rows] (slot, row) -> the row's pick of that slot's expert (its last entry naming "
                 "it, moe_kernel.row_pick), or -1"),
    sched.Region("slot_of", lambda lay: EXPERTS,
                 "[384] expert -> its union slot, or -1 when no live row chose it (S16's wait reads it)"),
)

# The MXFP8 operands of the two downs (every region's end on 256 bytes, as part one's).
MOE_BYTE_REGIONS: tuple[sched.Region, ...] = (
    sched.Region("sh_codes", lambda lay: lay.operand_rows * lay.inter, "[operand_rows, inter] e4m3 of the shared h"),
    sched.Region("sh_scales", lambda lay: lay.operand_rows * lay.inter // 32, "[operand_rows, inter / 32]"),
    sched.Region("rh_codes", lambda lay: lay.pick_rows * lay.inter, "[pick_rows, inter] e4m3 of each pick's routed h"),
    sched.Region("rh_scales", lambda lay: lay.pick_rows * lay.inter // 32, "[pick_rows, inter / 32]"),
)


@dataclass(frozen=True)
class K2MoeLayout(K2Layout):
    """K2Layout with part two's stages after part one's: K2's whole schedule and scratch."""

    schedule: tuple[sched.Stage, ...] = field(default=SCHEDULE, repr=False)  # what the kernel runs
    f32_regions: ClassVar[tuple[sched.Region, ...]] = F32_REGIONS + MOE_F32_REGIONS
    i32_regions: ClassVar[tuple[sched.Region, ...]] = I32_REGIONS + MOE_I32_REGIONS
    byte_regions: ClassVar[tuple[sched.Region, ...]] = BYTE_REGIONS + MOE_BYTE_REGIONS

    # -- widths ------------------------------------------------------------------------
    @property
    def inter(self) -> int:
        """A rank's share of each expert's intermediate (and of the shared expert's)."""
        return deepseek_v4.per_rank(self.tp).inter

    @property
    def union_max(self) -> int:
        """Union slots a step may need: every pick a different expert, at most all experts."""
        return min(EXPERTS, TOPK * self.rows)

    @property
    def picks(self) -> int:
        return TOPK * self.rows

    # -- task tables (the schedule's) -------------------------------------------------------
    def s15_task(self, task):
        """(union slot, 16-column block) of S15 task `task`."""
        return task // (self.inter // TILE_N), task % (self.inter // TILE_N)

    def s17_task(self, task):
        """(union slot, first of its 8 output tiles) of S17 task `task`."""
        per_slot = WOB_TILES // DOWN_TILES
        return task // per_slot, task % per_slot * DOWN_TILES

    # -- sync words: part one's, then a flag per part-two producer task (the schedule's) ---------
    @property
    def f_logits(self) -> int:
        return self.flag_base(9)

    @property
    def f_top(self) -> int:
        return self.flag_base(10)

    @property
    def f_union(self) -> int:
        return self.flag_base(11)

    @property
    def f_sgu(self) -> int:
        return self.flag_base(12)

    @property
    def f_sact(self) -> int:
        return self.flag_base(13)

    @property
    def f_sdown(self) -> int:
        return self.flag_base(14)

    @property
    def f_rgu(self) -> int:
        return self.flag_base(15)

    @property
    def f_ract(self) -> int:
        return self.flag_base(16)

    @property
    def f_rdown(self) -> int:
        return self.flag_base(17)

    @property
    def f_out(self) -> int:
        """S19's flags (S18 has none: its hand-off is its pushes)."""
        return self.flag_base(19)

    # -- peer regions: part one's and, after them in each half, the MoE's twins -----------------
    @property
    def moe_at(self) -> int:
        """Byte offset in a half of the MoE regions (laid out as part one's, one after them)."""
        return super().half_bytes

    @property
    def half_bytes(self) -> int:
        return 2 * super().half_bytes

    def peer_regions(self) -> tuple[str, ...]:
        return super().peer_regions() + tuple(MOE_REGIONS.values())

    def peer_units(self, region: str) -> int:
        twins = {v: k for k, v in MOE_REGIONS.items()}
        return super().peer_units(twins.get(region, region))

    def s18_pushes(self, task, rank):
        """S6's pushes (same units: a 16-column tile of every row) into the MoE regions."""
        return [(peer, MOE_REGIONS[region], unit) for peer, region, unit in self.s6_pushes(task, rank)]

    def s19_peer_awaits(self, task, rank):
        return [(MOE_REGIONS[region], first, count) for region, first, count in self.s7_peer_awaits(task, rank)]

    def s19_pushes(self, task, rank):
        return [(peer, MOE_REGIONS[region], unit) for peer, region, unit in self.s7_pushes(task, rank)]

    # -- the program ------------------------------------------------------------------
    def program(self, cta: int, m: int, rank: int = 0, ids: Sequence[Sequence[int]] | None = None) -> list[tuple]:
        """The CTA's steps in a launch of m rows whose live rows chose `ids` (six each, S10's;
        by default row r chose experts 6 r .. 6 r + 5), in the kernel's order (both from the
        schedule): S16's waits depend on them."""
        chosen = ids if ids is not None else [range(TOPK * r, TOPK * r + TOPK) for r in range(m)]
        return sched.program(self.schedule, self, cta, CTAS, m, rank, routing_words(chosen))

    # -- scratch: part two's regions after part one's (the tables above) ------------------------
    # f32 words
    @property
    def logits(self) -> int:
        return self._f32("logits")

    @property
    def route_weights(self) -> int:
        return self._f32("route_weights")

    @property
    def sgu_raw(self) -> int:
        return self._f32("sgu_raw")

    @property
    def shared_raw(self) -> int:
        return self._f32("shared_raw")

    @property
    def gu(self) -> int:
        return self._f32("gu")

    @property
    def routed_y(self) -> int:
        return self._f32("routed_y")

    # i32 words
    @property
    def ids(self) -> int:
        return self._i32("ids")

    @property
    def union(self) -> int:
        return self._i32("union")

    @property
    def union_size(self) -> int:
        return self._i32("union_size")

    @property
    def pick_of(self) -> int:
        return self._i32("pick_of")

    @property
    def slot_of(self) -> int:
        return self._i32("slot_of")

    # bytes: the MXFP8 operands of the two downs
    @property
    def pick_rows(self) -> int:
        """Pick rows of the routed h operand: whole 16-row tiles."""
        return -(-self.picks // TILE_N) * TILE_N

    @property
    def sh_codes(self) -> int:
        return self._byte("sh_codes")

    @property
    def sh_scales(self) -> int:
        return self._byte("sh_scales")

    @property
    def rh_codes(self) -> int:
        return self._byte("rh_codes")

    @property
    def rh_scales(self) -> int:
        return self._byte("rh_scales")
