"""What a code object states of each kernel: its kernarg layout and resource use.

Plain records, apart from the reader that makes them (hsaco/metadata.py), so that a cache hit can parse a
stored entry's metadata without the code-object reader (Records, as every record a hit
defines: see mono_jit/record.py).
"""

from __future__ import annotations

from ..record import Record


class KernelArg(Record):
    offset: int
    size: int
    value_kind: str


class KernelInfo(Record):
    """One kernel's resource use and launch ABI, as the code object states it."""

    name: str
    symbol: str
    args: tuple[KernelArg, ...]
    kernarg_size: int
    vgpr: int
    agpr: int
    sgpr: int
    lds: int
    scratch: int
    vgpr_spills: int
    sgpr_spills: int
    wavefront_size: int
    max_workgroup_size: int
    reqd_workgroup_size: tuple[int, ...] = ()

    def as_dict(self) -> dict:
        return self._asdict()
