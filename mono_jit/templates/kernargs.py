"""A launch's kernarg buffer, packed from a cache entry's metadata.

A template's arguments (meta ``arguments``) are 1-D tensors and i32 / i64 scalars. FlyDSL lowers a
1-D tensor with a dynamic extent to two kernel arguments: its pointer (8 bytes,
``global_buffer``) then its extent in elements (4 bytes, ``by_value``): the dynamic-shape i32s
of FlyDSL's layout-dynamic memref (`flydsl/compiler/jit_argument.py`, `_LayoutPlan`: "dynamic-
shape i32's then dynamic-stride i32/i64's"; a contiguous 1-D tensor has no dynamic stride). An
i32 scalar is one 4-byte ``by_value`` argument, an i64 (``fx.Int64``: a raw address or byte count, as
kernels written for another host take them) one 8-byte one. The code object's own argument table (meta
``kernels[i].args``: offset, size, value kind) places each one; the runtime fills any
``hidden_*`` argument itself, so the buffer holds the explicit ones only.

A tensor declared ``unbounded`` (the KV caches: the kernels reach them only through 64-bit
global addresses) may be of any size; its extent slot holds 0, which no load reads.

Everything is checked before a byte is written: argument names, tensor dtypes, contiguity,
extents that fit an i32 (unbounded tensors aside), scalar ranges, and that the code object's table has exactly the
arguments the template declares. A mismatch is a :class:`KernargError` naming the argument.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

from mono_jit.cache.meta import LaunchDims, StoredArgument

from ..errors import KernargError
from ..hsaco.kernel_info import KernelArg
from .base import check_names

POINTER = ("global_buffer", 8)
EXTENT = ("by_value", 4)
I64 = ("by_value", 8)
I32_MAX = 2**31 - 1
SCALAR_RANGES = {"i32": (-2**31, I32_MAX), "i64": (-2**63, 2**63 - 1)}


class ArgTable(Protocol):
    """A code object's argument table for one kernel (offset, size, value kind of each)."""

    @property
    def args(self) -> Sequence[KernelArg]: ...


class LaunchMeta(Protocol):
    """What packing and launching read of an entry's metadata (an EntryMeta has all of it)."""

    @property
    def template(self) -> str: ...

    @property
    def arguments(self) -> Sequence[StoredArgument]: ...

    @property
    def kernels(self) -> Sequence[ArgTable]: ...

    @property
    def launch(self) -> LaunchDims: ...


@dataclass(frozen=True)
class DeclaredTable:
    """An argument table not read from a code object (the one FlyDSL would give, see backends)."""

    args: tuple[KernelArg, ...]


@dataclass(frozen=True)
class DeclaredMeta:
    """A template's declared arguments and launch, with no cache entry behind them."""

    template: str
    arguments: tuple[StoredArgument, ...]
    kernels: tuple[DeclaredTable, ...]
    launch: LaunchDims


@dataclass(frozen=True)
class Slot:
    """One explicit code-object argument: where it goes and how it is encoded."""

    argument: str
    part: str  # "pointer", "extent", "value" (an i32) or "value64" (an i64)
    offset: int
    size: int


def layout(meta: LaunchMeta, kernel: int = 0) -> tuple[list[Slot], int]:
    """The slots of every declared argument, in order, and the buffer size, from the metadata."""
    table = [a for a in meta.kernels[kernel].args if not a.value_kind.startswith("hidden_")]
    slots: list[Slot] = []
    position = 0

    def take(name: str, part: str, expected: tuple[str, int]) -> None:
        nonlocal position
        if position >= len(table):
            raise KernargError(f"{meta.template}: the code object has {len(table)} explicit arguments, "
                               f"too few for argument {name!r}")
        entry = table[position]
        if (entry.value_kind, entry.size) != expected:
            raise KernargError(f"{meta.template}: argument {name!r} ({part}) is code-object argument "
                               f"{position} of kind {entry.value_kind}/{entry.size} B, expected "
                               f"{expected[0]}/{expected[1]} B")
        slots.append(Slot(name, part, entry.offset, entry.size))
        position += 1

    for argument in meta.arguments:
        if argument.kind == "tensor":
            take(argument.name, "pointer", POINTER)
            take(argument.name, "extent", EXTENT)
        elif argument.kind == "i64":
            take(argument.name, "value64", I64)
        else:
            take(argument.name, "value", EXTENT)
    if position != len(table):
        raise KernargError(f"{meta.template}: the code object has {len(table)} explicit arguments, "
                           f"the template declares {position}")
    size = max((s.offset + s.size for s in slots), default=0)
    return slots, size


def _tensor_fields(name: str, dtype: str, value: Any, unbounded: bool) -> tuple[int, int]:
    """(pointer, extent) of a tensor argument, after its checks (extent 0 for an unbounded one)."""
    if not hasattr(value, "data_ptr"):
        raise KernargError(f"argument {name!r}: expected a {dtype} tensor, got {type(value).__name__}")
    got = str(value.dtype).removeprefix("torch.")
    if got != dtype:
        raise KernargError(f"argument {name!r}: dtype {got}, expected {dtype}")
    if not value.is_contiguous():
        raise KernargError(f"argument {name!r}: not contiguous (strides {tuple(value.stride())}); the kernels "
                           "index flat buffers")
    if unbounded:
        return value.data_ptr(), 0
    extent = value.numel()
    if extent > I32_MAX:
        raise KernargError(f"argument {name!r}: {extent} elements do not fit the i32 extent")
    return value.data_ptr(), extent


def pack(meta: LaunchMeta, values: Mapping[str, Any], kernel: int = 0) -> bytes:
    """The kernarg bytes for `values` (argument name -> tensor or int) per the entry's metadata."""
    slots, size = layout(meta, kernel)
    declared = {a.name: a for a in meta.arguments}
    check_names(meta.template, list(declared), values)
    fields: dict[str, tuple[int, int]] = {}
    for name, argument in declared.items():
        value = values[name]
        if argument.kind == "tensor":
            fields[name] = _tensor_fields(name, argument.dtype, value, argument.unbounded)
        else:
            low, high = SCALAR_RANGES[argument.kind]
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise KernargError(f"argument {name!r}: expected an {argument.kind}, got {value!r}")
            fields[name] = (value, value)
    buffer = bytearray(size)
    for slot in slots:
        pointer, extent = fields[slot.argument]
        if slot.part == "pointer":
            struct.pack_into("<Q", buffer, slot.offset, pointer)
        elif slot.part == "value64":
            struct.pack_into("<q", buffer, slot.offset, pointer)
        else:
            struct.pack_into("<i", buffer, slot.offset, extent)
    return bytes(buffer)
