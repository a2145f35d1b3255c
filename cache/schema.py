"""meta.json's schema: the type of every field the runtime, the CLI and the store read.

The runtime packs kernargs from ``kernels[].args`` and launches with ``launch`` / ``launches``;
the CLI prints figures, factors and residency. An entry whose meta.json lacks one of these, or
holds one of another type (``"hsaco": null``, a string offset, a negative size), is a corrupt
entry, never an AttributeError or KeyError later. Extra fields are allowed (older readers
ignore newer fields). ``EntryMeta.from_json`` (meta.py) runs these checks before it builds the
typed record every reader uses.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Union


class Leaf:
    """A scalar: `what` it must be, and the test."""

    __slots__ = ("what", "test")

    def __init__(self, what: str, test: Callable[[Any], bool]) -> None:
        self.what, self.test = what, test


class ListOf:
    """A list of `item`s: exactly `length` of them when given, else at least `least`."""

    __slots__ = ("item", "length", "least")

    def __init__(self, item: "Shape", length: int | None = None, least: int = 0) -> None:
        self.item, self.length, self.least = item, length, least


class MapOf:
    """An object with string keys, every value an `item`."""

    __slots__ = ("item",)

    def __init__(self, item: "Shape") -> None:
        self.item = item


Shape = Union[Leaf, ListOf, MapOf, dict]  # a dict: these fields, each of its shape

UINT = Leaf("a non-negative integer", lambda v: type(v) is int and v >= 0)
STR = Leaf("a string", lambda v: type(v) is str)
BOOL = Leaf("a boolean", lambda v: type(v) is bool)
NUMBER = Leaf("a number", lambda v: type(v) in (int, float))
_HEX_DIGITS = frozenset("0123456789abcdef")
HEX64 = Leaf("64 lowercase hex digits", lambda v: type(v) is str and len(v) == 64 and _HEX_DIGITS.issuperset(v))
SCALAR = Leaf("a string or an integer", lambda v: type(v) in (str, int))
KIND = Leaf('"tensor", "i32" or "i64"', lambda v: v in ("tensor", "i32", "i64"))
DIM3 = ListOf(UINT, length=3)
LAUNCH = {"grid": DIM3, "block": DIM3, "dynamic_lds": UINT}

META: dict = {
    "schema": UINT,
    "key": HEX64,
    "factors": {"format": UINT, "template": {"name": STR, "source_digest": STR}, "spec": MapOf(SCALAR),
                "arch": STR, "toolchain": MapOf(STR), "options": {}},
    "template": STR,
    "spec": MapOf(SCALAR),
    "build_spec": MapOf(SCALAR),
    "arch": STR,
    "hsaco": {"size": UINT, "sha256": HEX64},
    "kernels": ListOf({
        "name": STR, "symbol": STR, "kernarg_size": UINT,
        "args": ListOf({"offset": UINT, "size": UINT, "value_kind": STR}),
        **{field: UINT for field in ("vgpr", "agpr", "sgpr", "lds", "scratch", "vgpr_spills", "sgpr_spills",
                                     "wavefront_size", "max_workgroup_size")},
    }, least=1),
    "launches": ListOf({"kernel": STR, **LAUNCH}, least=1),
    "launch": LAUNCH,
    "arguments": ListOf({"name": STR, "kind": KIND, "dtype": STR, "doc": STR}),
    "persistent": BOOL,
    "budget": MapOf(UINT),
    "residency": MapOf({field: UINT for field in ("waves_per_cta", "waves_per_simd", "regs_per_wave",
                                                  "max_waves_per_simd_by_regs", "lds_bytes", "ctas_per_cu")}),
    "compile_seconds": NUMBER,
    "created": STR,
}


def problem(value: Any, shape: Shape, where: str = "meta") -> str | None:
    """What is wrong with `value` against `shape` (the first thing found), or None."""
    if isinstance(shape, Leaf):
        return None if shape.test(value) else f"{where} is {_show(value)}, not {shape.what}"
    if isinstance(shape, ListOf):
        return _list_problem(value, shape, where)
    if not isinstance(value, dict):
        return f"{where} is {_show(value)}, not an object"
    items: Iterable[tuple[str, Any]]
    if isinstance(shape, MapOf):
        items = value.items()
    else:
        missing = [name for name in shape if name not in value]
        if missing:
            return f"{where} lacks {missing[0]!r}"
        items = ((name, value[name]) for name in shape)
    for name, item in items:
        found = problem(item, shape.item if isinstance(shape, MapOf) else shape[name], f"{where}.{name}")
        if found:
            return found
    return None


def _list_problem(value: Any, shape: ListOf, where: str) -> str | None:
    if not isinstance(value, list):
        return f"{where} is {_show(value)}, not a list"
    if shape.length is not None and len(value) != shape.length:
        return f"{where} has {len(value)} items, not {shape.length}"
    if len(value) < shape.least:
        return f"{where} has {len(value)} items, fewer than {shape.least}"
    for index, item in enumerate(value):
        found = problem(item, shape.item, f"{where}[{index}]")
        if found:
            return found
    return None


def predicate(shape: Shape) -> Callable[[Any], bool]:
    """A fast yes / no test of `shape` (every load runs it; problem() then says what is wrong)."""
    if isinstance(shape, Leaf):
        return shape.test
    if isinstance(shape, MapOf):
        values = predicate(shape.item)
        return lambda v: type(v) is dict and all(map(values, v.values()))
    if isinstance(shape, ListOf):
        return _list_predicate(shape)
    fields = tuple((name, predicate(sub)) for name, sub in shape.items())

    def fits(value: Any) -> bool:
        if type(value) is not dict:
            return False
        for name, test in fields:
            if name not in value or not test(value[name]):
                return False
        return True

    return fits


def _list_predicate(shape: ListOf) -> Callable[[Any], bool]:
    items, length, least = predicate(shape.item), shape.length, shape.least

    def fits(value: Any) -> bool:
        if type(value) is not list or len(value) < least or (length is not None and len(value) != length):
            return False
        return all(map(items, value))

    return fits


_META_FITS = predicate(META)


def meta_problem(meta: Any) -> str | None:
    """What is wrong with a parsed meta.json: its fields' types, then that every launch names a
    kernel of the code object and every argument name is unique; None if nothing."""
    if not _META_FITS(meta):
        return problem(meta, META) or "meta.json does not fit its schema"
    kernels = {kernel["name"] for kernel in meta["kernels"]}
    unknown = [launch["kernel"] for launch in meta["launches"] if launch["kernel"] not in kernels]
    if unknown:
        return f"meta.launches names kernel {unknown[0]!r}, which meta.kernels lacks"
    names = [argument["name"] for argument in meta["arguments"]]
    if len(set(names)) != len(names):
        return "meta.arguments repeats an argument name"
    return None


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
