"""Code-object checks and the residency gate, on real and doctored inputs."""

import pytest

from cache_settings import settings_at
from mono_jit.cache import Entry, Store
from mono_jit.errors import InvalidCodeObject, ResourceError
from mono_jit.hsaco.metadata import check_header, inspect_code_object
from mono_jit.hsaco.resources import Budget, check


@pytest.fixture
def router_entry(golden_cache) -> Entry:
    return next(e for e in Store(settings_at(golden_cache)).entries()
                if isinstance(e, Entry) and e.meta.template == "router")


def test_real_code_object_metadata(router_entry):
    (kernel,) = inspect_code_object(router_entry.hsaco, "gfx950")
    assert kernel.wavefront_size == 64 and kernel.max_workgroup_size == 256
    assert kernel.kernarg_size == kernel.args[-1].offset + kernel.args[-1].size  # no hidden kernargs
    assert len(kernel.args) == 2 * 6 + 2  # six tensors (pointer, i32 length) and two i32 scalars
    assert kernel.lds >= 384 * 4


def test_header_rejects_other_arch_machine_and_abi(router_entry):
    blob = bytearray(router_entry.hsaco)
    wrong_arch = bytearray(blob)
    wrong_arch[48] = 0x4C  # e_flags low byte: gfx942
    with pytest.raises(InvalidCodeObject, match="gfx950"):
        check_header(bytes(wrong_arch), "gfx950")
    wrong_abi = bytearray(blob)
    wrong_abi[8] = 3
    with pytest.raises(InvalidCodeObject, match="code object v6"):
        check_header(bytes(wrong_abi), "gfx950")
    with pytest.raises(InvalidCodeObject, match="not an ELF"):
        check_header(b"hello", "gfx950")


def test_gate_rejects_with_figures(router_entry):
    (kernel,) = inspect_code_object(router_entry.hsaco, "gfx950")
    fat = kernel._replace(vgpr=512, agpr=0)
    with pytest.raises(ResourceError, match=r"512 VGPR"):
        check(fat, block=512, grid=256, dynamic_lds=0, persistent=True, budget=Budget(), what="t")
    spilled = kernel._replace(scratch=8, vgpr_spills=2)
    with pytest.raises(ResourceError, match=r"scratch 8 B > budget 0 B"):
        check(spilled, block=256, grid=4, dynamic_lds=0, persistent=False, budget=Budget(), what="t")
    check(spilled, block=256, grid=4, dynamic_lds=0, persistent=False, budget=Budget(8, 2), what="t")
    with pytest.raises(ResourceError, match="LDS"):
        check(kernel, block=256, grid=4, dynamic_lds=200 * 1024, persistent=False, budget=Budget(), what="t")
    with pytest.raises(ResourceError, match="persistent grid 4"):
        check(kernel, block=256, grid=4, dynamic_lds=0, persistent=True, budget=Budget(), what="t")


def test_finish_refuses_launches_that_differ_from_the_template(router_entry, tmp_path):
    from mono_jit.pipeline.job import BuildJob
    from mono_jit.errors import CompileError
    from mono_jit.spec import Spec
    from mono_jit.templates import get
    from mono_jit.pipeline.workers import Outcome

    job = BuildJob.plan(get("router"), Spec.from_dict(router_entry.meta.build_spec), router_entry.meta.toolchain)
    store = Store(settings_at(tmp_path / "c"))
    good = router_entry.meta.launches[0].to_json()
    wrong = {**good, "grid": [256, 1, 1]}
    for launches, message in (([wrong], "differs from the template's launch shape"), ([], "launched no kernel"),
                              ([{**good, "kernel": "other_0"}], "not in the code object")):
        outcome = Outcome(job.key, "ok", {"hsaco": router_entry.hsaco, "launches": launches, "seconds": 0.1})
        with pytest.raises(CompileError, match=message):
            job.finish(store, outcome)
    failed = Outcome(job.key, "timeout", "no result after 5 s")
    with pytest.raises(CompileError, match=r"router\(max_tokens=1, arch=gfx950\) failed to compile \(timeout\)"):
        job.finish(store, failed)
    entry = job.finish(store, Outcome(job.key, "ok", {"hsaco": router_entry.hsaco, "launches": [good], "seconds": 0.1}))
    assert entry.key == router_entry.key
