"""The emulator on known-answer micro-kernels written in FlyDSL with the templates' helpers and
compiled by mono-jit's compile path (tests/support/emulator_kernels): each against an answer computed
here in torch (or, for the scaled MFMA, tests/support/mfma_model.py), and two that must fail: an MFMA
fed in the wrong lane order disagrees with the model, and a kernel reading past its tensor
faults naming the lane and the allocation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("numba", reason="the emulator needs the emulate extra (numba, tinygrad)")
pytest.importorskip("tinygrad", reason="the emulator needs the emulate extra (numba, tinygrad)")
pytest.importorskip("flydsl", reason="the micro-kernels compile with FlyDSL (the build extra)")

import mfma_model  # noqa: E402
from emulator_kernels import Compiled, compile_in_worker  # noqa: E402
from emulator_kernels.conversions import FP8_MULTIPLIER  # noqa: E402
from emulator_kernels.lanes import CROSS_LANE, QUAD_SWIZZLE, SWIZZLES  # noqa: E402
from emulator_kernels.memory import ATOMIC_BLOCK, ATOMIC_GRID, COUNTERS, SMALL_BASE  # noqa: E402

from mono_jit.emulator import EmulatorFault, Machine, UnsupportedCode  # noqa: E402
from mono_jit.templates.sync_words import EPOCH_WORD, FIRST_FLAG  # noqa: E402

LANES = 64


@pytest.fixture(scope="session")
def kernels() -> dict[str, Compiled]:
    """Every micro-kernel, compiled once per session in one compile worker (a few seconds)."""
    return compile_in_worker()


def _machine(weights: dict[str, object] | None = None, **buffers: object) -> Machine:
    """A machine with `weights` registered read-only and `buffers` writable."""
    machine = Machine()
    for name, tensor in (weights or {}).items():
        machine.register(tensor, name, writable=False)
    for name, tensor in buffers.items():
        machine.register(tensor, name)
    return machine


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_vector_add(kernels):
    g = _generator(1)
    a, b = torch.randn(4096, generator=g), torch.randn(4096, generator=g)
    c = torch.zeros(4096)
    report = kernels["vector_add"].launch(_machine({"a": a, "b": b}, c=c), a=a, b=b, c=c)
    assert torch.equal(c, a + b)
    assert report.per_allocation["a"]["buffer_read"] == a.nbytes


def _cross_lane_answers(x: torch.Tensor, flags: torch.Tensor, values: torch.Tensor) -> dict[str, torch.Tensor]:
    """What each column of the cross-lane kernel holds, per lane."""
    lane = torch.arange(LANES)
    best = values.max()
    group32 = lane & ~31
    want = {f"xor{1 << bit}": x[lane ^ (1 << bit)] for bit in range(6)}
    want |= {
        "up1": x[(lane - 1).clamp(min=0)],
        "idx63": x[63].expand(LANES),
        "readlane37": x[37].expand(LANES),
        "readfirstlane_ge7": torch.where(lane >= 7, x[7], torch.tensor(-1, dtype=torch.int32)),
        "wave_sum": x.to(torch.int64).sum().to(torch.int32).expand(LANES),  # i32 wrap-around
        "inclusive_count": flags.cumsum(0).to(torch.int32),
        "argmax_value": best.view(1).view(torch.int32).expand(LANES),
        "argmax_index": (values == best).nonzero()[0].to(torch.int32).expand(LANES),
        # ds_swizzle bit mode: lane' = ((lane & and) | or) ^ xor inside each 32-lane half
        "swizzle_041f": x[group32 | ((lane & 31) ^ 1)],
        "swizzle_0078": x[group32 | (lane & 0x18) | 3],
        # v_permlane{16,32}_swap's new VDST: a lane of an odd 16- (32-) lane row takes the source
        # lane 16 (32) below it; the others keep their own value (CDNA4 ISA pseudocode)
        "permlane16_swap": x[torch.where(lane % 32 >= 16, lane - 16, lane)],
        "permlane32_swap": x[torch.where(lane >= 32, lane - 32, lane)],
    }
    assert list(want) == list(CROSS_LANE) and SWIZZLES == (0x041F, 0x0078)
    return want


def test_cross_lane_operations(kernels):
    """The shuffles the templates' helpers lower to (ds_swizzle, v_permlane*_swap, ds_bpermute,
    v_readlane), readfirstlane under a partial EXEC, and the helpers' wave sum, scan and argmax
    (ties to the lower lane)."""
    g = _generator(2)
    x = torch.randint(-2**31, 2**31 - 1, (LANES,), generator=g, dtype=torch.int64).to(torch.int32)
    flags = torch.randint(0, 2, (LANES,), generator=g, dtype=torch.int32)
    values = torch.randint(0, 6, (LANES,), generator=g).float() / 2  # ties for the argmax
    out = torch.zeros(LANES * len(CROSS_LANE), dtype=torch.int32)
    kernels["cross_lane"].launch(_machine({"x": x, "flags": flags, "values": values}, out=out),
                                 x=x, flags=flags, values=values, out=out)
    got = out.view(LANES, len(CROSS_LANE))
    wrong = []
    for k, (name, want) in enumerate(_cross_lane_answers(x, flags, values).items()):
        lanes = range(1, LANES) if name == "up1" else range(LANES)  # lane 0 of a shuffle up is undefined
        wrong += [f"{name} lane {lane}: {int(got[lane, k]):#x}, want {int(want[lane]):#x}"
                  for lane in lanes if got[lane, k] != want[lane]]
    assert not wrong, "\n".join(wrong[:20])


def test_a_signed_64_bit_compare(kernels):
    """v_cmp_gt_i64 on pairs that differ in the high word's sign, only in the low word (whose top
    bit set must not read as a sign) and at the i64 extremes, then on random pairs."""
    edges = [(-1, 1), (1, -1), (1 << 32, 0xFFFFFFFF), (0x80000000, 0x7FFFFFFF), (-(1 << 40), 5),
             (2**63 - 1, -2**63), (-2**63, 2**63 - 1), (7, 7), (0xFFFFFFFF, 1 << 32), (-5, -(1 << 40))]
    g = _generator(5)
    a = torch.randint(-2**63, 2**63 - 1, (LANES,), generator=g, dtype=torch.int64)
    b = torch.randint(-2**63, 2**63 - 1, (LANES,), generator=g, dtype=torch.int64)
    b[::3] = a[::3] + torch.randint(-2, 3, (len(b[::3]),), generator=g)  # near pairs
    for lane, (x, y) in enumerate(edges):
        a[lane], b[lane] = x, y
    out = torch.zeros(LANES, dtype=torch.int32)
    kernels["i64_greater"].launch(_machine({"a": a, "b": b}, out=out), a=a, b=b, out=out)
    assert torch.equal(out, (a > b).int())


def test_ds_swizzle_quad_mode(kernels):
    """Offset 0x801b: lane l reads lane sel[l % 4] of its quad, sel = (3, 2, 1, 0)."""
    assert QUAD_SWIZZLE == 0x801B
    x = torch.arange(100, 100 + LANES, dtype=torch.int32)
    out = torch.zeros(LANES, dtype=torch.int32)
    kernels["quad_swizzle"].launch(_machine({"x": x}, out=out), x=x, out=out)
    lane = torch.arange(LANES)
    assert torch.equal(out, x[(lane & ~3) | (3 - lane % 4)])


def _conversion_inputs() -> torch.Tensor:
    """512 f32: e4m3 ties (x 2 = a midpoint of e4m3 neighbours) and subnormals, values past the
    clamp, bf16 ties and f32 denormals, signed zeros, infinities, NaN and random values."""
    g = _generator(3)
    e4m3 = torch.arange(0, 126, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    ties = (e4m3[:-1] + e4m3[1:]) / 2 / FP8_MULTIPLIER  # exact midpoints, f32 holds them exactly
    bf16_ties = (torch.randint(0x3F800000 >> 16, 0x42000000 >> 16, (32,), generator=g) << 16 | 0x8000)
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 224.0, 240.0, -300.0, 1e30,
                            1.5e-45, -3e-39, 2.0**-10, 2.0**-12])
    values = torch.cat([ties, -ties[:40], bf16_ties.to(torch.int32).view(torch.float32), special])
    rest = torch.randn(512 - len(values), generator=g) * torch.exp2(torch.randint(-12, 9, (512 - len(values),),
                                                                                generator=g).float())
    return torch.cat([values, rest])


def test_fp8_and_bf16_conversions(kernels):
    """templates/_numerics.py: fp8x8 (x 2, clamp to +-448, v_cvt_pk_fp8_f32 round to nearest
    even), bf16x8 (v_cvt_pk_bf16_f32) and fp8x4_to_f32 (v_cvt_pk_f32_fp8) over all 256 codes."""
    f = _conversion_inputs()
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.int32)
    fp8 = torch.zeros(512, dtype=torch.uint8)
    bf16 = torch.zeros(512, dtype=torch.bfloat16)
    decoded = torch.zeros(256)
    kernels["fp8_bf16"].launch(_machine({"f": f, "codes": codes}, fp8=fp8, bf16=bf16, decoded=decoded),
                                  f=f, codes=codes, fp8=fp8, bf16=bf16, decoded=decoded)
    finite = ~f.isnan()  # fp8x8's clamp of a NaN is the compiler's min/max, not a conversion
    want_fp8 = (f * FP8_MULTIPLIER).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    bad = (fp8 != want_fp8) & finite
    assert not bad.any(), [(float(f[i]), int(fp8[i]), int(want_fp8[i])) for i in bad.nonzero()[:10, 0]]
    want_bf16 = f.to(torch.bfloat16)
    bits, want_bits = bf16.view(torch.int16), want_bf16.view(torch.int16)
    assert torch.equal(bf16.isnan(), want_bf16.isnan())
    bad = (bits != want_bits) & ~want_bf16.isnan()
    assert not bad.any(), [(float(f[i]), int(bits[i]), int(want_bits[i])) for i in bad.nonzero()[:10, 0]]
    want = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
    assert torch.equal(decoded.isnan(), want.isnan()) and int(want.isnan().sum()) == 2
    assert torch.equal(decoded[~want.isnan()].view(torch.int32), want[~want.isnan()].view(torch.int32))


def test_a_ue8m0_byte_widens_to_its_code_and_scale(kernels):
    """_dsl.load_code, every template's path for a scale code: 128 and above stay positive (a
    plain Uint8.to(Int32) sign-extends: K2's scale codes were read so, which this test failed on)."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    widened, scales = torch.zeros(256, dtype=torch.int32), torch.zeros(256)
    kernels["byte_codes"].launch(_machine({"codes": codes}, widened=widened, scales=scales),
                                 codes=codes, widened=widened, scales=scales)
    assert torch.equal(widened[:128], torch.arange(128, dtype=torch.int32)), "codes below 128 are the control"
    assert torch.equal(widened, torch.arange(256, dtype=torch.int32)), f"code 128 widened to {int(widened[128])}"
    valid = torch.arange(1, 255)
    assert torch.equal(scales[valid], torch.exp2(valid.float() - 127))


