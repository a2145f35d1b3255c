"""Static gates of K2 part one for every max-tokens bucket and ratio at TP8: it compiles for
gfx950 through the service, fits the persistent grid (one CTA a CU, two waves a SIMD) with no
scratch and no spilled register, and its ISA holds what the design relies on: the scaled MFMAs
of wo_a and wo_b, system-scope (SC0 SC1) 8-byte pair stores and polls for the all-reduce,
agent-scope hand-offs, the traps, the clock each cross-rank poll round reads (its time bound),
hardware fp8 conversions, scale codes loaded zero-extended
(tests/emulator/test_k2_emulated_attention.py runs the records' codes on the emulator). No GPU needed;
tests/gpu/test_gpu_k2.py runs the kernel."""

from __future__ import annotations

import re

import pytest
from byte_loads import assert_codes_load_unsigned
from cache_settings import cached_builds
from isa_loops import vmcnt_before, waterfall_loops
from fence_mutation import assert_every_needed_fence_is_caught
from persistent_gates import assert_fits_the_persistent_grid, assert_handoffs_hold_site_by_site

from mono_jit.config import Settings
from mono_jit.hsaco.metadata import read_metadata
from mono_jit.hsaco.isa import disassemble, find_objdump, instruction_counts
from mono_jit.spec import STANDARD_MAX_TOKENS, Spec
from mono_jit.templates import get
from mono_jit.templates.k2.attention_layout import PIN_LDS_BYTES, STATIC_LDS_BYTES, K2Layout

RATIOS = {4: 1024, 128: 8192}
BUILDS = [(ratio, rows) for ratio in RATIOS for rows in STANDARD_MAX_TOKENS]
# Upstream's K2 (vLLM 0.33's in-tree mono, FlyDSL 0.5.0, this machine kind): 256 VGPRs, 9-86
# spilled VGPRs and up to 196 B of scratch across widths 1-64 (as measured with the same toolchain).
UPSTREAM_VGPRS = 256


@pytest.fixture(scope="session")
def k2_builds(k2_cache):
    """{(ratio, max_tokens): (meta, hsaco, listing)} for K2 at TP8, compiled once per session."""
    return cached_builds(k2_cache, lambda spec: (spec["ratio"], spec["max_tokens"]))


def _id(build):
    return f"r{build[0]}-m{build[1]}"


@pytest.mark.parametrize("build", BUILDS, ids=_id)
def test_k2_build_fits_the_persistent_grid_without_spills(k2_builds, build):
    meta, hsaco, _ = k2_builds[build]
    kernel = assert_fits_the_persistent_grid("k2", meta, hsaco, PIN_LDS_BYTES, STATIC_LDS_BYTES)
    assert kernel.vgpr + kernel.agpr < UPSTREAM_VGPRS


def peer_poll_rounds(listing: str) -> list[list[str]]:
    """The instructions of each cross-rank poll round: from an s_sleep whose round re-loads
    pairs at system scope (global_load_dwordx2 sc0 sc1; a CTA hand-off's round loads a dword)
    to the round's branch."""
    rounds, current = [], None
    for line in listing.splitlines():
        if "s_sleep" in line:
            current = []
        elif current is not None and "s_cbranch" in line:
            if any("global_load_dwordx2" in i and "sc0 sc1" in i for i in current):
                rounds.append(current)
            current = None
        elif current is not None:
            current.append(line)
    return rounds


def assert_peer_polls_read_the_clock(listing: str) -> None:
    """Every cross-rank poll round reads s_memrealtime: the wait is bounded by time."""
    rounds = peer_poll_rounds(listing)
    assert rounds, "no cross-rank poll round found"
    assert all(any("s_memrealtime" in line for line in r) for r in rounds), "a poll round without the clock"


