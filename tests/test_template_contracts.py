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
