"""Each persistent template's arguments() (what meta.json and the runner read) names its
launcher's parameters in order, and its placeholders have the declared dtypes and kinds."""

from __future__ import annotations

import inspect

import pytest

from mono_jit.spec import Spec
from mono_jit.templates import get


@pytest.mark.parametrize("name, spec", [("k1", Spec(8, 4, 1024, 8)), ("k2", Spec(8, 128, 8192, 8))])
def test_argument_contract_matches_the_launcher_and_placeholders(name, spec):
    build = get(name).build(spec)
    params = [p for p in inspect.signature(build.launcher.func).parameters if p != "stream"]
    contract = get(name).arguments(spec)
    assert [a.name.replace("_", "") for a in contract] == [p.lower().replace("_", "") for p in params]
    assert len(build.placeholders) == len(contract)
    for argument, placeholder in zip(contract, build.placeholders):
        if argument.kind == "tensor":
            assert str(placeholder.dtype) == f"torch.{argument.dtype}", argument.name
        else:
            assert isinstance(placeholder, int), argument.name


def _swapped(arguments: tuple, first: str, second: str) -> tuple:
    """`arguments` with the two named ones trading places."""
    order = [a.name for a in arguments]
    i, j = order.index(first), order.index(second)
    swapped = list(arguments)
    swapped[i], swapped[j] = swapped[j], swapped[i]
    return tuple(swapped)


@pytest.mark.parametrize("name, first, second", [
    ("router", "x", "gate"),  # two tensors
    ("router", "m", "use_hash"),  # two i32s
    ("keytable", "block_table_stride", "entries_per_page"),
])
def test_two_same_kind_arguments_swapped_in_the_declaration_fail_the_build_check(golden_cache, name, first,
                                                                                 second):
    """The code object's kernarg table has only kinds and sizes (no names), so a declaration with
    two arguments of one kind swapped still matches it and would pack each value into the other's
    slot; the launcher check refuses it by name, before anything compiles."""
    from cache_settings import settings_at

    from mono_jit.cache import Entry, Store
    from mono_jit.errors import TemplateError
    from mono_jit.templates import checks

    spec = Spec(8, 4, 1024, 1)
    template = get(name)
    declared = template.arguments(spec)
    swapped = _swapped(declared, first, second)
    launcher = template.build(spec).launcher
    checks.match_launcher(name, declared, launcher)
    with pytest.raises(TemplateError, match=f"launcher parameter .* arguments\\(\\) declares {second} "):
        checks.match_launcher(name, swapped, launcher)
    entry = next(e for e in Store(settings_at(golden_cache)).entries()
                 if isinstance(e, Entry) and e.meta.template == name)
    checks.match_kernargs(name, swapped, entry.meta.kernels[0])  # kinds and sizes alone cannot see it


def test_a_launcher_with_a_parameter_of_another_kind_or_count_is_refused():
    from mono_jit.errors import TemplateError
    from mono_jit.templates import Argument, checks

    def launcher(X: fx.Tensor, m: fx.Int64, stream: fx.Stream = None):  # noqa: F821  # annotations stay text
        pass

    with pytest.raises(TemplateError, match=r"parameter 1 is m \(i64\), arguments\(\) declares m \(i32\)"):
        checks.match_launcher("t", (Argument.tensor("x", "float32", ""), Argument.i32("m", "")), launcher)
    with pytest.raises(TemplateError, match="2 parameters before its stream, arguments\\(\\) declares 1"):
        checks.match_launcher("t", (Argument.tensor("x", "float32", ""),), launcher)