@pytest.mark.parametrize("build", BUILDS, ids=_id)
def test_k2_isa_has_the_instructions_the_design_relies_on(k2_builds, build):
    _, _, listing = k2_builds[build]
    counts = instruction_counts(listing)
    lay = K2Layout(8, build[0], RATIOS[build[0]], build[1])
    row_tiles = lay.row_tiles
    # A row tile's MFMAs: wo_a 16 K steps over 8 waves and wo_b 16: 2 + 2; the shared expert's
    # gate / up 14 a K quarter over 8 waves (a step and a predicated one) and down 3 (waves 0-2,
    # one each, the rest predicated off): 2 + 1; the routed gate and up tiles 56 steps over 8: 2 x 7,
    # and down 3 a wave: the routed ones with the weight as an fp4 operand (cbsz:4).
    mfmas = [line for line in listing.splitlines() if "v_mfma_scale_f32_16x16x128_f8f6f4" in line]
    assert counts["v_mfma_scale_f32_16x16x128_f8f6f4"] == (2 + 2 + 2 + 1 + 14 + 3) * row_tiles
    assert sum("cbsz:4" in line for line in mfmas) == (14 + 3) * row_tiles
    lines = listing.splitlines()
    pair_stores = [line for line in lines if "global_store_dwordx2" in line]
    polls = [line for line in lines if "global_load_dwordx2" in line and "sc0 sc1" in line]
    # every 8-byte store is a (value, tag) push at system scope; the polls read at system scope
    assert pair_stores and all("sc0 sc1" in line for line in pair_stores)
    pushes_a_site = 1 if lay.two_hop else lay.tp  # one owner, or every rank
    assert len(pair_stores) >= pushes_a_site
    assert len(polls) >= (1 if lay.two_hop else lay.tp)
    assert counts["buffer_wbl2"] >= 7 and counts["buffer_inv"] >= 6  # release a publish, acquire a wait
    assert "sc1" in next(line for line in lines if "buffer_wbl2" in line)  # agent scope
    assert counts["global_atomic_add"] >= 2  # the arrival and exit counters
    assert counts["s_trap"] >= 2 and "s_trap 2" in listing  # a dirty area; a peer that never came
    assert counts["v_cvt_pk_f32_fp8_e32"] + counts["v_cvt_pk_f32_fp8"] >= 8  # the records' e4m3
    assert counts["v_cvt_pk_fp8_f32"] >= 8  # MXFP8 of o, z and the normed row
    assert not [m for m in counts if m.startswith("scratch_")]
    assert not re.search(r"s_mov_b32 s\d+, -1\s", listing)  # every buffer resource has a real size
    assert_codes_load_unsigned(counts)
    assert_peer_polls_read_the_clock(listing)


@pytest.mark.parametrize("build", BUILDS, ids=_id)
def test_k2_buffer_resources_are_uniform(k2_builds, build):
    """Every buffer resource is built on wave-uniform values (the address tables' entries read as
    such): no waterfall loop, so no weight or scale load of a GEMV runs once per distinct lane
    value behind a v_readfirstlane_b32 / s_and_saveexec_b64 / s_cbranch_execnz loop."""
    _, _, listing = k2_builds[build]
    loops = waterfall_loops(listing)
    assert not loops, f"{len(loops)} waterfall loops, the first: {loops[0]}"


@pytest.mark.parametrize("build", BUILDS, ids=_id)
def test_k2_routed_gemvs_keep_the_next_steps_loads_in_flight(k2_builds, build):
    """The routed experts' fp4 GEMVs (S15's gate and up, S17's down) issue a K step's loads
    before the previous step's MFMAs, which wait only for their own (s_waitcnt vmcnt(N > 0)): only
    the MFMAs of a GEMV's last step, with nothing left to load, may wait for every load
    (vmcnt(0)). Waiting for all of them before each MFMA left the weight stream idle while the
    MFMAs ran."""
    _, _, listing = k2_builds[build]
    row_tiles = K2Layout(8, build[0], RATIOS[build[0]], build[1]).row_tiles
    waits = vmcnt_before(listing, lambda text: text.startswith("v_mfma_scale") and "cbsz:4" in text)
    assert len(waits) == (14 + 3) * row_tiles
    drained = sum(1 for n in waits if not n)
    assert drained <= 3 * row_tiles, f"{drained} fp4 MFMAs wait for every load: {waits}"


@pytest.mark.parametrize("build", BUILDS, ids=_id)
def test_k2_handoffs_hold_site_by_site(k2_builds, build):
    _, hsaco, listing = k2_builds[build]
    assert_handoffs_hold_site_by_site(hsaco, listing)


