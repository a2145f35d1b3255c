"""Static gates of K1 for every max-tokens bucket at TP8: it compiles for gfx950 through the
service, fits the persistent grid with no scratch or spills, and its ISA holds what the design
relies on (scaled MFMA for both GEMVs, agent-scope release / acquire, the exit atomic, hardware
fp8 conversion, scale codes loaded zero-extended). These need no GPU; tests/gpu/test_gpu.py runs the
kernel."""

from __future__ import annotations

import re

import pytest
from byte_loads import assert_codes_load_unsigned
from cache_settings import cached_builds, settings_at
from fence_mutation import assert_every_needed_fence_is_caught
from persistent_gates import assert_fits_the_persistent_grid, assert_handoffs_hold_site_by_site

from mono_jit.cache.store import Store
from mono_jit.config import Settings
from mono_jit.hsaco.metadata import read_metadata
from mono_jit.hsaco.isa import disassemble, find_objdump, instruction_counts
from mono_jit.pipeline.prebuild import prebuild
from mono_jit.spec import STANDARD_MAX_TOKENS, Spec
from mono_jit.templates import get
from mono_jit.templates.k1.layout import PIN_LDS_BYTES, STATIC_LDS_BYTES, K1Layout

BUCKETS = STANDARD_MAX_TOKENS
K_STEPS = 4 + 3  # MFMAs per wave and row tile: S3 3 + 1 predicated (28 steps / 8 waves), S5 3


@pytest.fixture(scope="session")
def k1_builds(k1_cache):
    """{max_tokens: (meta, hsaco, listing)} for K1 at TP8, compiled once per session."""
    return cached_builds(k1_cache, lambda spec: spec["max_tokens"])


@pytest.mark.parametrize("rows", BUCKETS)
def test_k1_bucket_fits_the_persistent_grid(k1_builds, rows):
    meta, hsaco, _ = k1_builds[rows]
    kernel = assert_fits_the_persistent_grid("k1", meta, hsaco, PIN_LDS_BYTES, STATIC_LDS_BYTES)
    assert kernel.vgpr + kernel.agpr <= 256  # two waves per SIMD


@pytest.mark.parametrize("rows", BUCKETS)
def test_k1_isa_has_the_instructions_the_design_relies_on(k1_builds, rows):
    _, _, listing = k1_builds[rows]
    counts = instruction_counts(listing)
    row_tiles = K1Layout(8, rows).row_tiles
    assert counts["v_mfma_scale_f32_16x16x128_f8f6f4"] == K_STEPS * row_tiles
    assert counts["buffer_wbl2"] >= 5 and counts["buffer_inv"] >= 5  # release per publish, acquire per wait
    assert counts["global_atomic_add"] >= 2  # the arrival and exit counters
    assert counts["s_sleep"] >= 5  # one back-off per wait loop
    assert counts["v_cvt_pk_fp8_f32"] >= 12  # MXFP8 of x and qr, the KV record
    assert not [m for m in counts if m.startswith("scratch_")]
    assert "sc1" in next(line for line in listing.splitlines() if "buffer_wbl2" in line)  # agent scope
    # A dirty sync area traps (s_trap 2, not llvm.trap's silent s_endpgm without a trap handler).
    assert counts["s_trap"] == 1 and "s_trap 2" in listing
    # NaN-propagating clamps and amaxes (IEEE maximum / minimum), as the reference's torch ops:
    # none of the maxNum-style f32 min / max / med3 forms that turn a NaN into the other operand.
    assert counts["v_maximum3_f32"] > 0 and counts["v_minimum3_f32"] > 0
    assert not [m for m in counts if m.startswith(("v_max_f32", "v_min_f32", "v_med3_f32", "v_pk_max_f32",
                                                   "v_pk_min_f32"))]
    # Every buffer resource has a real size: none carries FlyDSL's unbounded 0xFFFFFFFF.
    assert not re.search(r"s_mov_b32 s\d+, -1\s", listing)
    assert_codes_load_unsigned(counts)


