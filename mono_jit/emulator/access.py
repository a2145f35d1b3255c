"""What a memory instruction reaches, decoded once for the families that run it (`memory.py`,
`lds.py`) and the clock's recorder (`clock/trace.py`): a vector access's width and direction, a
scalar load's dwords and address, an LDS access's shape and a lane's LDS address."""

from __future__ import annotations

import numpy as np

from . import ops as O
from .decode import F_BASE, F_OFFSET, F_SOFF
from .jit_cache import njit
from .state import M32


@njit(cache=True)
def vector_shape(op, klass):
    """(bytes an element, elements (dwords) a lane, sign-extended, stores, atomic) of a MUBUF or
    global operation of counter class `klass`; a plain dword load is (4, 1, False, False, False)."""
    size, dwords, signed, storing, atomic = 4, 1, False, False, False
    if op == O.OP_BUFFER_LOAD_DWORDX2 or op == O.OP_GLOBAL_LOAD_DWORDX2:
        dwords = 2
    elif op == O.OP_BUFFER_LOAD_DWORDX3 or op == O.OP_GLOBAL_LOAD_DWORDX3:
        dwords = 3
    elif op == O.OP_BUFFER_LOAD_DWORDX4 or op == O.OP_GLOBAL_LOAD_DWORDX4:
        dwords = 4
    elif op == O.OP_BUFFER_LOAD_SBYTE or op == O.OP_GLOBAL_LOAD_SBYTE:
        size, signed = 1, True
    elif op == O.OP_BUFFER_LOAD_UBYTE or op == O.OP_GLOBAL_LOAD_UBYTE:
        size = 1
    elif op == O.OP_BUFFER_LOAD_USHORT or op == O.OP_GLOBAL_LOAD_USHORT:
        size = 2
    elif op == O.OP_BUFFER_LOAD_SSHORT or op == O.OP_GLOBAL_LOAD_SSHORT:
        size, signed = 2, True
    elif op == O.OP_BUFFER_STORE_BYTE or op == O.OP_GLOBAL_STORE_BYTE:
        size, storing = 1, True
    elif op == O.OP_BUFFER_STORE_SHORT or op == O.OP_GLOBAL_STORE_SHORT:
        size, storing = 2, True
    elif op == O.OP_BUFFER_STORE_DWORD or op == O.OP_GLOBAL_STORE_DWORD:
        storing = True
    elif op == O.OP_BUFFER_STORE_DWORDX2 or op == O.OP_GLOBAL_STORE_DWORDX2:
        storing, dwords = True, 2
    elif op == O.OP_BUFFER_STORE_DWORDX3 or op == O.OP_GLOBAL_STORE_DWORDX3:
        storing, dwords = True, 3
    elif op == O.OP_BUFFER_STORE_DWORDX4 or op == O.OP_GLOBAL_STORE_DWORDX4:
        storing, dwords = True, 4
    elif klass == O.ATOMIC:
        atomic = True
    return size, dwords, signed, storing, atomic


@njit(cache=True)
def scalar_dwords(op):
    """The dwords an `s_load_dword*` reads."""
    if op == O.OP_S_LOAD_DWORDX2:
        return 2
    if op == O.OP_S_LOAD_DWORDX4:
        return 4
    if op == O.OP_S_LOAD_DWORDX8:
        return 8
    if op == O.OP_S_LOAD_DWORDX16:
        return 16
    return 1


@njit(cache=True)
def scalar_address(P, i, w, S):
    """The byte address an `s_load_dword*` reads: its 48-bit base pair, offset and SGPR offset,
    the two low bits ignored (scalar memory reads dwords)."""
    b = P[i, F_BASE]
    address = (np.int64(S[w, b]) | (np.int64(S[w, b + 1]) & 0xFFFF) << 32) + P[i, F_OFFSET]
    if P[i, F_SOFF] >= 0:
        address += np.int64(S[w, P[i, F_SOFF]])
    return address & ~np.int64(3)


@njit(cache=True)
def ds_shape(op):
    """(dwords an address, two addresses, the offsets' unit in bytes) of a `ds_read*` /
    `ds_write*`: the two-address forms scale their 8-bit offsets by the unit."""
    n, two, stride = 1, False, 0
    if op == O.OP_DS_READ_B64 or op == O.OP_DS_WRITE_B64:
        n = 2
    elif op == O.OP_DS_READ_B96 or op == O.OP_DS_WRITE_B96:
        n = 3
    elif op == O.OP_DS_READ_B128 or op == O.OP_DS_WRITE_B128:
        n = 4
    elif op == O.OP_DS_READ2_B32 or op == O.OP_DS_WRITE2_B32:
        two, stride = True, 4
    elif op == O.OP_DS_READ2_B64 or op == O.OP_DS_WRITE2_B64:
        n, two, stride = 2, True, 8
    elif op == O.OP_DS_READ2ST64_B32 or op == O.OP_DS_WRITE2ST64_B32:
        two, stride = True, 256
    elif op == O.OP_DS_READ2ST64_B64:
        n, two, stride = 2, True, 512
    return n, two, stride


@njit(cache=True)
def ds_address(a, off0, off1, half, two, stride):
    """The LDS byte address of one of a lane's (one or two) addresses from its VGPR value `a`."""
    if two:
        return (a + (off0 if half == 0 else off1) * stride) & M32
    return (a + (off0 | off1 << 8)) & M32
