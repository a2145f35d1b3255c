"""The ISA gate on byte loads shared by K1's and K2's static gates.

Every byte K1 and K2 load on its own is an unsigned code (an E8M0 / UE8M0 scale): it must be
zero-extended (`*_load_ubyte`, `_dsl.load_code`), never sign-extended. A sign-extending load
(`*_load_sbyte`, `ds_read_i8`) made S2's codes of 128 or more negative scales. No byte in these
kernels is a signed number, so the gate allows none, masked or not.
"""

from __future__ import annotations

from collections import Counter

SIGN_EXTENDING = ("buffer_load_sbyte", "global_load_sbyte", "flat_load_sbyte", "scratch_load_sbyte",
                  "ds_read_i8")


def assert_codes_load_unsigned(counts: Counter[str]) -> None:
    """No sign-extending byte load in a listing's mnemonic counts, and some zero-extending one."""
    signed = {m: n for m, n in counts.items() if m.startswith(SIGN_EXTENDING)}
    assert not signed, f"unsigned codes loaded sign-extended: {signed}"
    assert any(m.startswith(("buffer_load_ubyte", "global_load_ubyte")) for m in counts)
