"""Small FlyDSL helpers the kernel modules share (imports FlyDSL; only kernel modules import it).

Every tensor argument is a 1-D buffer indexed by flat element offsets: the kernarg ABI stays a
pointer plus an i32 length per tensor, which the runner packs without knowing shapes.
"""


import operator

import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl._mlir.dialects import arith, llvm
from flydsl.compiler.ast_rewriter import ASTRewriter
from flydsl.expr import range_constexpr

from .geometry import WAVE

_LOG2_WAVE = 6


def dsl(fn):
    """Give a helper the kernel's control-flow lowering: its `if` / `for` / `while` on DSL
    values become scf ops, as in a @flyc.kernel body (FlyDSL rewrites only the kernel itself)."""
    return ASTRewriter.transform(fn)


def flat_view(tensor, vector: int = 1, size_bytes: int | None = None):
    """A buffer-resource view of a 1-D tensor in chunks of `vector` elements.

    The resource's size bounds every access: `size_bytes` when given (a buffer whose size the
    template fixes, e.g. a scratch area sized by its layout), else the tensor's own byte length
    (its i32 length kernarg times the element size; FlyDSL's make_buffer_tensor(max_size=False)).
    A raw-buffer dword at or past the size reads 0 and a store there is dropped, per dword of a
    wide access (CDNA3 / CDNA4 ISA, "Range Checking"; ck_tile's
    amd_buffer_load_invalid_element_return_zero and Triton AMD's BufferOpsEmitter rely on it,
    masking lanes by pushing their offsets out of range). Tensors above 2 GiB do not fit the
    32-bit size: none is passed this way.
    """
    if size_bytes is None:
        resource = fx.rocdl.make_buffer_tensor(tensor, max_size=False)
    else:
        resource = fx.rocdl.make_buffer_tensor(tensor, num_records_bytes=size_bytes)
    return fx.logical_divide(resource, fx.make_layout(vector, 1))


def copy_atom(bits: int, elem_bits: int):
    return fx.make_copy_atom(fx.rocdl.BufferCopy(bits), elem_bits)


def load(view, index, dtype, width: int = 1):
    """Load chunk `index` of a flat view: a vector of `width` elements (0 past the buffer's end)."""
    reg = fx.make_rmem_tensor(width, dtype)
    fx.copy(copy_atom(dtype.width * width, dtype.width), fx.slice(view, (None, index)), reg)
    return fx.memref_load_vec(reg)


def load_scalar(view, index, dtype):
    return load(view, index, dtype)[0]


def unsigned_byte(byte):
    """A loaded byte zero-extended to i32 (buffer_load_ubyte / global_load_ubyte).

    Not `.to(fx.Int32)`: FlyDSL extends a loaded i8 by the target type's signedness (Int32 is
    signed; flydsl/expr/numeric.py, Integer.__init__), so that sign-extends (buffer_load_sbyte)
    and a code of 128 or more came out negative: a negative scale in S2's 2^(code - 127) (issue
    23). The scaled MFMA reads one byte of its scale operands, so there it did no harm, but every
    code takes this one path and none is signed anywhere (tests/support/byte_loads.py gates the ISA)."""
    return fx.Int32(arith.extui(ir.IntegerType.get_signless(32), fx.Uint8(byte).ir_value()))


def load_code(view, index):
    """Byte `index` of a flat byte view as an unsigned code: an i32 from 0 to 255 (0 past the
    buffer's end), for every byte that is an E8M0 / UE8M0 scale code."""
    return unsigned_byte(load_scalar(view, index, fx.Uint8))


def pointer_code(pointer, index):
    """Byte `index` at a byte pointer as an unsigned code (load_code's form for a plain global
    load, as pointer_load is load_scalar's)."""
    return unsigned_byte(pointer_load(pointer, index))


def store_scalar(view, index, value, dtype) -> None:
    store(view, index, fx.Vector.filled(1, value, dtype), dtype, 1)


def realtime():
    """s_memrealtime: the device's constant 100 MHz clock (not the shader clock), an i64 every lane
    reads alike. Read through LLVM's intrinsic, which keeps each call (never hoisted or merged) and
    waits for its result (`s_waitcnt lgkmcnt(0)`), as vLLM 0.33's in-tree mono (common/ops.py
    memrealtime, "the 100 MHz device clock") and Triton's AMD backend (hip/utils.py memrealtime)
    read it on gfx9."""
    i64 = ir.IntegerType.get_signless(64)
    return fx.Int64(llvm.call_intrinsic(i64, "llvm.amdgcn.s.memrealtime", [], [], []))


def butterfly(value, combine, bits):
    """Combine each lane's value with those of the lanes whose index differs only in `bits`
    (lane-index bit positions); every lane of such a group gets the group's result."""
    for bit in bits:
        value = combine(value, value.shuffle_xor(1 << bit, WAVE))
    return value


def wave_sum(value):
    """Butterfly sum over the 64 lanes of a wave; every lane gets the total."""
    return butterfly(value, operator.add, reversed(range(_LOG2_WAVE)))


def wave_argmax(value, index):
    """Butterfly (max value, lowest index on ties) over a wave; every lane gets the winner."""
    for step in range_constexpr(_LOG2_WAVE):
        offset = WAVE >> (step + 1)
        peer_value = value.shuffle_xor(offset, WAVE)
        peer_index = index.shuffle_xor(offset, WAVE)
        take = better(peer_value, peer_index, value, index)
        value = take.select(peer_value, value)
        index = take.select(peer_index, index)
    return value, index


def better(value, index, best_value, best_index):
    """The total order of a top-k: larger value first, then the lower index."""
    return (value > best_value) | ((value == best_value) & (index < best_index))


