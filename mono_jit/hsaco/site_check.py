"""The site-by-site hand-off check of a built code object: every release and acquire of its
kernel (hsaco/handoffs.py) and every scalar load proved to read the kernarg segment
(hsaco/kernarg_loads.py), over the disassembly the ISA gates read (hsaco/isa.py)."""

from __future__ import annotations

from .handoffs import Finding, check_code
from .kernarg_loads import kernarg_pair, unproved_scalar_loads
from .listing import parse_listing
from .metadata import read_metadata


def check_code_object(hsaco: bytes, listing: str) -> list[Finding]:
    """Every finding of the one kernel in `hsaco`, whose llvm-objdump listing is `listing`."""
    (kernel,) = read_metadata(hsaco)[1]
    code = parse_listing(listing)
    first = kernarg_pair(hsaco, kernel.symbol.removesuffix(".kd"))
    return check_code(code) + unproved_scalar_loads(code, first, kernel.kernarg_size)
