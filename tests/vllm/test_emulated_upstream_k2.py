"""Calibration on hardware-proven code: vLLM 0.33's own mono K2, which runs on MI355X, built
through mono-jit's plug-in protocol (tests/vllm/upstream_mono.py) to the bytes that run there.

Needs AITER's FlyDSL helpers: MONO_JIT_AITER_HELPERS names their folder (.ci/run points it at
them); without them the tests skip, saying so.

    MONO_JIT_AITER_HELPERS=/path/to/aiter/helpers .venv/bin/python -m pytest -q -s \\
        tests/vllm/test_emulated_upstream_k2.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from upstream_mono import DIGESTS, helpers_problem, kernel_symbol, prebuilt

from mono_jit.spec import Spec

pytest.importorskip("vllm", reason="upstream's K2 is vLLM 0.33's (the --with-vllm set-up)")
pytest.importorskip("flydsl", reason="building needs mono-jit[build]")
PROBLEM = helpers_problem()  # read at collection: the session's fixtures drop MONO_JIT_* variables
HELPERS = Path(os.environ.get("MONO_JIT_AITER_HELPERS", "."))
pytestmark = [pytest.mark.slow, pytest.mark.skipif(PROBLEM is not None, reason=PROBLEM or "")]

SPECS = (Spec(8, 4, 1024, 1), Spec(8, 128, 8192, 1), Spec(8, 4, 1024, 64))


@pytest.fixture(scope="module")
def entries(tmp_path_factory):
    """{spec: cache entry} of upstream's K2, prebuilt as any installed plug-in is."""
    with prebuilt("k2", SPECS, tmp_path_factory.mktemp("upstream-k2"),
                  tmp_path_factory.mktemp("upstream-k2-cache"), HELPERS) as built:
        yield built


def test_upstream_k2_builds_to_the_hardware_proven_bytes(entries):
    """Every build has upstream's symbol, and the sha256 and size of the code that runs on MI355X."""
    assert sorted(entries, key=SPECS.index) == list(SPECS)
    for spec, entry in entries.items():
        assert [k["name"] for k in entry.meta["kernels"]] == [kernel_symbol("k2", spec)]
        assert (entry.meta["hsaco"]["sha256"][:16], entry.meta["hsaco"]["size"]) == DIGESTS["k2"][spec], spec
