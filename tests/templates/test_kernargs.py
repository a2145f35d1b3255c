"""Kernarg packing on the CPU against the code-object metadata of every template (compiled for
real): each tensor is its pointer then its i32 extent (0 for an unbounded one: the KV caches),
each scalar its i32, at the offsets the
code object's own argument table gives (read from the HSACO here, not from meta.json); an i64
scalar on a table of its own."""

from __future__ import annotations

import struct
from dataclasses import replace

import pytest
import torch
from cache_settings import settings_at
from sparse_memory import GiB, sparse_bytes

from mono_jit.cache.store import Entry, Store
from mono_jit.errors import TemplateError
from mono_jit.hsaco.metadata import read_metadata
from mono_jit.runtime.backends import declared_meta
from mono_jit.templates.kernargs import DeclaredTable, KernargError, layout, pack
from mono_jit.runtime.step import pages
from mono_jit.spec import Spec
from mono_jit.templates import Argument, LaunchShape, Template, checks, get


def entries(root):
    for entry in Store(settings_at(root)).entries():
        assert isinstance(entry, Entry), entry
        yield entry


@pytest.fixture(scope="module")
def every_template(golden_cache, k1_cache):
    """One compiled entry of each template: {name: entry}."""
    found = {}
    for root in (golden_cache, k1_cache):
        for entry in entries(root):
            found.setdefault(entry.meta.template, entry)
    assert set(found) == {"router", "keytable", "k1"}
    return found


def values_for(arguments) -> dict:
    """A distinct small CPU tensor per tensor argument (length 3 + its index), a distinct i32 per scalar."""
    values = {}
    for i, a in enumerate(arguments):
        values[a.name] = torch.zeros(3 + i, dtype=getattr(torch, a.dtype)) if a.kind == "tensor" else 1000 + i
    return values


@pytest.mark.parametrize("name", ["router", "keytable", "k1"])
def test_packed_bytes_sit_where_the_code_object_says(every_template, name):
    entry = every_template[name]
    _, kernels = read_metadata(entry.hsaco)
    (kernel,) = kernels
    table = [a for a in kernel.args if not a.value_kind.startswith("hidden_")]
    values = values_for(entry.meta.arguments)
    buffer = pack(entry.meta, values)
    assert len(buffer) <= kernel.kernarg_size
    slot = iter(table)
    for a in entry.meta.arguments:
        value = values[a.name]
        if a.kind == "tensor":
            pointer, extent = next(slot), next(slot)
            assert (pointer.size, pointer.value_kind, extent.size, extent.value_kind) == (8, "global_buffer", 4,
                                                                                          "by_value")
            assert struct.unpack_from("<Q", buffer, pointer.offset)[0] == value.data_ptr(), a.name
            length = 0 if a.unbounded else value.numel()  # an unbounded tensor's slot holds 0
            assert struct.unpack_from("<i", buffer, extent.offset)[0] == length, a.name
        else:
            scalar = next(slot)
            assert scalar.size == 4 and struct.unpack_from("<i", buffer, scalar.offset)[0] == value, a.name
    assert next(slot, None) is None


@pytest.mark.parametrize("name", ["router", "keytable", "k1"])
def test_the_reference_backends_declared_table_is_the_code_objects(every_template, name):
    entry = every_template[name]
    declared = declared_meta(get(name), Spec.from_dict(entry.meta.build_spec))
    _, (kernel,) = read_metadata(entry.hsaco)
    assert declared.kernels[0].args == kernel.args


def test_bad_arguments_are_refused_by_name(every_template):
    meta = every_template["router"].meta
    good = values_for(meta.arguments)
    first_tensor = next(a.name for a in meta.arguments if a.kind == "tensor")
    first_scalar = next(a.name for a in meta.arguments if a.kind != "tensor")
    cases = [
        ({**good, first_tensor: good[first_tensor].to(torch.float64)}, "dtype float64"),
        ({**good, first_tensor: torch.zeros(4, 2, dtype=good[first_tensor].dtype).t()}, "contiguous"),
        ({**good, first_scalar: 2**31}, "i32"),
        ({**good, first_scalar: True}, "i32"),
        ({k: v for k, v in good.items() if k != first_scalar}, "missing"),
        ({**good, "extra": 1}, "unknown"),
    ]
    for values, message in cases:
        with pytest.raises(KernargError, match=message):
            pack(meta, values)


