"""The hip backend's path on the CPU with HIP itself replaced by a recorder: the runner resolves
its K1 grid from a real cache, loads each code object, and a step's launch carries the entry's
launch shape and kernargs that point at vLLM's own tensors. Also: offline misses and a missing
HIP runtime decline with their reasons."""

from __future__ import annotations

import struct

import pytest
from cache_settings import settings_at
from hook_inputs import Dims, hook_step, layer_weights, random_weights

from mono_jit.hsaco.metadata import read_metadata
from mono_jit.runtime import hip as hip_module
from mono_jit.runtime.backends import HipBackend
from mono_jit.runtime.hip import Function, HipError
from mono_jit.runtime.runner import MonoRunner


class RecordingHip:
    """Stands in for the HIP runtime: records loads and launches."""

    def __init__(self):
        self.loaded, self.launched = [], []

    def load(self, image: bytes, kernel: str) -> Function:
        self.loaded.append((image, kernel))
        return Function(len(self.loaded), 1000 + len(self.loaded), kernel, image)

    def launch(self, function, grid, block, dynamic_lds, stream, kernargs):
        self.launched.append((function, grid, block, dynamic_lds, stream, kernargs))


@pytest.fixture
def fake_hip(monkeypatch):
    recorder = RecordingHip()
    monkeypatch.setattr(hip_module.Hip, "get", classmethod(lambda cls: recorder))
    return recorder


@pytest.fixture(scope="module")
def weights():
    w = layer_weights(random_weights(row_pad=256))
    w.attn.check(Dims())
    return w


def test_a_step_launches_the_buckets_k1_with_vllms_tensors_in_its_kernargs(k1_cache, fake_hip, weights):
    runner = MonoRunner(8, 0, None, "cpu", 8192, templates=("k1",), settings=settings_at(k1_cache),
                        backend=HipBackend())
    assert runner.declined is None
    assert sorted(kernel for _, kernel in fake_hip.loaded) == ["k1_kernel_0"] * 7
    step = hook_step(weights, 3, first=False)
    runner.forward(*step.args, **step.kwargs)
    (function, grid, block, lds, stream, kernargs), = fake_hip.launched
    image = fake_hip.loaded[function.handle - 1][0]
    build = next(b for b in runner.kernels if b.bucket == 4)
    meta = runner.kernels[build].meta
    assert image == function.image and meta.spec["max_tokens"] == 4
    assert (grid, block, lds, stream) == ((256, 1, 1), (512, 1, 1), meta.launch.dynamic_lds, 0)
    _, (kernel,) = read_metadata(image)
    names = [a.name for a in meta.arguments for _ in range(2 if a.kind == "tensor" else 1)]
    words = {}
    for name, arg in zip(names, kernel.args):
        fmt = "<Q" if arg.size == 8 else "<i"
        words.setdefault(name, []).append(struct.unpack_from(fmt, kernargs, arg.offset)[0])
    _, x, residual, post_mix, res_mix, positions, slots, swa = step.args[:8]
    assert words["residual"] == [residual.data_ptr(), residual.numel()]
    assert words["x"] == [x.data_ptr(), x.numel()]
    assert words["positions"] == [positions.data_ptr(), 3] and words["slot_mapping"] == [slots.data_ptr(), 3]
    assert words["kv_cache"][0] == swa.data_ptr()
    assert words["w_qb"] == [weights.attn.wq_b.data_ptr(), 16 * 512 * 1792]
    assert words["m"] == [3] and words["do_fold"] == [1] and words["page_stride"] == [swa.stride(0)]
    assert words["qkv_shuffled"] == [1] and words["qb_stride"] == [1792] and words["block_size"] == [64]
    assert words["sync"][0] == runner.buffers[build]["sync"].data_ptr()


def test_an_offline_miss_declines_and_names_the_prebuild_command(tmp_path, fake_hip):
    runner = MonoRunner(8, 0, None, "cpu", 8192, templates=("k1",), backend=HipBackend(),
                        settings=settings_at(tmp_path / "empty", MONO_JIT_OFFLINE="1"))
    assert "OfflineMiss" in runner.declined and "mono-jit prebuild --template k1" in runner.declined
    assert fake_hip.loaded == []


def test_no_hip_runtime_declines_with_hips_reason(monkeypatch, tmp_path):
    def no_runtime(cls):
        raise HipError("no HIP runtime (libamdhip64) can be loaded: not found")

    monkeypatch.setattr(hip_module.Hip, "get", classmethod(no_runtime))
    runner = MonoRunner(8, 0, None, "cpu", 8192, templates=("k1",), settings=settings_at(tmp_path / "c"))
    assert "libamdhip64" in runner.declined


class _NullLib:
    """A HIP library whose every call reports success but writes no pointer."""

    def __getattr__(self, name):
        return lambda *args: 0


def test_a_call_that_succeeds_with_a_null_pointer_is_an_error_not_an_address_of_none():
    hip = hip_module.Hip.__new__(hip_module.Hip)
    hip._lib = _NullLib()
    with pytest.raises(HipError, match="hipExtMallocWithFlags succeeded but returned a null pointer"):
        hip.malloc_uncached(4096)
    with pytest.raises(HipError, match="hipModuleGetFunction succeeded but returned a null pointer"):
        hip.load(b"code", "kernel")
