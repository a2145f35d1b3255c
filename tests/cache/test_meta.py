"""meta.json's typed record: a published entry's bytes round-trip through EntryMeta exactly, an
entry written before the newer optional fields still loads and exports unchanged, and a record
that does not fit the schema is refused naming the field."""

from __future__ import annotations

import json
import re

import pytest
from cache_settings import settings_at

from mono_jit.cache import Entry, EntryMeta, Store
from mono_jit.cache.meta import META_SCHEMA, MetaError
from mono_jit.cache.oci.artifact import pack
from mono_jit.cache.store import meta_bytes


def _entries(root) -> list[Entry]:
    return [e for e in Store(settings_at(root)).entries() if isinstance(e, Entry)]


def test_published_bytes_round_trip_through_the_record(golden_cache):
    for entry in _entries(golden_cache):
        data = (entry.path / "meta.json").read_bytes()
        assert entry.meta_json == data
        assert meta_bytes(EntryMeta.from_json(json.loads(data))) == data, entry.key


def test_an_entry_without_the_newer_optional_fields_loads_and_exports_its_own_bytes(golden_cache, tmp_path):
    entry = next(e for e in _entries(golden_cache) if e.meta.template == "router")
    old = json.loads(entry.meta_json)
    for argument in old["arguments"]:
        del argument["unbounded"]
    for kernel in old["kernels"]:
        del kernel["reqd_workgroup_size"]
    del old["mono_jit"]
    data = meta_bytes(old)
    store = Store(settings_at(tmp_path / "cache"))
    published = store.publish_json(entry.key, entry.arch, entry.hsaco, data)
    assert published.meta_json == data and published.meta.mono_jit is None
    assert [a.unbounded for a in published.meta.arguments] == [False] * len(old["arguments"])
    assert data in pack(published)  # the registry blob carries meta.json's own bytes


@pytest.mark.parametrize("change, message", [
    (lambda m: m.update(schema=META_SCHEMA + 1), "schema 2 is not 1"),
    (lambda m: m["hsaco"].update(size=-1), "meta.hsaco.size is -1"),
    (lambda m: m["launch"].update(grid=[1, 1]), "meta.launch.grid has 2 items"),
    (lambda m: m["arguments"][0].update(kind="f32"), "meta.arguments[0].kind"),
])
def test_a_record_that_does_not_fit_is_refused_naming_the_field(golden_cache, change, message):
    data = _entries(golden_cache)[0].meta.to_json()
    change(data)
    with pytest.raises(MetaError, match=re.escape(message)):
        EntryMeta.from_json(data)


def test_the_schema_checks_every_field_the_record_writes(golden_cache):
    """schema.py and EntryMeta describe one format: every field to_json writes is typed by the
    schema (the version string aside, which readers never need)."""
    from mono_jit.cache.schema import META

    data = _entries(golden_cache)[0].meta.to_json()
    assert set(META) == set(data) - {"mono_jit"}


def test_every_report_names_a_build_by_one_label():
    from mono_jit.pipeline import deployment
    from mono_jit.pipeline.job import BuildJob
    from mono_jit.cache.meta import build_label
    from mono_jit.pipeline.prebuild import _plan_failure
    from mono_jit.spec import Spec
    from mono_jit.templates import get

    k2, spec = get("k2"), Spec(8, 128, 8192, 16)
    label = build_label("k2", k2.key_spec(spec))
    assert label == "k2(tp=8, ratio=128, topk_width=8192, max_tokens=16, arch=gfx950)"
    assert BuildJob.plan(k2, spec, {"flydsl": "x"}).label == deployment.label(k2, spec) == label
    assert _plan_failure(k2, spec, ValueError("bad")).label == label