def _e2m1_codes(values: torch.Tensor) -> torch.Tensor:
    """Round to the nearest e2m1 value, ties to the even code, saturating at +-6."""
    grid = mfma_model.E2M1_VALUE[:8].float()
    distance = (values.abs()[:, None] - grid[None, :]).abs()
    nearest = distance == distance.min(dim=1, keepdim=True).values
    code = torch.where(nearest.sum(1) > 1, (nearest & (torch.arange(8) % 2 == 0)).int().argmax(1),
                       nearest.int().argmax(1))
    return code | torch.where(values < 0, 8, 0)


@pytest.mark.xfail(strict=True, raises=UnsupportedCode,
                   reason="the emulator has no semantics for V_CVT_SCALEF32_PK_FP4_F32 / V_CVT_SCALEF32_PK_F32_FP4")
def test_fp4_conversions(kernels):
    """v_cvt_scalef32_pk_fp4_f32 (scale 1: round to nearest even e2m1, saturating) and
    v_cvt_scalef32_pk_f32_fp4 over every code: the fp4 conversions gfx950 has."""
    g = _generator(4)
    grid = mfma_model.E2M1_VALUE[:8].float()
    f = torch.cat([grid, -grid, (grid[:-1] + grid[1:]) / 2, torch.tensor([7.0, -9.0]),
                   torch.randn(512 - 31, generator=g) * 3])
    codes = torch.arange(LANES * 8, dtype=torch.int32) % 16
    words = (codes.view(LANES, 8) << (4 * torch.arange(8, dtype=torch.int32))).sum(1).to(torch.int32)
    packed = torch.zeros(LANES, dtype=torch.int32)
    decoded = torch.zeros(LANES * 8)
    kernels["fp4"].launch(_machine({"f": f, "codes": words}, packed=packed, decoded=decoded),
                                      f=f, codes=words, packed=packed, decoded=decoded)
    nibbles = (packed.view(-1, 1) >> (4 * torch.arange(8, dtype=torch.int32))) & 0xF
    assert torch.equal(nibbles.flatten(), _e2m1_codes(f))
    assert torch.equal(decoded, mfma_model.e2m1_value(codes).float())