def inclusive_count(flag, lane):
    """Inclusive prefix sum of an i32 0/1 flag over the lanes of a wave (Hillis-Steele)."""
    total = flag
    for step in range_constexpr(_LOG2_WAVE):
        offset = 1 << step
        peer = fx.shuffle_up(total, offset, WAVE)
        total = total + (lane >= offset).select(peer, 0)
    return total


def last_lane(value):
    """The value held by lane 63 (the wave total of an inclusive scan)."""
    return fx.shuffle_idx(value, WAVE - 1, WAVE)


def store(view, index, vec, dtype, width: int) -> None:
    """Store a vector of `width` elements as chunk `index` of a flat view."""
    reg = fx.make_rmem_tensor(width, dtype)
    fx.memref_store_vec(vec, reg)
    fx.copy(copy_atom(dtype.width * width, dtype.width), reg, fx.slice(view, (None, index)))


def f32_bits(value):
    """The IEEE bits of an f32 scalar as an i32."""
    return fx.Vector.filled(1, value, fx.Float32).bitcast(fx.Int32)[0]


def f32_from_bits(bits):
    return fx.Vector.filled(1, bits, fx.Int32).bitcast(fx.Float32)[0]


def load_global(tensor, index, count: int = 1):
    """`count` elements of a tensor argument from element `index`, through a plain global
    pointer (no buffer resource, no bounds check).

    For small, rarely read arguments: a pointer holds 2 SGPRs where a buffer resource holds 4,
    which keeps kernels with many arguments clear of SGPR spills.
    """
    return fx.generic_load(fx.get_iter(tensor) + index, count=None if count == 1 else count)


def typed_view(pointer, dtype, count, vector: int = 1):
    """A buffer-resource view of `count` elements of `dtype` from `pointer` (an address from a
    table, or a region of a work buffer), in chunks of `vector`: bounded by exactly those
    elements, as flat_view bounds a whole tensor. `pointer`'s alignment must be a multiple of
    the element size (a region of an f32 buffer serves f32, i32, bf16 and byte views)."""
    view = fx.make_view(fx.recast_iter(dtype, pointer), fx.make_layout(count, 1))
    resource = fx.rocdl.make_buffer_tensor(view, num_records_bytes=count * dtype.width // 8)
    return fx.logical_divide(resource, fx.make_layout(vector, 1))


def table_entry(table, index):
    """Entry `index` of an int64 table as a wave-uniform value (SGPRs), read where it is used.

    A volatile load, which the compiler may not hoist to the kernel's entry (an invariant load it
    would, and keep the value in SGPRs across every stage, which is what the table is there to
    avoid), taken from the wave's first lane (v_readfirstlane_b32 of each half). A buffer
    resource must be uniform: built on the per-lane value of the load, every access through it
    was a waterfall loop (v_readfirstlane_b32 of the descriptor, s_and_saveexec_b64, a
    s_cbranch_execnz back-edge) around each weight and scale load of the GEMVs
    (tests/templates/k2/test_k2_gates.py gates the ISA)."""
    entry = fx.Int64(fx.generic_load(fx.get_iter(table) + index, volatile=True))
    return fx.Int64(fx.rocdl.readfirstlane(ir.IntegerType.get_signless(64), entry.ir_value()))


def table_pointer(table, index, like):
    """Entry `index` of an int64 address table as a pointer of `like`'s type (a tensor argument
    of the same element type and alignment): for arguments read in one stage only, whose
    pointers would otherwise hold SGPRs across the whole persistent kernel."""
    return fx.inttoptr(fx.get_iter(like).type, table_entry(table, index))


def word_pointer(pointer):
    """A global byte pointer as a pointer to 4-byte-aligned i32 words (the address must be a
    multiple of 4), so a load of 4 words from it is one global_load_dwordx4."""
    return fx.recast_iter(fx.Pointer[fx.Int32, fx.AddressSpace.Global].ir_type, pointer)


def pointer_load(pointer, index, count: int = 1):
    """`count` elements at `pointer` + index through a plain global load (load_global's form
    for a pointer that is not a tensor argument)."""
    return fx.generic_load(pointer + index, count=None if count == 1 else count)


def fresh(value):
    """A per-lane i32 through an opaque move: the lane arithmetic built on it is computed where
    it is used. Without it the compiler CSEs a stage's lane masks (lane == 0, tid < n) with
    another stage's and holds them in SGPRs across the whole persistent kernel, which spilled
    SGPRs in K2 (vLLM 0.33's in-tree mono does the same for the same reason: common/ops.py)."""
    i32 = ir.IntegerType.get_signless(32)
    return fx.Int32(llvm.inline_asm(i32, [fx.Int32(value).ir_value()], "v_mov_b32 $0, $1", "=v,v",
                                    has_side_effects=True))


def fresh_scalar(value):
    """A wave-uniform i32 through an opaque scalar move (see fresh): a stage's loop guards on it
    (cta < tasks) are its own, not one mask held from the first stage to the last."""
    i32 = ir.IntegerType.get_signless(32)
    return fx.Int32(llvm.inline_asm(i32, [fx.Int32(value).ir_value()], "s_mov_b32 $0, $1", "=s,s",
                                    has_side_effects=True))


def fresh_pointer(pointer):
    """`pointer` through an opaque scalar move: buffer resources built on it are built where
    they are used, not shared by every stage and held in SGPRs across the kernel (see fresh)."""
    i64 = ir.IntegerType.get_signless(64)
    address = fx.Int64(fx.ptrtoint(pointer))
    moved = llvm.inline_asm(i64, [address.ir_value()], "s_mov_b64 $0, $1", "=s,s", has_side_effects=True)
    return fx.inttoptr(pointer.type, moved)