@pytest.mark.parametrize("rows", BUCKETS)
def test_k1_handoffs_hold_site_by_site(k1_builds, rows):
    _, hsaco, listing = k1_builds[rows]
    assert_handoffs_hold_site_by_site(hsaco, listing)


def test_k1_site_check_catches_each_needed_fence_removed(k1_builds):
    """Each agent-scope write-back, the wait after it and each invalidate of the built code
    object patched to s_nop: the site check reports every one its wave needs."""
    _, hsaco, listing = k1_builds[8]
    assert_every_needed_fence_is_caught(hsaco, listing, find_objdump(Settings()))


def test_k1_key_reads_only_tp_and_max_tokens():
    k1 = get("k1")
    assert k1.key_spec(Spec(8, 4, 1024, 8)) == k1.key_spec(Spec(8, 128, 8192, 8))
    assert k1.key_spec(Spec(8, 4, 1024, 8)) != k1.key_spec(Spec(4, 4, 1024, 8))
    assert [a.name for a in k1.arguments(Spec(4, 4, 1024, 8)) if a.name == "q_out"]
    assert "[M, 32, 512]" in next(a.doc for a in k1.arguments(Spec(4, 4, 1024, 8)) if a.name == "q_out")


@pytest.mark.slow
def test_k1_builds_for_another_tp_and_an_odd_bucket(tmp_path):
    """TP16 (8 local heads, 128 wq_b tasks) at 3 rows: the task tables are not tied to TP8 or 2^n."""
    settings = settings_at(tmp_path / "cache")
    summary, _ = prebuild([get("k1")], [Spec(16, 128, 1024, 3)], settings, jobs=1, timeout=900)
    assert not summary.failed, summary.failed
    (entry,) = list(Store(settings).entries())
    (kernel,) = read_metadata(entry.hsaco)[1]
    assert kernel.scratch == 0 and kernel.vgpr_spills == 0 and kernel.sgpr_spills == 0
    assert "[M, 8, 512]" in next(a.doc for a in entry.meta.arguments if a.name == "q_out")
    assert K1Layout(16, 3).tasks(5) == 128


@pytest.mark.slow
def test_the_kernel_waits_where_its_schedule_says():
    """The kernel's stage loops are generated from the schedule table the protocol model runs:
    S3 + S4 built from K1's table poll S3's flags in S4; built from a table where S4 waits on
    nothing they do not (and tests/templates/k1/test_k1_protocol.py fails that table)."""
    from k1_stages import polls_with_and_without_a_wait

    polls = polls_with_and_without_a_wait(Spec(8, 4, 1024, 4), "k1", (3, 4), waitless=4)
    assert polls["table"] >= 1 and polls["waitless"] == 0, polls


@pytest.fixture(scope="module")
def stage_builds():
    from k1_stages import compile_each_stage

    return compile_each_stage(Spec(8, 4, 1024, 32))


@pytest.mark.slow
@pytest.mark.parametrize("stage", range(1, 7))
def test_each_k1_stage_has_a_standalone_launch(stage_builds, stage):
    """Every stage also builds alone (each stage testable by itself on a GPU). A
    standalone stage waits on nothing (it reads prepared inputs), still publishes its flags and
    advances the epoch, and the GEMV stages keep their MFMAs."""
    hsaco, launches = stage_builds[stage]
    assert launches == [{"kernel": "k1_kernel_0", "grid": [256, 1, 1], "block": [512, 1, 1],
                         "dynamic_lds": PIN_LDS_BYTES}]
    (kernel,) = read_metadata(hsaco)[1]
    assert kernel.scratch == 0 and kernel.vgpr_spills == 0 and kernel.sgpr_spills == 0
    counts = instruction_counts(disassemble(hsaco, find_objdump(Settings())))
    assert counts["s_sleep"] == 0, "a standalone stage must not wait (no polling loop)"
    assert counts["global_atomic_add"] >= 1
    mfma = {3: 4 * 2, 5: 3 * 2}.get(stage, 0)  # per wave and row tile, 2 row tiles at 32 rows
    assert counts["v_mfma_scale_f32_16x16x128_f8f6f4"] == mfma