def test_small_integer_to_float(kernels):
    out = torch.zeros(LANES)
    kernels["lane_to_float"].launch(_machine(out=out), out=out)
    assert torch.equal(out, torch.arange(LANES, dtype=torch.float32))


def _mfma_inputs(seed: int) -> dict[str, torch.Tensor]:
    """Lane bytes (e4m3 codes without NaN; fp4 reads any nibble), E8M0 codes 118..136 that differ
    between the four K blocks of each row, and an accumulator."""
    g = _generator(seed)
    a = torch.randint(0, 256, (LANES, 32), generator=g, dtype=torch.int32).to(torch.uint8)
    b = torch.randint(0, 256, (LANES, 32), generator=g, dtype=torch.int32).to(torch.uint8)
    a[(a & 0x7F) == 0x7F] ^= 1
    b[(b & 0x7F) == 0x7F] ^= 1
    scales = [torch.randint(118, 137, (LANES,), generator=g, dtype=torch.int32).to(torch.uint8) for _ in range(2)]
    for s in scales:
        assert all(len(set(s[row::16].tolist())) > 1 for row in range(16)), "scales must differ inside a step"
    acc = torch.randn(LANES, 4, generator=g)
    return {"a": a.flatten(), "scale_a": scales[0], "b": b.flatten(), "scale_b": scales[1], "acc": acc.flatten()}


