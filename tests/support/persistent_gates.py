"""The gate both persistent kernels' builds must pass: every build fits the persistent grid
(one CTA of 512 threads on each of the 256 CUs, two waves per SIMD, more than half the CU's
LDS pinned so no second CTA lands there), with no scratch and no spills, and its kernarg block
is exactly its template's arguments() in order."""

from __future__ import annotations

from mono_jit.cache.meta import EntryMeta

from mono_jit.hsaco.metadata import read_metadata
from mono_jit.hsaco.site_check import check_code_object
from mono_jit.hsaco.kernel_info import KernelInfo
from mono_jit.hsaco.resources import LDS_PER_CU
from mono_jit.templates.kernargs import DeclaredMeta, DeclaredTable, layout
from mono_jit.spec import Spec
from mono_jit.templates import get


def assert_fits_the_persistent_grid(template: str, meta: EntryMeta, hsaco: bytes, pinned_lds: int,
                                    static_lds: int) -> KernelInfo:
    """The checks above for one build of `template`; returns its kernel's record for more."""
    assert meta.launch.to_json() == {"grid": [256, 1, 1], "block": [512, 1, 1], "dynamic_lds": pinned_lds}
    assert meta.persistent is True
    (kernel,) = read_metadata(hsaco)[1]
    assert kernel.scratch == 0 and kernel.vgpr_spills == 0 and kernel.sgpr_spills == 0
    assert kernel.reqd_workgroup_size == (512, 1, 1)
    residency = meta.residency[kernel.name].as_dict()
    assert residency["ctas_per_cu"] == 1 and residency["waves_per_simd"] == 2  # one CTA on each CU
    assert kernel.lds == static_lds and residency["lds_bytes"] > LDS_PER_CU // 2
    # The kernarg block is exactly the contract, arguments(): each tensor its pointer and i32 length, each i32 one.
    assert [a.name for a in meta.arguments] == [a.name for a in get(template).arguments(Spec.from_dict(meta.build_spec))]
    layout(DeclaredMeta(template, meta.arguments, (DeclaredTable(kernel.args),), meta.launch))
    return kernel


def assert_handoffs_hold_site_by_site(hsaco: bytes, listing: str) -> None:
    """Every flag store released, every wait acquired, every scalar load of the kernarg segment
    (mono_jit/hsaco/site_check.py): each finding names its site and what is missing."""
    findings = check_code_object(hsaco, listing)
    assert not findings, "\n".join(map(str, findings))