@pytest.mark.parametrize("ratio", RATIOS)
def test_k2_site_check_catches_each_needed_fence_removed(k2_builds, ratio):
    """Each agent-scope write-back, the wait after it and each invalidate of the built code
    object patched to s_nop: the site check reports every one its wave needs."""
    _, hsaco, listing = k2_builds[(ratio, 8)]
    assert_every_needed_fence_is_caught(hsaco, listing, find_objdump(Settings()))


def test_k2_key_reads_tp_ratio_width_and_max_tokens():
    k2 = get("k2")
    assert k2.key_spec(Spec(8, 4, 1024, 8)) != k2.key_spec(Spec(8, 128, 8192, 8))
    assert k2.key_spec(Spec(8, 128, 8192, 8)) != k2.key_spec(Spec(8, 128, 4096, 8))
    assert k2.key_spec(Spec(8, 4, 1024, 8)) != k2.key_spec(Spec(8, 4, 1024, 16))


def test_k2_grid_and_the_deployment_stay_under_40_kernels():
    from mono_jit.runtime.grid import layer_grid

    grid = layer_grid(8, 8192)
    assert len([g for g in grid if g.template == "k2"]) == 2 * len(STANDARD_MAX_TOKENS)
    assert len(grid) < 40


@pytest.mark.slow
def test_the_kernel_waits_where_its_schedule_says():
    """K2's part-one waits come from the schedule table the protocol model runs: S4 + S5 built
    from K2's table poll wo_a's flags in S5; built from a table where S5 waits on nothing they do
    not (and tests/templates/k2/test_k2_protocol.py fails such a table)."""
    from k1_stages import polls_with_and_without_a_wait

    polls = polls_with_and_without_a_wait(Spec(8, 4, 1024, 4), "k2", (4, 5), waitless=5)
    assert polls["table"] >= 1 and polls["waitless"] == 0, polls


@pytest.mark.slow
def test_the_kernel_waits_on_its_experts_gate_up_where_its_schedule_says():
    """S16's wait on the S15 tasks of its expert's union slot, whose flags it finds by reading
    the ids and the union's slots from the scratch, is the table's too: S15 + S16 built from K2's
    table poll S15's flags in S16; built from a table where S16 waits on nothing they do not (and
    tests/templates/k2/test_k2_moe_protocol.py fails such a table)."""
    from k1_stages import polls_with_and_without_a_wait

    polls = polls_with_and_without_a_wait(Spec(8, 4, 1024, 4), "k2", (15, 16), waitless=16)
    assert polls["table"] >= 1 and polls["waitless"] == 0, polls


@pytest.fixture(scope="module")
def stage_builds():
    from k1_stages import compile_each_stage

    return compile_each_stage(Spec(8, 4, 1024, 32), "k2")


@pytest.mark.slow
@pytest.mark.parametrize("stage", range(1, 20))
def test_each_k2_stage_has_a_standalone_launch(stage_builds, stage):
    """Every stage also builds alone, for the per-stage tests on a GPU: it waits on nothing it
    did not produce (a lone S7 still polls its peers' pairs), publishes its flags, advances the
    epoch, and the GEMV stages keep their MFMAs."""
    hsaco, launches = stage_builds[stage]
    assert launches == [{"kernel": "k2_kernel_0", "grid": [256, 1, 1], "block": [512, 1, 1],
                         "dynamic_lds": PIN_LDS_BYTES}]
    (kernel,) = read_metadata(hsaco)[1]
    assert kernel.scratch == 0 and kernel.vgpr_spills == 0 and kernel.sgpr_spills == 0
    listing = disassemble(hsaco, find_objdump(Settings()))
    counts = instruction_counts(listing)
    assert counts["global_atomic_add"] >= 1
    mfmas = {4: 2, 6: 2, 12: 2, 14: 1, 15: 14, 17: 3}.get(stage, 0) * 2  # 2 row tiles at 32 rows
    assert counts["v_mfma_scale_f32_16x16x128_f8f6f4"] == mfmas
    assert (counts["s_sleep"] > 0) == (stage in (7, 19)), "only the all-reduces' polls may wait in a lone stage"
    if stage in (7, 19):
        assert_peer_polls_read_the_clock(listing)
