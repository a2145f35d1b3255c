"""Each template's arguments() (what meta.json and the runner read) names its launcher's
parameters in order, and its placeholders have the declared dtypes and kinds: the checks every
compile worker makes before tracing, and what they refuse."""

from __future__ import annotations

import flydsl.expr as fx
import pytest

from mono_jit.errors import TemplateError
from mono_jit.spec import Spec
from mono_jit.templates import get


@pytest.mark.parametrize("name, spec", [("router", Spec(8, 4, 1024, 8)), ("keytable", Spec(8, 4, 1024, 8)),
                                        ("k1", Spec(8, 4, 1024, 8)), ("k2", Spec(8, 128, 8192, 8))])
def test_argument_contract_matches_the_launcher_and_placeholders(name, spec):
    """What every compile worker checks before tracing (checks.match_build), for each built-in."""
    from mono_jit.templates import checks

    checks.match_build(name, get(name).arguments(spec), get(name).build(spec))


def test_a_placeholder_of_another_dtype_or_kind_is_refused():
    import torch

    from mono_jit.templates import Argument, checks

    declared = (Argument.tensor("x", "bfloat16", ""), Argument.i32("m", ""))
    checks.match_placeholders("t", declared, (torch.empty(4, dtype=torch.bfloat16), 3))
    with pytest.raises(TemplateError, match=r"placeholder of x is float32, arguments\(\) declares a bfloat16"):
        checks.match_placeholders("t", declared, (torch.empty(4), 3))
    with pytest.raises(TemplateError, match=r"placeholder of m is a Tensor, arguments\(\) declares an i32"):
        checks.match_placeholders("t", declared, (torch.empty(4, dtype=torch.bfloat16), torch.empty(1)))
    with pytest.raises(TemplateError, match=r"1 placeholders, arguments\(\) declares 2"):
        checks.match_placeholders("t", declared, (3,))


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
    from mono_jit.templates import checks

    spec = Spec(8, 4, 1024, 1)
    template = get(name)
    declared = template.arguments(spec)
    swapped = _swapped(declared, first, second)
    build = template.build(spec)
    checks.match_build(name, declared, build)
    with pytest.raises(TemplateError, match=f"launcher parameter .* arguments\\(\\) declares {second} "):
        checks.match_build(name, swapped, build)
    entry = next(e for e in Store(settings_at(golden_cache)).entries()
                 if isinstance(e, Entry) and e.meta.template == name)
    checks.match_kernargs(name, swapped, entry.meta.kernels[0])  # kinds and sizes alone cannot see it


def test_a_launcher_with_a_parameter_of_another_kind_or_count_is_refused():
    from mono_jit.templates import Argument, checks

    def launcher(X: fx.Tensor, m: fx.Int64, stream: fx.Stream = None):  # annotations stay text
        pass

    parameters = checks.launcher_parameters(launcher)
    with pytest.raises(TemplateError, match=r"parameter 1 is m \(i64\), arguments\(\) declares m \(i32\)"):
        checks.match_parameters("t", (Argument.tensor("x", "float32", ""), Argument.i32("m", "")), parameters)
    with pytest.raises(TemplateError, match="2 parameters before its stream, arguments\\(\\) declares 1"):
        checks.match_parameters("t", (Argument.tensor("x", "float32", ""),), parameters)


def test_an_all_scalar_launchers_leading_anchor_tensor_is_left_out():
    """FlyDSL compiles without launching only when some placeholder is a CPU tensor, so a
    launcher of scalars only takes one leading tensor no kernel reads (docs/plugins.md); the check
    leaves it out and still compares the scalars by name."""
    import torch

    from mono_jit.templates import Argument, Build, checks

    def launcher(anchor: fx.Tensor, address: fx.Int64, m: fx.Int32, stream: fx.Stream = None):
        pass

    declared = (Argument.i64("address", ""), Argument.i32("m", ""))
    checks.match_build("t", declared, Build(launcher, (torch.empty(1, dtype=torch.uint8), 0, 0)))
    with pytest.raises(TemplateError, match="parameter 0 is address \\(i64\\), arguments\\(\\) declares m"):
        checks.match_build("t", declared[::-1], Build(launcher, (torch.empty(1, dtype=torch.uint8), 0, 0)))


def test_a_launcher_takes_its_kernels_parameters_then_the_stream():
    """templates/launch.py writes no parameter list: the @flyc.jit launcher's are the kernel's
    (names, kinds and order, through FlyDSL's rewrite of the launcher), then `stream`; the
    placeholders follow arguments() (a CPU tensor of each dtype, an int for a scalar)."""
    import inspect

    import torch

    from mono_jit.templates import Argument, Build, LaunchShape, checks
    from mono_jit.templates.launch import launcher, placeholders

    def toy_kernel(Values: fx.Tensor, Out: fx.Tensor, m: fx.Int32, base: fx.Int64):
        pass

    declared = (Argument.tensor("values", "bfloat16", ""), Argument.tensor("out", "int32", ""),
                Argument.i32("m", ""), Argument.i64("base", ""))
    build = Build(launcher(toy_kernel, LaunchShape((2, 1, 1), (64, 1, 1))), placeholders(declared))
    assert checks.launcher_parameters(build.launcher) == [("Values", "tensor"), ("Out", "tensor"), ("m", "i32"),
                                                          ("base", "i64")]
    assert list(inspect.signature(build.launcher.func).parameters)[-1] == "stream"
    assert [getattr(p, "dtype", int) for p in build.placeholders] == [torch.bfloat16, torch.int32, int, int]
    assert all(p.device.type == "cpu" for p in build.placeholders[:2])
    checks.match_build("toy", declared, build)
    with pytest.raises(TemplateError, match="launcher parameter 0 is Values"):
        checks.match_build("toy", (Argument.tensor("out", "int32", ""), *declared[1:]), build)
