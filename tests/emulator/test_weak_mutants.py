"""Fence mutants of K1's built code object through the emulator's weak memory (issue 36 item 6,
its dynamic half; tests/hsaco/test_handoffs.py holds the static half): of each kind (write-back,
wait, invalidate), the mutants whose fence the site check does not call idle are tried from the
last site back until one reads stale under its option (tests/support/weak_mutants.py), and the
write-back one caught is not caught with every workgroup on one XCD (the mechanism, not a
count). A subset: a caught mutant stops at its first stale read (seconds), a missed one runs
whole in weak memory (10-25 s at bucket 1), so every K1 and K2 mutant would cost CI many
minutes; docs/emulator.md gives K1's whole table."""

from __future__ import annotations

import pytest
from cache_settings import settings_at
from weak_mutants import k1_weak_rows

from mono_jit.hsaco.fence_mutants import fence_mutants, idle_fences
from mono_jit.hsaco.isa import disassemble, find_objdump
from mono_jit.hsaco.listing import parse_listing
from mono_jit.pipeline.resolve import resolve
from mono_jit.spec import Spec
from mono_jit.templates import get

pytest.importorskip("numba", reason="the emulator needs the emulate extra (numba, tinygrad)")
pytest.importorskip("tinygrad", reason="the emulator needs the emulate extra (numba, tinygrad)")

KINDS = ("buffer_wbl2", "s_waitcnt", "buffer_inv")


@pytest.fixture(scope="module")
def needed(k1_cache):
    """Settings of the cache, and K1's bucket-1 mutants whose fence is not idle, by kind."""
    settings = settings_at(k1_cache)
    hsaco = resolve(get("k1"), Spec(8, 4, 1024, 1), settings=settings).hsaco
    listing = disassemble(hsaco, find_objdump(settings))
    code = parse_listing(listing)
    idle = {code[i].address for i in idle_fences(code)}
    mutants = [m for m in fence_mutants(hsaco, listing) if m.address not in idle]
    return settings, {kind: [m for m in mutants if m.instruction.startswith(kind)] for kind in KINDS}


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_a_needed_fence_of_k1_dropped_is_a_stale_read_in_weak_memory(needed, kind):
    settings, by_kind = needed
    tried = []
    for mutant in reversed(by_kind[kind]):
        rows = {row.option: row for row in k1_weak_rows(mutant, settings)}
        tried.append(rows)
        if all(row.caught for name, row in rows.items() if name != "one-xcd"):
            break
    else:
        pytest.fail(f"no {kind} mutant of K1 read stale: {tried}")
    if kind == "buffer_wbl2":  # one XCD, one L2: nothing to write back
        assert not rows["one-xcd"].caught, rows["one-xcd"]