def _run_mfma(kernel: Compiled, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    out = torch.zeros(LANES * 4)
    report = kernel.launch(_machine(inputs, out=out), **inputs, out=out)
    assert report.mfma == 1
    return out.view(LANES, 4).double()


def _model(inputs: dict[str, torch.Tensor], cbsz: int, lane_order: torch.Tensor | None = None) -> tuple:
    """(result, magnitude) of the model for the inputs, whose lanes are optionally reordered."""
    order = torch.arange(LANES) if lane_order is None else lane_order
    a, b = inputs["a"].view(LANES, 32)[order], inputs["b"].view(LANES, 32)[order]
    sa, sb = inputs["scale_a"][order], inputs["scale_b"][order]
    acc = inputs["acc"].view(LANES, 4).double()
    result = mfma_model.mfma(a, sa, b, sb, acc, cbsz, mfma_model.FP8)
    products = (mfma_model.operand_matrix(a, sa, cbsz).abs() @ mfma_model.operand_matrix(b, sb).abs().T)
    return result, acc.abs() + products[mfma_model.D_ROW, mfma_model.D_COLUMN]


BOUND = 2.0**-16  # x (|acc| + sum |a b|): f32 accumulation of 129 terms (129 x 2^-24 < 2^-16)


@pytest.mark.parametrize("name, cbsz", [("mfma_fp8_fp8", mfma_model.FP8), ("mfma_fp4_fp8", mfma_model.FP4)])
def test_scaled_mfma_agrees_with_the_model(kernels, name, cbsz):
    inputs = _mfma_inputs(5 + cbsz)
    got = _run_mfma(kernels[name], inputs)
    want, magnitude = _model(inputs, cbsz)
    error = (got - want).abs() / magnitude
    assert error.max() <= BOUND, f"worst lane, element {divmod(int(error.argmax()), 4)}: {float(error.max()):.3g}"


def test_an_mfma_fed_in_the_wrong_lane_order_disagrees_with_the_model(kernels):
    """Lane l fed the bytes of lane 4 (l % 16) + l / 16: far from the model on the real layout,
    and exactly the model of the permuted operands (the emulator computed what it was fed)."""
    inputs = _mfma_inputs(7)
    got = _run_mfma(kernels["mfma_fp8_fp8_transposed"], inputs)
    want, magnitude = _model(inputs, mfma_model.FP8)
    wrong = (got - want).abs() / magnitude > 100 * BOUND
    assert wrong.float().mean() > 0.9, f"only {int(wrong.sum())} of 256 results disagree with the model"
    lane = torch.arange(LANES)
    permuted, magnitude = _model(inputs, mfma_model.FP8, (lane % 16) * 4 + lane // 16)
    assert ((got - permuted).abs() / magnitude).max() <= BOUND


def test_buffer_accesses_past_num_records(kernels):
    """The resource of a tensor of 38 elements inside a storage of 64 (the bytes past 38 mapped
    and non-zero): loads there give 0 per dword, also past the storage's end, without a fault;
    stores past a 50-element resource are dropped."""
    storage = torch.arange(1, 65, dtype=torch.float32)
    x = storage[:38]
    scalars, chunks = torch.full((LANES,), -1.0), torch.full((LANES * 4,), -1.0)
    small_storage = torch.full((LANES,), -1, dtype=torch.int32)
    small = small_storage[:50]
    kernels["buffer_bounds"].launch(_machine({"x": storage}, scalars=scalars, chunks=chunks, small=small_storage),
                                    x=x, scalars=scalars, chunks=chunks, small=small)
    padded = torch.cat([x, torch.zeros(LANES * 4 - 38)])
    assert torch.equal(scalars, padded[:LANES])
    assert torch.equal(chunks, padded)
    lane = torch.arange(LANES, dtype=torch.int32)
    assert torch.equal(small_storage, torch.where(lane < 50, lane + SMALL_BASE, -1))


def test_global_atomics_from_many_lanes_and_workgroups(kernels):
    """8 workgroups x 256 threads add 1 to one of 4 counters: each counter ends at 512 and the
    values returned to its adders are exactly 0 .. 511 (every add saw a distinct predecessor)."""
    counters = torch.zeros(COUNTERS, dtype=torch.int32)
    old = torch.full((ATOMIC_GRID * ATOMIC_BLOCK,), -1, dtype=torch.int32)
    kernels["atomics"].launch(_machine(counters=counters, old=old), counters=counters, old=old)
    per_counter = ATOMIC_GRID * ATOMIC_BLOCK // COUNTERS
    assert counters.tolist() == [per_counter] * COUNTERS
    slot = torch.arange(len(old)) % ATOMIC_BLOCK % COUNTERS
    for s in range(COUNTERS):
        assert torch.equal(old[slot == s].sort().values, torch.arange(per_counter, dtype=torch.int32)), s


def test_a_workgroup_waits_for_the_flag_another_publishes(kernels):
    """Workgroup 0 polls the flag (holding the previous step's tag) until workgroup 1 has
    written the data and published this step's tag (templates/sync_device.py's publish and wait)."""
    sync = torch.zeros(FIRST_FLAG + 1, dtype=torch.int32)
    sync[EPOCH_WORD] = sync[FIRST_FLAG] = 5  # the flag of step 5 is up; this launch's tag is 6
    data, out = torch.zeros(LANES, dtype=torch.int32), torch.zeros(LANES, dtype=torch.int32)
    report = kernels["flag"].launch(_machine(sync=sync, data=data, out=out), sync=sync, data=data, out=out)
    want = torch.arange(LANES, dtype=torch.int32) * 7 + 6
    assert torch.equal(data, want) and torch.equal(out, want)
    assert int(sync[FIRST_FLAG]) == 6
    assert report.polls > 0, "workgroup 0 never waited: the test did not exercise the flag"


def test_a_kernel_reading_past_its_tensor_faults_naming_the_lane_and_allocation(kernels):
    """A stride-2 read over 64 elements: lane 32 is the first past the end. The bytes there
    belong to nobody registered (the numpy array behind the tensor is longer, unregistered)."""
    backing = np.zeros(2 * LANES, np.float32)
    x_array = backing[:LANES]
    x, out = torch.from_numpy(x_array), torch.zeros(LANES)
    machine = _machine(out=out)
    machine.register(x_array, "x", writable=False)
    with pytest.raises(EmulatorFault) as error:
        kernels["misaddressed"].launch(machine, x=x, out=out)
    text = str(error.value)
    assert "memory access outside every allocation" in text and "GLOBAL_LOAD" in text, text
    assert "lane 32" in text and "0 bytes past the end of 'x'" in text, text
    assert f"{x_array.ctypes.data + 4 * LANES:#x}" in text, text
    assert out.eq(0).all(), "the faulting launch stored nothing"
