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

Which union slot a pick's expert has is data: a stage that needs "the tasks of my expert"
waits on every task of the producing stage instead (S16 on all of S15, S18 on all of S17), in
waits of at most 512 flags (one thread a flag); every task publishes on every launch, so the
waits are the same whatever the routing.
"""

from __future__ import annotations

from dataclasses import dataclass

from ... import model
from ..k1.layout import SEAM_GROUP, THREADS, TILE_N
from .layout import WOB_TILES, K2Layout

EXPERTS = model.ROUTED_EXPERTS  # 384
TOPK = model.EXPERTS_PER_TOKEN  # 6
LOGIT_EXPERTS = 8  # S9: experts a task, one a wave
SHARED_K_PARTS = 4  # S12: K quarters
DOWN_TILES = 8  # S17: output tiles a task, one a wave
MOE_REGIONS = {"part": "mpart", "rs": "mrs", "ag": "mag"}  # part one's region -> the MoE's twin


def waits(first: int, count: int) -> list[tuple[str, int, int]]:
    """A wait on `count` flags from `first` as waits of at most THREADS flags (one thread polls
    one flag)."""
    return [("wait", f, min(THREADS, first + count - f)) for f in range(first, first + count, THREADS)]


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
    def program(self, cta: int, m: int, rank: int) -> list[tuple]:
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
            steps += waits(self.f_rgu, self.s15_tasks) if pick // TOPK < m else []
            steps.append(("publish", self.f_ract + pick, 1))
        for task in self._tasks(cta, self.s17_tasks):
            steps += [("wait", self.f_ract, TOPK * m), ("publish", self.f_rdown + task, 1)]
        for task in self._tasks(cta, self.s14_tasks):
            steps += [("wait", self.f_sdown + task, 1)] + waits(self.f_rdown, self.s17_tasks)
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
        """[4 K quarters, rows, 2 x inter] the shared gate / up's f32 parts."""
        return self.route_weights + self.rows * TOPK

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
    def i32_words(self) -> int:
        return self.pick_of + self.union_max * self.rows

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
