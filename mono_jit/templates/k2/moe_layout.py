"""K2 part two's stage decomposition (the MoE), after part one's S1-S8 in the same persistent
launch: task tables, sync words and what each stage waits for, as plain numbers of a spec (pure
Python, like layout.py; tests/test_k2_moe_protocol.py runs `program` on 8 ranks x 256 CTAs).
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

A routed task waits only on the producer tasks that write what it reads. S16 (a pick) reads the
gate / up S15 wrote for its expert's union slot: it waits on the union (S11 also writes each
expert's slot, `slot_of`), reads its expert's slot, then waits on that slot's S15 tasks
(s16_awaits: 24 flags at TP8), so its waits depend on the routing (`program` takes it). S18 (a
16-column tile) reads, for every live row's entries, the down output of its tile that S17 wrote
for the entry's slot: it waits on the S17 task of its tiles in every slot the step may use
(s18_awaits: one flag a slot, a strided wait), whatever the routing. Every task publishes on
every launch (slots past the union only publish), so a slot past the step's union passes at
once. A wait is at most 512 flags (one thread a flag).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ... import deepseek_v4 as model  # the MoE stage code keeps its local name until its rewrite lands
from ..geometry import SEAM_GROUP, TILE_N
from .layout import WOB_TILES, K2Layout

EXPERTS = model.ROUTED_EXPERTS  # 384
TOPK = model.EXPERTS_PER_TOKEN  # 6
LOGIT_EXPERTS = 8  # S9: experts a task, one a wave
SHARED_K_PARTS = 4  # S12: K quarters
DOWN_TILES = 8  # S17: output tiles a task, one a wave
F32_VECTOR = 8  # f32 words load8_f32 reads at once (two 16-byte loads)
MOE_REGIONS = {"part": "mpart", "rs": "mrs", "ag": "mag"}  # part one's region -> the MoE's twin


def union_slots(ids: Sequence[Sequence[int]]) -> list[int]:
    """Each pick's union slot (row x 6 + entry, for the rows of `ids`), -1 for an id outside
    0 .. 383 (which chooses nothing): the number of chosen experts below the pick's, as S11
    numbers the union (ascending experts)."""
    chosen = sorted({e for row in ids for e in row if 0 <= e < EXPERTS})
    slot = {e: s for s, e in enumerate(chosen)}
    return [slot.get(e, -1) for row in ids for e in row]


@dataclass(frozen=True)
class K2MoeLayout(K2Layout):
    """K2Layout with part two's stages after part one's."""

    # -- widths ------------------------------------------------------------------------
    @property
    def inter(self) -> int:
        """A rank's share of each expert's intermediate (and of the shared expert's)."""
        return model.MOE_INTERMEDIATE // self.tp

    @property
    def union_max(self) -> int:
        """Union slots a step may need: every pick a different expert, at most all experts."""
        return min(EXPERTS, TOPK * self.rows)

    @property
    def picks(self) -> int:
        return TOPK * self.rows

    # -- task tables -------------------------------------------------------------------
    @property
    def s9_tasks(self) -> int:
        return EXPERTS // LOGIT_EXPERTS

    @property
    def s12_tasks(self) -> int:
        return 2 * self.inter // TILE_N * SHARED_K_PARTS

    @property
    def s14_tasks(self) -> int:
        return WOB_TILES

    @property
    def s15_tasks(self) -> int:
        return self.union_max * (self.inter // TILE_N)

    @property
    def s17_tasks(self) -> int:
        return self.union_max * (WOB_TILES // DOWN_TILES)

    def s15_task(self, task):
        """(union slot, 16-column block) of S15 task `task`."""
        return task // (self.inter // TILE_N), task % (self.inter // TILE_N)

    def s17_task(self, task):
        """(union slot, first of its 8 output tiles) of S17 task `task`."""
        per_slot = WOB_TILES // DOWN_TILES
        return task // per_slot, task % per_slot * DOWN_TILES

    def s16_awaits(self, slot):
        """("wait", first, count): the S15 tasks of union slot `slot` (every 16-column block of
        its expert's gate and up), the only ones that write a pick of that slot's expert."""
        blocks = self.inter // TILE_N
        return ("wait", self.f_rgu + slot * blocks, blocks)

    def s18_awaits(self, task):
        """("wait", first, count, stride): the S17 task of S18 task `task`'s tile in every union
        slot (each writes that tile of its expert's picks' down outputs)."""
        per_slot = WOB_TILES // DOWN_TILES
        return ("wait", self.f_rdown + task // DOWN_TILES, self.union_max, per_slot)

    # -- sync words: part one's, then a flag per part-two producer task ------------------------
    @property
    def f_logits(self) -> int:
        return super().sync_words

    @property
    def f_top(self) -> int:
        return self.f_logits + self.s9_tasks

    @property
    def f_union(self) -> int:
        return self.f_top + self.rows

    @property
    def f_sgu(self) -> int:
        return self.f_union + 1

    @property
    def f_sact(self) -> int:
        return self.f_sgu + self.s12_tasks

    @property
    def f_sdown(self) -> int:
        return self.f_sact + self.rows

    @property
    def f_rgu(self) -> int:
        return self.f_sdown + self.s14_tasks

    @property
    def f_ract(self) -> int:
        return self.f_rgu + self.s15_tasks

    @property
    def f_rdown(self) -> int:
        return self.f_ract + self.picks

    @property
    def f_out(self) -> int:
        return self.f_rdown + self.s17_tasks

    @property
    def sync_words(self) -> int:
        return self.f_out + self.s7_tasks

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

    # -- the program: part one's, then part two's in the kernel's order ------------------------
    def program(self, cta: int, m: int, rank: int, ids: Sequence[Sequence[int]] | None = None) -> list[tuple]:
        """The CTA's steps in a launch of m rows whose live rows chose `ids` (six each, S10's;
        by default row r chose experts 6 r .. 6 r + 5): S16's waits depend on them."""
        slots = union_slots(ids if ids is not None else [range(TOPK * r, TOPK * r + TOPK) for r in range(m)])
        steps = super().program(cta, m, rank)
        for task in self._tasks(cta, self.s9_tasks):
            steps += [("wait", self.f_norm, m), ("publish", self.f_logits + task, 1)]
        for row in self._tasks(cta, self.rows):
            steps += [("wait", self.f_logits, self.s9_tasks)] if row < m else []
            steps.append(("publish", self.f_top + row, 1))
        for _ in self._tasks(cta, 1):
            steps += [("wait", self.f_top, m), ("publish", self.f_union, 1)]
        for task in self._tasks(cta, self.s12_tasks):
            steps += [("wait", self.f_norm, m), ("publish", self.f_sgu + task, 1)]
        for row in self._tasks(cta, self.rows):
            steps += [("wait", self.f_sgu, self.s12_tasks)] if row < m else []
            steps.append(("publish", self.f_sact + row, 1))
        for task in self._tasks(cta, self.s14_tasks):
            steps += [("wait", self.f_sact, m), ("publish", self.f_sdown + task, 1)]
        for task in self._tasks(cta, self.s15_tasks):
            steps += [("wait", self.f_union, 1), ("publish", self.f_rgu + task, 1)]
        for pick in self._tasks(cta, self.picks):
            if pick // TOPK < m:
                steps.append(("wait", self.f_union, 1))
                steps += [self.s16_awaits(slots[pick])] if slots[pick] >= 0 else []
            steps.append(("publish", self.f_ract + pick, 1))
        for task in self._tasks(cta, self.s17_tasks):
            steps += [("wait", self.f_ract, TOPK * m), ("publish", self.f_rdown + task, 1)]
        for task in self._tasks(cta, self.s14_tasks):
            steps += [("wait", self.f_sdown + task, 1), self.s18_awaits(task)]
            steps += [("push", *p) for p in self.s18_pushes(task, rank)]
        for task in self._tasks(cta, self.s7_tasks):
            live = self.s7_task(task)[0] * SEAM_GROUP < m
            steps += [("await_peers", *a) for a in self.s19_peer_awaits(task, rank)] if live else []
            steps += [("push", *p) for p in self.s19_pushes(task, rank)]
            steps.append(("publish", self.f_out + task, 1))
        return steps

    # -- scratch: part two's regions after part one's -------------------------------------------
    # f32 words
    @property
    def logits(self) -> int:
        """[rows, 384] the router's f32 logits."""
        return super().f32_words

    @property
    def route_weights(self) -> int:
        """[rows, 6] the routing weights (renormalised x 2.5)."""
        return self.logits + self.rows * EXPERTS

    @property
    def sgu_raw(self) -> int:
        """[4 K quarters, rows, 2 x inter] the shared gate / up's f32 parts, from a whole 8 words:
        S13 / S16 read them (and the routed gate / up after them) eight at a time as two 16-byte
        loads (load8_f32), and a 16-byte load's word offset rounds down. After 1 row of 6 routing
        weights an unaligned start made every h column swiglu of the column 2 before it."""
        return -(-(self.route_weights + self.rows * TOPK) // F32_VECTOR) * F32_VECTOR

    @property
    def shared_raw(self) -> int:
        """[rows, 7168] the shared expert's f32 output."""
        return self.sgu_raw + SHARED_K_PARTS * self.rows * 2 * self.inter

    @property
    def gu(self) -> int:
        """[picks, 2 x inter] each pick's routed gate then up, f32."""
        return self.shared_raw + self.rows * model.HIDDEN

    @property
    def routed_y(self) -> int:
        """[picks, 7168] each pick's down output times its routing weight, f32."""
        return self.gu + self.picks * 2 * self.inter

    @property
    def f32_words(self) -> int:
        return self.routed_y + self.picks * model.HIDDEN

    # i32 words
    @property
    def ids(self) -> int:
        """[rows, 6] the chosen experts (a hash layer's as given)."""
        return super().i32_words

    @property
    def union(self) -> int:
        """[384] union slot -> expert; then [1] the union's size."""
        return self.ids + self.rows * TOPK

    @property
    def union_size(self) -> int:
        return self.union + EXPERTS

    @property
    def pick_of(self) -> int:
        """[union_max, rows] (slot, row) -> the row's pick of that slot's expert (its last entry
        naming it, moe_kernel.row_pick), or -1."""
        return self.union_size + 1

    @property
    def slot_of(self) -> int:
        """[384] expert -> its union slot, or -1 when no live row chose it (S16 finds the S15
        tasks of its pick's expert by it)."""
        return self.pick_of + self.union_max * self.rows

    @property
    def i32_words(self) -> int:
        return self.slot_of + EXPERTS

    # bytes: the MXFP8 operands of the two downs
    @property
    def pick_rows(self) -> int:
        """Pick rows of the routed h operand: whole 16-row tiles."""
        return -(-self.picks // TILE_N) * TILE_N

    @property
    def sh_codes(self) -> int:
        """[operand_rows, inter] e4m3 of the shared expert's h."""
        return super().bytes

    @property
    def sh_scales(self) -> int:
        return self.sh_codes + self.operand_rows * self.inter

    @property
    def rh_codes(self) -> int:
        """[pick_rows, inter] e4m3 of each pick's routed h."""
        return -(-(self.sh_scales + self.operand_rows * self.inter // 32) // 256) * 256

    @property
    def rh_scales(self) -> int:
        return self.rh_codes + self.pick_rows * self.inter

    @property
    def bytes(self) -> int:
        return -(-(self.rh_scales + self.pick_rows * self.inter // 32) // 256) * 256
