"""K1's and K2's argument table is stated once, in the template's arguments(): the runner's
mapping, the selfcheck worlds and the launch harnesses give their values by name, and whatever
launches positionally takes the order from arguments(). So reordering the declaration changes
nothing else, and a name the declaration and a mapping do not share is refused, named."""

from __future__ import annotations

import pytest
import torch
from hook_inputs import Dims, hook_step, layer_weights
from k2_inputs import full_weights, shard, world

from mono_jit.runtime.backends import ReferenceBackend
from mono_jit.errors import KernargError
from mono_jit.templates.base import in_order
from mono_jit.runtime.runner import MonoRunner
from mono_jit.selfcheck.k1_world import K1Run, random_weights
from mono_jit.selfcheck.k2_run import K2Run
from mono_jit.spec import Spec
from mono_jit.templates.k1 import K1Template
from mono_jit.templates.k2 import K2Template


def reordered(monkeypatch, template: type, change) -> None:
    """Make `template`'s arguments() answer `change(its declaration)`."""
    declared = template.arguments
    monkeypatch.setattr(template, "arguments", lambda self, spec: tuple(change(declared(self, spec))))


def reversed_order(arguments):
    return reversed(arguments)


def renamed(old: str, new: str):
    def change(arguments):
        return [a._replace(name=new) if a.name == old else a for a in arguments]
    return change


def same(a, b) -> bool:
    return a is b if isinstance(a, torch.Tensor) else a == b


def test_in_order_follows_the_names_and_refuses_a_missing_or_unknown_one():
    assert in_order("t", ["b", "a"], {"a": 1, "b": 2}) == (2, 1)
    with pytest.raises(KernargError, match=r"t: missing arguments \['c'\], unknown arguments \['a'\]"):
        in_order("t", ["b", "c"], {"a": 1, "b": 2})


def _k1_run(launcher) -> K1Run:
    return K1Run(4, random_weights(row_pad=256), row_pad=256, shuffled=False, device="cpu", launcher=launcher)


def test_k1_worlds_launch_follows_the_declared_order(monkeypatch):
    got: list[tuple] = []
    reordered(monkeypatch, K1Template, reversed_order)
    run = _k1_run(lambda *values: got.append(values))
    step = run.set_step(3, seed=3, do_fold=1)
    run.launch(step)
    named = run.arguments(step)
    names = [a.name for a in K1Template().arguments(Spec(8, 4, 1024, 4))]
    assert names[0] == "block_size" and names[-1] == "x"
    (values,) = got
    assert all(same(value, named[name]) for name, value in zip(names, values, strict=True))


def test_k1_worlds_launch_refuses_a_name_it_does_not_give(monkeypatch):
    reordered(monkeypatch, K1Template, renamed("qb_stride", "qb_pitch"))
    run = _k1_run(lambda *values: None)
    with pytest.raises(KernargError, match=r"missing arguments \['qb_pitch'\], unknown arguments \['qb_stride'\]"):
        run.launch(run.set_step(2, seed=2, do_fold=0))


@pytest.fixture(scope="module")
def k2_shard():
    return shard(full_weights(), 0)


def test_k2_runs_positional_arguments_follow_the_declared_order(monkeypatch, k2_shard):
    run = K2Run(world(4), k2_shard, 0, 4, "cpu")
    named = run.arguments()
    reordered(monkeypatch, K2Template, reversed_order)
    names = [a.name for a in K2Template().arguments(Spec(8, 4, 1024, 4))]
    assert names[0] == "peer_wait_us" and names[-1] == "positions"
    assert all(same(value, named[name]) for name, value in zip(names, run.ordered(), strict=True))
    reordered(monkeypatch, K2Template, renamed("bt_stride", "block_table_stride"))
    with pytest.raises(KernargError, match=r"missing arguments \['block_table_stride'\], unknown arguments "
                                           r"\['bt_stride'\]"):
        run.ordered()


@pytest.fixture(scope="module")
def hook_weights():
    w = layer_weights(random_weights(row_pad=256, positions=64))
    w.attn.check(Dims())
    w.check(Dims())
    return w


def _front(weights) -> dict[str, torch.Tensor]:
    runner = MonoRunner(8, 0, None, "cpu", 8192, templates=("k1",), backend=ReferenceBackend())
    assert runner.declined is None, runner.declined
    step = hook_step(weights, 3, False)
    runner.forward(*step.args, **step.kwargs)
    return {name: value[:3].clone() for name, value in runner.front_out.items()}


def test_the_runners_mapping_is_by_name_in_any_declared_order(monkeypatch, hook_weights):
    want = _front(hook_weights)
    reordered(monkeypatch, K1Template, reversed_order)
    got = _front(hook_weights)
    assert all(torch.equal(got[name], want[name]) for name in want)


def test_the_runners_mapping_refuses_a_name_the_template_does_not_declare(monkeypatch, hook_weights):
    reordered(monkeypatch, K1Template, renamed("page_stride", "swa_page_stride"))
    with pytest.raises(KernargError, match=r"k1: missing arguments \['swa_page_stride'\], unknown arguments "
                                           r"\['page_stride'\]"):
        _front(hook_weights)
