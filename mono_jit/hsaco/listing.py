"""One kernel's instructions and control-flow graph, read from an llvm-objdump listing, for
the static checks that walk every path of a wave through the code (hsaco/handoffs.py,
hsaco/kernarg_loads.py)."""

from __future__ import annotations

import re
from typing import NamedTuple

from ..errors import InvalidCodeObject

_SYMBOL = re.compile(r"^([0-9a-f]+) <([\w.$]+)>:")
# Instructions after which a wave does not fall through, and those that jump somewhere the
# listing cannot tell (the checks refuse a CFG they cannot see).
_ENDS = ("s_endpgm",)
_INDIRECT = ("s_setpc_b64", "s_swappc_b64", "s_rfe_b64", "s_cbranch_g_fork", "s_cbranch_join")


class Instruction(NamedTuple):
    """An instruction as the listing shows it: address, mnemonic, operand text (cache bits
    included), its 32-bit words and, for a branch, the target address."""

    address: int
    mnemonic: str
    operands: str
    words: tuple[int, ...]
    target: int | None

    @property
    def text(self) -> str:
        return f"{self.mnemonic} {self.operands}".strip()

    def operand_list(self) -> list[str]:
        """The comma-separated operands, without the trailing modifiers (offset:, sc0, ...)."""
        head = self.operands.split(" ")
        parts = " ".join(t for t in head if ":" not in t or t.startswith(("s[", "v[", "a[", "ttmp["))).split(",")
        return [p.strip().split(" ")[0] for p in parts if p.strip()]

    def bits(self) -> set[str]:
        """The cache-policy bits written on the instruction (sc0, sc1, nt)."""
        return {t for t in re.split(r"[\s,]+", self.operands) if t in ("sc0", "sc1", "nt")}


def _branch_target(mnemonic: str, address: int, words: tuple[int, ...]) -> int | None:
    """A SOPP branch's target: the next instruction plus 4 times its signed 16-bit immediate."""
    if mnemonic != "s_branch" and not mnemonic.startswith("s_cbranch"):
        return None
    offset = words[0] & 0xFFFF
    return address + 4 + 4 * (offset - 0x10000 if offset & 0x8000 else offset)


def parse_listing(listing: str) -> list[Instruction]:
    """The instructions of a one-kernel `llvm-objdump -d` listing, in address order."""
    seen: str | None = None
    out: list[Instruction] = []
    for line in listing.splitlines():
        symbol = _SYMBOL.match(line)
        if symbol:
            if seen is not None:
                raise InvalidCodeObject(f"more than one symbol in the listing ({seen}, {symbol.group(2)})")
            seen = symbol.group(2)
            continue
        if not line.startswith("\t") or "//" not in line:
            continue
        text, _, comment = line.partition("//")
        where, _, encoding = comment.partition(":")
        mnemonic, _, operands = text.strip().partition(" ")
        address = int(where, 16)
        words = tuple(int(w, 16) for w in encoding.split("<")[0].split())
        out.append(Instruction(address, mnemonic, operands.strip(), words, _branch_target(mnemonic, address, words)))
    if not out:
        raise InvalidCodeObject("the listing holds no instruction")
    return out


def _elects_a_lane(code: list[Instruction], i: int, targets: set[int]) -> bool:
    """Whether the `s_cbranch_execz` at `i` ends the compiler's first-lane election on an exec
    known to be non-empty, so its branch is never taken: the fall-through of an execz branch,
    a copy of exec, mbcnt of the copy, `v_cmp_eq 0` and `s_and_saveexec` of that compare (the
    lowest active lane always counts 0), with no branch into the sequence."""
    if i < 6 or code[i].mnemonic != "s_cbranch_execz":
        return False
    guard, copy, low, high, compare, save = code[i - 6:i]
    if any(ins.address in targets for ins in (copy, low, high, compare, save)):
        return False
    pair = copy.operand_list()
    if (guard.mnemonic != "s_cbranch_execz" or copy.mnemonic != "s_mov_b64" or pair[1:] != ["exec"]
            or not pair[0].startswith("s[")):
        return False
    first = int(pair[0][2:].split(":")[0])
    lo, hi, cmp, sv = low.operand_list(), high.operand_list(), compare.operand_list(), save.operand_list()
    return (low.mnemonic == "v_mbcnt_lo_u32_b32" and lo[1:] == [f"s{first}", "0"]
            and high.mnemonic == "v_mbcnt_hi_u32_b32" and hi[1:] == [f"s{first + 1}", lo[0]]
            and compare.mnemonic == "v_cmp_eq_u32_e32" and cmp == ["vcc", "0", hi[0]]
            and save.mnemonic == "s_and_saveexec_b64" and sv[1:] == ["vcc"])


def successors(code: list[Instruction]) -> list[list[int]]:
    """For each instruction, the indices of the instructions a wave can run next (a lane
    election's execz branch, which no wave takes, has only its fall-through)."""
    index = {ins.address: i for i, ins in enumerate(code)}
    targets = {ins.target for ins in code if ins.target is not None}
    out: list[list[int]] = []
    for i, ins in enumerate(code):
        if ins.mnemonic in _INDIRECT:
            raise InvalidCodeObject(f"{ins.address:#x}: {ins.text}: an indirect branch, the control flow is unknown")
        following = [i + 1] if i + 1 < len(code) else []
        if ins.mnemonic in _ENDS:
            out.append([])
        elif ins.mnemonic == "s_branch" or ins.mnemonic.startswith("s_cbranch"):
            if ins.target not in index:
                raise InvalidCodeObject(f"{ins.address:#x}: {ins.text}: no instruction at the branch target")
            taken = [index[ins.target]]  # type: ignore[index]
            if ins.mnemonic == "s_branch":
                out.append(taken)
            else:
                out.append(following if _elects_a_lane(code, i, targets) else taken + following)
        else:
            out.append(following)
    return out


def on_cycles(succ: list[list[int]]) -> set[int]:
    """The instructions that lie on a cycle of the graph (a wave can run them again)."""
    # Tarjan's strongly connected components, iterative: an instruction is on a cycle when its
    # component has more than one member or it branches to itself.
    counter = 0
    number: dict[int, int] = {}
    low: dict[int, int] = {}
    stack: list[int] = []
    on_stack: set[int] = set()
    cyclic: set[int] = set()
    for root in range(len(succ)):
        if root in number:
            continue
        work = [(root, 0)]
        while work:
            node, edge = work.pop()
            if edge == 0:
                number[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            if edge < len(succ[node]):
                work.append((node, edge + 1))
                nxt = succ[node][edge]
                if nxt not in number:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], number[nxt])
                continue
            if low[node] == number[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in succ[node]:
                    cyclic.update(component)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return cyclic
