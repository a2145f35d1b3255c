"""The emulator backend registers the arguments a template only reads (runtime/read_only.py)
read-only: a write into one faults, and the weak-memory mode leaves them untracked."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from mono_jit.runtime import backends
from mono_jit.runtime.backends import EmulatorBackend, Kernel
from mono_jit.spec import Spec

pytest.importorskip("numba", reason="the emulator needs the emulate extra (numba, tinygrad)")


def _registered(monkeypatch, template: str, values: dict) -> dict[str, bool]:
    """{name: writable} of the allocations a launch of `template` finds registered."""
    backend = EmulatorBackend()
    seen: dict[str, bool] = {}
    monkeypatch.setattr(backends, "pack", lambda meta, values: b"")
    monkeypatch.setattr(backend.machine, "launch",
                        lambda *args: seen.update({a.name: a.writable for a in backend.machine.allocations}))
    shape = SimpleNamespace(grid=(1, 1, 1), block=(64, 1, 1), dynamic_lds=0)
    backend.launch(Kernel(template, Spec(8, 4, 1024, 1), SimpleNamespace(launch=shape), None), values, 0)
    assert backend.machine.allocations == [], "the launch's registrations are dropped after it"
    return seen


def test_k1_weights_are_registered_read_only_and_its_outputs_writable(monkeypatch):
    values = {"w_qkv": torch.zeros(8, dtype=torch.uint8), "rope": torch.zeros(4), "q_out": torch.zeros(4), "m": 1}
    assert _registered(monkeypatch, "k1", values) == {"w_qkv": False, "rope": False, "q_out": True}


def test_a_template_not_listed_has_every_tensor_writable(monkeypatch):
    assert _registered(monkeypatch, "router", {"w_qkv": torch.zeros(4)}) == {"w_qkv": True}
