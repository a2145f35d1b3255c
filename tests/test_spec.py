import pytest

from mono_jit import deepseek_v4
from mono_jit.errors import SpecError
from mono_jit.spec import STANDARD_MAX_TOKENS, VALID_TP, Spec, bucket_for, deployment_grid, hca_topk_width


def test_valid_spec_round_trips():
    spec = Spec(8, 4, 1024, 16)
    assert Spec.from_dict(spec.as_dict()) == spec
    assert spec.project(["max_tokens"]) == {"max_tokens": 16, "arch": "gfx950"}


@pytest.mark.parametrize("kwargs, words", [
    (dict(tp=3, ratio=4, topk_width=1024, max_tokens=1), ["tp=3", "must divide"]),
    (dict(tp=8, ratio=16, topk_width=1024, max_tokens=1), ["ratio=16", "4 (CSA) or 128 (HCA)"]),
    (dict(tp=8, ratio=4, topk_width=512, max_tokens=1), ["topk_width=512", "1024"]),
    (dict(tp=8, ratio=128, topk_width=100, max_tokens=1), ["topk_width=100", "multiple of 128"]),
    (dict(tp=8, ratio=4, topk_width=1024, max_tokens=0), ["max_tokens=0", "1 to 64"]),
    (dict(tp=8, ratio=4, topk_width=1024, max_tokens=65), ["max_tokens=65"]),
    (dict(tp=8, ratio=4, topk_width=1024, max_tokens=1, arch="gfx942"), ["arch='gfx942'", "gfx950"]),
    (dict(tp=True, ratio=4, topk_width=1024, max_tokens=1), ["tp=True", "integer"]),
    (dict(tp=8, ratio=4, topk_width=1024, max_tokens="8"), ["max_tokens='8'", "integer"]),
])
def test_bad_fields_name_field_value_and_rule(kwargs, words):
    with pytest.raises(SpecError) as info:
        Spec(**kwargs)
    for word in words:
        assert word in str(info.value)


def test_hca_width_follows_vllm_rounding():
    assert hca_topk_width(1 << 20) == 8192
    assert hca_topk_width(128 * 129) == 256
    assert hca_topk_width(1) == 128


def test_default_grid_is_both_ratios_times_buckets():
    grid = deployment_grid()
    assert len(grid) == 2 * len(STANDARD_MAX_TOKENS)
    assert {(s.ratio, s.topk_width) for s in grid} == {(4, 1024), (128, 8192)}
    assert all(s.tp == 8 and s.arch == "gfx950" for s in grid)


def test_grid_rejects_bad_ratio_and_bucket():
    with pytest.raises(SpecError, match="ratio=8"):
        deployment_grid(ratios=[8])
    with pytest.raises(SpecError, match="max_tokens=100"):
        deployment_grid(max_tokens_buckets=[1, 100])


def test_bucket_for_picks_smallest_holding_bucket():
    assert bucket_for(1, STANDARD_MAX_TOKENS) == 1
    assert bucket_for(5, STANDARD_MAX_TOKENS) == 8
    assert bucket_for(64, STANDARD_MAX_TOKENS) == 64
    with pytest.raises(SpecError, match="rows=65"):
        bucket_for(65, STANDARD_MAX_TOKENS)


def test_the_grid_takes_hca_width_as_the_runner_has_it_from_vllm():
    assert deployment_grid(hca_width=8192) == deployment_grid()
    assert {s.topk_width for s in deployment_grid(hca_width=256) if s.ratio == 128} == {256}
    with pytest.raises(SpecError, match="topk_width=100"):
        deployment_grid(hca_width=100)


def test_the_runner_loads_the_builds_prebuild_builds():
    from mono_jit.pipeline.deployment import LAYER_TEMPLATES, builds
    from mono_jit.runtime.grid import layer_grid
    from mono_jit.templates import get

    prebuilt = builds([get(name) for name in LAYER_TEMPLATES], deployment_grid(4, max_tokens_buckets=[1, 8, 64]))
    loaded = layer_grid(4, hca_topk_width(deepseek_v4.MAX_MODEL_LEN), buckets=[64, 8, 1])
    assert [(entry.template, entry.spec) for entry in loaded] == [(t.name, s) for t, s in prebuilt]
    assert {entry.template for entry in loaded} == set(LAYER_TEMPLATES)


def test_a_rank_holds_its_share_of_every_width_the_ranks_split():
    for tp in VALID_TP:
        share = deepseek_v4.per_rank(tp)
        assert share.heads * tp == deepseek_v4.HEADS and share.groups * tp == deepseek_v4.OUTPUT_GROUPS
        assert share.inter * tp == deepseek_v4.MOE_INTERMEDIATE == share.shared_inter * tp
        assert share.group_k == deepseek_v4.HEADS // deepseek_v4.OUTPUT_GROUPS * deepseek_v4.HEAD_DIM
    assert deepseek_v4.per_rank(8) == (16, 2, 4096, 384, 384)


@pytest.mark.parametrize("tp", [0, 3, 32, 48])
def test_a_tp_that_does_not_split_the_widths_is_one_value_error_naming_them(tp):
    with pytest.raises(ValueError, match=f"tensor parallelism {tp} does not split [A-Z_]+ [0-9]+"):
        deepseek_v4.per_rank(tp)
