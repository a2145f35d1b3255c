"""The serving side on the device: the runner's hip backend (ctypes HIP, kernargs packed from
the cache's metadata, torch's current stream) against its reference backend on the same hook
tensors, the CU count, peer memory on one rank, and capture. They need an MI355X (gfx950) in SPX
mode and are skipped elsewhere; none of them has run on hardware yet."""

from __future__ import annotations

import pytest
import torch
from cache_settings import settings_at
from hook_inputs import Dims, hook_step, layer_weights, random_weights
from test_gpu import _on_gfx950

from mono_jit.runtime.backends import HipBackend, ReferenceBackend
from mono_jit.runtime.hip import Hip
from mono_jit.runtime.peer import exchange
from mono_jit.runtime.runner import MonoRunner

pytestmark = [
    pytest.mark.gfx950,
    pytest.mark.skipif(not _on_gfx950(), reason="needs an AMD MI355X (gfx950) GPU with ROCm; none on this machine"),
]


def _to(step, device):
    """The step's tensors on `device` (the weights object is moved by the caller)."""
    move = lambda t: t.to(device) if isinstance(t, torch.Tensor) else t  # noqa: E731
    kwargs = {k: move(v) for k, v in step.kwargs.items()}
    kwargs["select"] = step.kwargs["select"]
    return (step.args[0], *map(move, step.args[1:])), kwargs


def _moved(t: torch.Tensor, device) -> torch.Tensor:
    """`t` on `device` with its layout: a row-padded weight moves with its padding."""
    if t.is_contiguous():
        return t.to(device)
    rows, k = t.shape
    return torch.as_strided(t, (rows, t.stride(0)), (t.stride(0), 1)).to(device)[:, :k]


def _weights_on(device):
    """Layer weights on the device; the MoE tensors (never read by K1, over 256 MB) stay put."""
    w = layer_weights(random_weights(row_pad=256))
    for obj in (w, w.attn):
        for name, value in vars(obj).items():
            if isinstance(value, torch.Tensor) and value.numel() < 2**28:
                setattr(obj, name, _moved(value, device))
    w.attn.check(Dims())
    return w


@pytest.mark.parametrize("m, first", [(1, False), (3, True), (37, False)])
def test_k1_through_the_hip_runner_matches_the_reference_runner(k1_cache, m, first):
    device = torch.device("cuda", torch.cuda.current_device())
    w = _weights_on(device)
    settings = settings_at(k1_cache, MONO_JIT_OFFLINE="1")
    hip_runner = MonoRunner(8, 0, None, device, 8192, templates=("k1",), settings=settings, backend=HipBackend())
    ref_runner = MonoRunner(8, 0, None, device, 8192, templates=("k1",), backend=ReferenceBackend())
    assert hip_runner.declined is None and ref_runner.declined is None
    step = hook_step(w, m, first)
    args, kwargs = _to(step, device)
    ref_args, ref_kwargs = _to(hook_step(w, m, first), device)
    assert hip_runner.forward(*args, **kwargs)[:4] is None
    ref_runner.forward(*ref_args, **ref_kwargs)
    torch.cuda.synchronize()
    for name, out in hip_runner.front_out.items():
        torch.testing.assert_close(out[:m].float(), ref_runner.front_out[name][:m].float(), rtol=3e-2, atol=3e-2,
                                   msg=lambda text: f"{name}: {text}")
    differing = (args[7].cpu() != ref_args[7].cpu()).float().mean().item()
    assert differing < 1e-3, f"{differing:.2%} of the SWA cache's bytes differ (an e4m3 ulp flips a few)"


def test_the_device_has_the_cus_for_the_persistent_grid():
    assert Hip.get().compute_units(torch.cuda.current_device()) >= 256, "a CPX / DPX partition: K1 / K2 would hang"


def test_peer_memory_on_one_rank_is_uncached_zeroed_and_its_own_address():
    memory, why = exchange(Hip.get(), 10_000, None, 0, 1)
    assert why is None and memory.addresses == [memory.local.data_ptr()] and memory.local.numel() == 12_288


def test_the_runner_refuses_to_be_built_inside_a_capture(k1_cache):
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(Exception, match="graph capture"):
        with torch.cuda.graph(graph):
            MonoRunner(8, 0, None, "cuda", 8192, templates=("k1",), settings=settings_at(k1_cache))