def test_a_code_object_table_that_disagrees_with_the_template_is_refused(every_template):
    meta = every_template["router"].meta
    (kernel,) = meta.kernels
    fewer = meta._replace(kernels=(kernel._replace(args=kernel.args[:-1]),))
    with pytest.raises(KernargError, match="explicit arguments"):
        pack(fewer, values_for(meta.arguments))
    first = kernel.args[0]._replace(size=4, value_kind="by_value")
    retyped = meta._replace(kernels=(kernel._replace(args=(first, *kernel.args[1:])),))
    with pytest.raises(KernargError, match="global_buffer"):
        pack(retyped, values_for(meta.arguments))


class _Raw(Template):
    """A template whose kernel takes an Int64 address, an Int32 and an Int64 byte count."""

    name = "raw"
    spec_fields = ("max_tokens",)
    source_files = ()
    kernel_module = ".kernel"

    def launch_shape(self, spec):
        return LaunchShape(grid=(1, 1, 1), block=(64, 1, 1))

    def arguments(self, spec):
        return (Argument.i64("address", "a device address"), Argument.i32("m", "rows"),
                Argument.i64("stride", "bytes"))


def test_an_i64_argument_is_eight_bytes_where_the_table_says():
    """Kind i64 (fx.Int64: raw addresses and byte counts, as vLLM's own kernels take them) passes the
    template checks, packs as 8 bytes at the code object's offset, and is refused out of range or
    against a 4-byte table entry; the reference backend's table agrees."""
    spec = Spec(8, 4, 1024, 1)
    assert checks.arguments(_Raw(), spec, "raw") == _Raw().arguments(spec)
    with pytest.raises(TemplateError, match="an i64 scalar has dtype 'int64'"):
        checks.arguments(type("Bad", (_Raw,), {"arguments": lambda self, s: (Argument("a", "i64", "int32", ""),)})(),
                         spec, "raw")
    meta = declared_meta(_Raw(), spec)
    assert [(a.offset, a.size) for a in meta.kernels[0].args] == [(0, 8), (8, 4), (16, 8)]
    assert pack(meta, {"address": 2**40 + 3, "m": -5, "stride": 584}) == struct.pack("<qiiq", 2**40 + 3, -5, 0, 584)
    with pytest.raises(KernargError, match="expected an i64"):
        pack(meta, {"address": 2**63, "m": 1, "stride": 0})
    table = meta.kernels[0].args
    narrow = replace(meta, kernels=(DeclaredTable((table[0]._replace(size=4), *table[1:])),))
    with pytest.raises(KernargError, match="expected by_value/8 B"):
        pack(narrow, {"address": 1, "m": 1, "stride": 0})


@pytest.mark.parametrize("name, caches", [("k1", ("kv_cache",)), ("k2", ("swa_cache", "comp_cache"))])
def test_kv_caches_past_4_gib_pack_with_their_pointer(name, caches, tmp_path):
    """The KV caches (declared unbounded: K1 and K2 address their records in 64 bits) pack at any
    size: vLLM's [pages, 64, 584] view of a 5 GiB cache (a sparse file), flattened as the runner
    passes it, packs its pointer and an extent of 0, where the i32 extent refused it; any other
    tensor past the i32 extent is still refused by name."""
    meta = declared_meta(get(name), Spec(8, 4, 1024, 1))
    stride = 64 * 584 + 64
    cache = sparse_bytes(tmp_path / "cache", 5 * GiB // stride * stride).view(-1, stride)
    view = pages(torch.as_strided(cache, (cache.shape[0], 64, 584), (stride, 584, 1)))
    assert view.numel() > 4 * GiB
    values = {**values_for(meta.arguments), **{c: view for c in caches}}
    buffer = pack(meta, values)
    slots, _ = layout(meta)
    for c in caches:
        pointer, extent = [s for s in slots if s.argument == c]
        assert struct.unpack_from("<Q", buffer, pointer.offset)[0] == cache.data_ptr()
        assert struct.unpack_from("<i", buffer, extent.offset)[0] == 0
    other = next(a for a in meta.arguments if a.kind == "tensor" and a.name not in caches)
    huge = torch.empty(2**31, dtype=getattr(torch, other.dtype), device="meta")
    with pytest.raises(KernargError, match=f"argument '{other.name}': 2147483648 elements do not fit"):
        pack(meta, {**values, other.name: huge})
