"""A code object's `.text` as the interpreter's instruction table.

The decoder is tinygrad's (`tinygrad.renderer.amd.decode_inst`, arch "cdna"), generated from
AMD's machine-readable CDNA4 specification, so that the instructions are read by something other
than the LLVM that wrote them; `tests/emulator/test_decode.py` cross-checks it against
`llvm-objdump` for every instruction of every built template. Each instruction becomes one row of
int64 fields (`F_*`); anything the interpreter does not model (an operation it has no semantics
for, a modifier it ignores) is refused here, by name and address, so that nothing runs silently
wrong.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from . import ops
from .errors import EmulatorError

# Row fields of the instruction table.
(F_OP, F_CLASS, F_DST, F_SRC0, F_SRC1, F_SRC2, F_LIT, F_NEG, F_ABS, F_OPSEL, F_OPSEL_HI, F_NEG_HI, F_SDST,
 F_OFFSET, F_OFFSET1, F_SEL0, F_SEL1, F_SEXT, F_FLAGS, F_NEXT, F_TARGET, F_FORMAT, F_SCALE0, F_SCALE1,
 F_ADDR, F_SOFF, F_BASE) = range(27)
FIELDS = 27

# F_FLAGS bits.
FLAG_OFFEN, FLAG_SC0, FLAG_SC1, FLAG_NT, FLAG_SDWA, FLAG_SADDR_OFF, FLAG_DPP, FLAG_SVE = (1 << i for i in range(8))

VGPR0 = 256  # operand codes from 256 name VGPRs
LITERAL = 255  # the operand code of the instruction's 32-bit literal
SEL_DWORD = 6  # SDWA select: BYTE_0..3 = 0..3, WORD_0/1 = 4/5, DWORD = 6
NULL_SADDR = 0x7F  # global_*'s saddr field when the address is a 64-bit VGPR pair ("off")


class UnsupportedCode(EmulatorError):
    """A code object holds instructions (or modifiers) the emulator has no semantics for."""


@dataclass(frozen=True)
class Program:
    """A decoded `.text`: the table, the byte address of each row, and the entry row."""

    table: np.ndarray  # int64 [instructions, FIELDS]
    addresses: tuple[int, ...]
    entry: int
    names: tuple[str, ...]  # tinygrad's operation name of each row, for reports

    def row_at(self, address: int) -> int:
        return self.addresses.index(address)


def _fields(inst) -> dict[str, int]:
    """Every raw field of a tinygrad instruction by name."""
    return {name: (inst._raw >> field.lo) & field.mask for name, field in inst._fields}


def _sext(value: int, bits: int) -> int:
    return value - (1 << bits) if value >> (bits - 1) & 1 else value


class _Decoder:
    """Turns tinygrad instructions into table rows, collecting what it cannot model."""

    def __init__(self) -> None:
        self.refused: Counter[str] = Counter()
        self.first_refused: dict[str, int] = {}

    def refuse(self, what: str, address: int) -> None:
        self.refused[what] += 1
        self.first_refused.setdefault(what, address)

    def row(self, inst, address: int) -> tuple[np.ndarray, int]:
        """The row of one instruction, and its branch displacement in bytes (0 if none)."""
        kind = type(inst).__name__.removesuffix("_LIT")
        name = inst.op.name
        f = _fields(inst)
        row = np.zeros(FIELDS, np.int64)
        row[F_SEL0] = row[F_SEL1] = SEL_DWORD
        row[F_ADDR] = address
        row[F_SOFF] = -1
        op = ops.op_id(name)
        if op < 0:
            self.refuse(f"operation {name}", address)
            return row, 0
        base = ops.NAMES[op]
        row[F_OP], row[F_CLASS] = op, ops.CLASS_OF[op]
        row[F_LIT] = f.get("literal", 0)
        floating = base in ops.FLOAT_OPS
        branch = 0
        if kind in ("SOP1", "SOP2", "SOPC", "SOPK"):
            row[F_DST] = f.get("sdst", 0)
            row[F_SRC0] = f.get("ssrc0", 0)
            row[F_SRC1] = f.get("ssrc1", 0)
            if kind == "SOPK":
                row[F_OFFSET] = f["simm16"]
        elif kind == "SOPP":
            row[F_OFFSET] = f["simm16"]
            if base.startswith(("S_BRANCH", "S_CBRANCH")):
                branch = 4 + 4 * _sext(f["simm16"], 16)
        elif kind == "SMEM":
            if f["nv"] or (f["imm"] and f["soffset_en"]):
                self.refuse(f"{base} with nv or an immediate and soffset", address)
            row[F_DST], row[F_BASE] = f["sdata"], 2 * f["sbase"]
            row[F_OFFSET] = _sext(f["offset"], 21) if f["imm"] else 0
            row[F_SOFF] = f["soffset"] if f["soffset_en"] or not f["imm"] else -1
            if not f["imm"]:  # the offset is an SGPR named by the offset field
                row[F_SOFF] = f["offset"]
        elif kind in ("VOP1", "VOP2", "VOPC"):
            row[F_DST] = f.get("vdst", 106)  # VOPC writes VCC
            row[F_SRC0] = f["src0"]
            row[F_SRC1] = VGPR0 + f["vsrc1"] if "vsrc1" in f else 0
            if base in ("V_ADDC_CO_U32", "V_SUBB_CO_U32", "V_SUBBREV_CO_U32", "V_CNDMASK_B32"):
                row[F_SRC2] = 106  # VCC: the carry-in or the select mask
            if base in ("V_ADD_CO_U32", "V_ADDC_CO_U32", "V_SUB_CO_U32", "V_SUBREV_CO_U32", "V_SUBB_CO_U32",
                        "V_SUBBREV_CO_U32"):
                row[F_SDST] = 106  # VCC: the carry-out
            if base == "V_FMAC_F32":
                row[F_SRC2] = VGPR0 + row[F_DST]
            if base in ("V_FMAMK_F32", "V_FMAAK_F32"):
                row[F_SRC2] = LITERAL  # the 32-bit constant K, read as a third source
        elif kind == "VOP1_DPP16":
            # DPP (gfx9): the VGPR source read from another lane (dpp_ctrl), lanes of rows / banks
            # outside row_mask / bank_mask not written, bound_ctrl: 0 where the source lane is
            # invalid (else the destination is kept). Modelled for v_mov_b32 only.
            if base != "V_MOV_B32" or f["src0_neg"] or f["src0_abs"]:
                self.refuse(f"{base} with DPP (v_mov_b32 without modifiers only)", address)
            row[F_FLAGS] |= FLAG_DPP
            row[F_DST], row[F_SRC0] = f["vdst"], VGPR0 + f["vsrc0"]
            row[F_OFFSET], row[F_OFFSET1] = f["dpp"], f["row_mask"] | f["bank_mask"] << 4 | f["bc"] << 8
        elif kind in ("VOP1_SDWA", "VOP2_SDWA", "VOPC_SDWA_SDST"):
            row[F_FLAGS] |= FLAG_SDWA
            if f.get("omod") or f.get("clmp"):
                self.refuse(f"{base} SDWA with omod or clamp", address)
            row[F_SRC0] = f["vsrc0"] + (0 if f["s0"] else VGPR0)
            if "vsrc1" in f:
                row[F_SRC1] = f["vsrc1"] + (0 if f.get("s1", 0) else VGPR0)
            row[F_SEL0], row[F_SEL1] = f["src0_sel"], f["src1_sel"]
            row[F_SEXT] = f["src0_sext"] | f["src1_sext"] << 1
            row[F_NEG] = f["src0_neg"] | f["src1_neg"] << 1
            row[F_ABS] = f["src0_abs"] | f["src1_abs"] << 1
            if kind == "VOPC_SDWA_SDST":
                row[F_DST] = f["sdst"] if f["sd"] else 106
            else:
                row[F_DST] = f["vdst"]
                if f["dst_sel"] != SEL_DWORD:
                    self.refuse(f"{base} SDWA with a dst_sel other than DWORD", address)
            if base == "V_CNDMASK_B32":
                row[F_SRC2] = 106
        elif kind in ("VOP3", "VOP3_SDST", "VOP3SD"):
            row[F_DST] = f["vdst"]
            row[F_SRC0], row[F_SRC1], row[F_SRC2] = f["src0"], f["src1"], f["src2"]
            row[F_NEG] = f.get("neg", 0)
            row[F_ABS] = f.get("abs", 0)
            row[F_OPSEL] = f.get("opsel", 0)
            if kind == "VOP3SD":
                row[F_SDST] = f["sdst"]
            if base in ("V_BITOP3_B32", "V_BITOP3_B16"):  # its truth table sits in the OMOD, ABS and NEG fields
                row[F_FORMAT] = f["omod"] << 6 | f["abs"] << 3 | f["neg"]
                row[F_NEG] = row[F_ABS] = 0
            elif f.get("omod") or f.get("clmp"):
                self.refuse(f"{base} with omod or clamp", address)
            if base == "V_CVT_PK_FP8_F32" and row[F_OPSEL] & 0b0111:
                self.refuse(f"{base} with a source op_sel", address)
            if base == "V_CVT_PK_F32_FP8" and row[F_OPSEL]:
                self.refuse(f"{base} with op_sel in VOP3", address)
        elif kind == "VOP3P":
            row[F_DST] = f["vdst"]
            row[F_SRC0], row[F_SRC1], row[F_SRC2] = f["src0"], f["src1"], f["src2"]
            row[F_NEG], row[F_NEG_HI] = f["neg"], f["neg_hi"]
            row[F_OPSEL] = f["opsel"]
            row[F_OPSEL_HI] = f["opsel_hi"] | f["opsel_hi2"] << 2
            if f["clmp"]:
                self.refuse(f"{base} with clamp", address)
            floating = True
        elif kind == "VOP3P_MFMA":
            row[F_DST] = f["vdst"]
            row[F_SRC0], row[F_SRC1], row[F_SRC2] = f["src0"], f["src1"], f["src2"]
            if f["cbsz"] or f["abid"] or f["blgp"] or f["acc_cd"] or f["acc"] or f["neg"] or f["neg_hi"] or f["clmp"]:
                self.refuse(f"{base} with cbsz / abid / blgp broadcasts, AGPRs, negation or clamp", address)
            if row[F_SRC0] < VGPR0 or row[F_SRC1] < VGPR0 or not (row[F_SRC2] >= VGPR0 or row[F_SRC2] == 128):
                self.refuse(f"{base} with scalar A / B or a C other than VGPRs or 0", address)
        elif kind == "VOP3PX2":
            row[F_DST] = f["vdst"]
            row[F_SRC0], row[F_SRC1], row[F_SRC2] = f["src0"], f["src1"], f["src2"]
            row[F_FORMAT] = f["cbsz"] | f["blgp"] << 4
            row[F_SCALE0], row[F_SCALE1] = f["scale_src0"], f["scale_src1"]
            row[F_OPSEL] = f["opsel"] | f["opsel_hi"] << 4
            if f["cbsz"] not in (0, 4) or f["blgp"] not in (0, 4):
                self.refuse(f"{base} with formats cbsz {f['cbsz']} blgp {f['blgp']} (fp8 and fp4 only)", address)
            if f["acc_cd"] or f["acc"] or f["neg"] or f["neg_hi"]:
                self.refuse(f"{base} with AGPR operands or negation", address)
            if f["opsel"] or f["opsel_hi"]:
                self.refuse(f"{base} with a scale byte other than byte 0", address)
            if f["scale_src0"] < VGPR0 or f["scale_src1"] < VGPR0:
                self.refuse(f"{base} with a scalar scale operand", address)
        elif kind == "DS":
            if f["gds"] or f["acc"]:
                self.refuse(f"{base} with gds or acc", address)
            row[F_DST], row[F_SRC0] = f["vdst"], f["addr"]
            row[F_SRC1], row[F_SRC2] = f["data0"], f["data1"]
            row[F_OFFSET], row[F_OFFSET1] = f["offset0"], f["offset1"]
        elif kind == "MUBUF":
            if f["idxen"] or f["lds"] or f["acc"]:
                self.refuse(f"{base} with idxen, lds or acc", address)
            row[F_DST], row[F_SRC0], row[F_BASE] = f["vdata"], f["vaddr"], 4 * f["srsrc"]
            row[F_SOFF], row[F_OFFSET] = f["soffset"], f["offset"]
            row[F_FLAGS] |= (FLAG_OFFEN * f["offen"] | FLAG_SC0 * f["sc0"] | FLAG_SC1 * f["sc1"] | FLAG_NT * f["nt"])
        elif kind == "GLOBAL":
            if f["seg"] != 2 or f["acc"] or f["sve"]:
                self.refuse(f"{base} outside the global segment, or with acc / sve", address)
            row[F_DST], row[F_SRC0], row[F_SRC1] = f["vdst"], f["addr"], f["data"]
            row[F_BASE], row[F_OFFSET] = f["saddr"], _sext(f["offset"], 13)
            row[F_FLAGS] |= (FLAG_SC0 * f["sc0"] | FLAG_SC1 * f["sc1"] | FLAG_NT * f["nt"]
                             | FLAG_SADDR_OFF * (f["saddr"] == NULL_SADDR))
        elif kind == "SCRATCH":
            # Architected flat scratch (gfx940+): the lane's private address is SADDR (unless
            # "off") + VADDR (when SVE) + the signed offset, in that lane's own private segment.
            if f["seg"] != 1 or f["acc"]:
                self.refuse(f"{base} outside the scratch segment, or with acc", address)
            row[F_DST], row[F_SRC0], row[F_SRC1] = f["vdst"], f["addr"], f["data"]
            row[F_BASE], row[F_OFFSET] = f["saddr"], _sext(f["offset"], 13)
            row[F_FLAGS] |= FLAG_SADDR_OFF * (f["saddr"] == NULL_SADDR) | FLAG_SVE * f["sve"]
        else:
            self.refuse(f"encoding {kind} ({base})", address)
        # v_cndmask_b32's VOP3 neg / abs act on the sources' sign bits as on floats (LLVM folds
        # fneg / fabs of a select into them: SIInstrInfo, VOP2Instructions.td's V_CNDMASK_B32_e64
        # takes FP source modifiers)
        if base == "V_CNDMASK_B32":
            floating = True
        if not floating and (row[F_NEG] or row[F_ABS]) and kind != "VOP3SD":
            self.refuse(f"{base} with neg / abs on an integer operation", address)
        return row, branch


def decode(text: bytes, text_address: int, entry_address: int) -> Program:
    """Decode `.text` (loaded at `text_address`) into a Program; raise UnsupportedCode listing
    every operation or modifier the interpreter cannot run, each with its count and first address."""
    from tinygrad.renderer.amd import decode_inst

    decoder = _Decoder()
    rows, addresses, names, branches = [], [], [], []
    offset = 0
    while offset < len(text):
        address = text_address + offset
        inst = decode_inst(text[offset:offset + 16], "cdna")
        row, branch = decoder.row(inst, address)
        rows.append(row)
        addresses.append(address)
        names.append(inst.op.name)
        branches.append(branch)
        offset += inst.size()
    if decoder.refused:
        listing = ", ".join(f"{what} x{count} (first at {decoder.first_refused[what]:#x})"
                            for what, count in decoder.refused.most_common())
        raise UnsupportedCode(f"the emulator has no semantics for: {listing}")
    table = np.stack(rows) if rows else np.zeros((0, FIELDS), np.int64)
    row_of = {address: index for index, address in enumerate(addresses)}
    table[:, F_NEXT] = np.arange(1, len(rows) + 1)
    for index, branch in enumerate(branches):
        if branch:
            target = addresses[index] + branch
            if target not in row_of:
                raise UnsupportedCode(f"branch at {addresses[index]:#x} to {target:#x}, not an instruction")
            table[index, F_TARGET] = row_of[target]
    if entry_address not in row_of:
        raise UnsupportedCode(f"entry {entry_address:#x} is not an instruction of .text")
    return Program(table, tuple(addresses), row_of[entry_address], tuple(names))
