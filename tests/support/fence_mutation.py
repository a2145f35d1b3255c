"""The static half of the fence-mutation harness: each mutant of a built code object
(mono_jit/hsaco/fence_mutants.py) run through the site-by-site check, as the table a kernel's
gate asserts on: (site, caught, by which rule, why not if the fence is idle for its wave)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from mono_jit.hsaco.fence_mutants import fence_mutants, idle_fences
from mono_jit.hsaco.handoffs import check_code, flow_of
from mono_jit.hsaco.isa import disassemble
from mono_jit.hsaco.listing import parse_listing


class MutantRow(NamedTuple):
    site: str
    rules: tuple[str, ...]
    idle: str | None

    @property
    def caught(self) -> bool:
        return bool(self.rules)


def mutant_table(hsaco: bytes, listing: str, objdump: Path) -> list[MutantRow]:
    """One row per mutant. The mutant's bytes are disassembled around its site (the patch must
    decode as s_nops there) and checked with the original's control flow: its first s_nop takes
    the fence's place (the others are no branch's target and do nothing), a fence being neither
    a branch nor a poll."""
    code = parse_listing(listing)
    flow = flow_of(code)
    targets = {ins.target for ins in code}
    where = {ins.address: i for i, ins in enumerate(code)}
    idle = {code[i].address: why for i, why in idle_fences(code).items()}
    rows = []
    for mutant in fence_mutants(hsaco, listing):
        i = where[mutant.address]
        stop = mutant.address + 4 * len(code[i].words)
        patched = parse_listing(disassemble(mutant.hsaco, objdump, window=(mutant.address, stop)))
        assert [ins.text for ins in patched] == ["s_nop 0"] * len(code[i].words), patched
        assert not targets & {ins.address for ins in patched[1:]}
        findings = check_code(code[:i] + patched[:1] + code[i + 1:], flow)
        rows.append(MutantRow(mutant.site, tuple(sorted({f.rule for f in findings})), idle.get(mutant.address)))
    return rows


def assert_every_needed_fence_is_caught(hsaco: bytes, listing: str, objdump: Path) -> list[MutantRow]:
    """Each mutant is reported unless its fence is idle for its wave (and then it is not): the
    check sees the mechanism, not a count. At least one write-back, one wait and one invalidate
    mutant must be caught."""
    rows = mutant_table(hsaco, listing, objdump)
    table = "\n".join(f"{r.site:60} {'caught by ' + '+'.join(r.rules) if r.caught else 'not caught'}"
                      f"{'  (idle: ' + r.idle + ')' if r.idle else ''}" for r in rows)
    assert all(r.caught != bool(r.idle) for r in rows), table
    for kind in ("buffer_wbl2", "s_waitcnt", "buffer_inv"):
        assert any(r.caught and kind in r.site for r in rows), f"no {kind} mutant caught:\n{table}"
    return rows
