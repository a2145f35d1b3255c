"""What one kernel build is specialised for, and what one deployment needs.

A :class:`Spec` is (tp, ratio, topk_width, max_tokens, arch). Each field is validated with an
error that names the field, the value and what is allowed. ``max_tokens`` is a bucket: a step
of M rows runs the smallest built bucket >= M, with M a runtime argument (:func:`bucket_for`).
"""

from __future__ import annotations

import math
from typing import Iterable

from mono_jit.record import Record

from . import deepseek_v4
from .errors import SpecError

STANDARD_MAX_TOKENS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
SUPPORTED_ARCHS: tuple[str, ...] = ("gfx950",)
RATIOS: tuple[int, ...] = (deepseek_v4.CSA_RATIO, deepseek_v4.HCA_RATIO)
SPEC_FIELDS: tuple[str, ...] = ("tp", "ratio", "topk_width", "max_tokens", "arch")
# TP must split the 128 heads, the 16 output groups and the 3072-wide expert intermediate.
_TP_DIVIDES = (deepseek_v4.HEADS, deepseek_v4.OUTPUT_GROUPS, deepseek_v4.MOE_INTERMEDIATE)
VALID_TP: tuple[int, ...] = tuple(t for t in range(1, 17) if all(n % t == 0 for n in _TP_DIVIDES))
MAX_HCA_TOPK_WIDTH = 65536  # an 8M-token context; far above any DeepSeek-V4 deployment


def _require_int(field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{field}={value!r}: expected an integer, got {type(value).__name__}")
    return value


def hca_topk_width(max_model_len: int) -> int:
    """HCA top-k width: every compressed row, rounded up to 128 (vLLM's get_c128a_topk_width)."""
    _require_int("max_model_len", max_model_len)
    if max_model_len < 1:
        raise SpecError(f"max_model_len={max_model_len}: expected a positive token count")
    rows = math.ceil(max_model_len / deepseek_v4.HCA_RATIO)
    return math.ceil(rows / deepseek_v4.HCA_TOPK_ALIGNMENT) * deepseek_v4.HCA_TOPK_ALIGNMENT


class Spec(Record):
    """One specialisation of the layer's kernels, validated when made. A Record (immutable,
    ordered and hashed by its fields), as every record a cache hit defines (mono_jit/record.py)."""

    tp: int
    ratio: int
    topk_width: int
    max_tokens: int
    arch: str = "gfx950"

    def __new__(cls, tp: int, ratio: int, topk_width: int, max_tokens: int, arch: str = "gfx950") -> "Spec":
        spec = super().__new__(cls, tp, ratio, topk_width, max_tokens, arch)
        spec._validate()
        return spec

    def _validate(self) -> None:
        tp = _require_int("tp", self.tp)
        if tp not in VALID_TP:
            raise SpecError(
                f"tp={tp}: must divide 128 heads, 16 output groups and the 3072 expert width; "
                f"allowed: {', '.join(map(str, VALID_TP))} (the kernels target 8)"
            )
        ratio = _require_int("ratio", self.ratio)
        if ratio not in RATIOS:
            raise SpecError(f"ratio={ratio}: expected 4 (CSA) or 128 (HCA)")
        width = _require_int("topk_width", self.topk_width)
        if ratio == deepseek_v4.CSA_RATIO and width != deepseek_v4.CSA_INDEX_TOPK:
            raise SpecError(f"topk_width={width}: CSA (ratio 4) uses the indexer's top-k, 1024")
        if ratio == deepseek_v4.HCA_RATIO and not (
            0 < width <= MAX_HCA_TOPK_WIDTH and width % deepseek_v4.HCA_TOPK_ALIGNMENT == 0
        ):
            raise SpecError(
                f"topk_width={width}: HCA (ratio 128) needs a positive multiple of 128 up to "
                f"{MAX_HCA_TOPK_WIDTH} (roundup(ceil(max_model_len / 128), 128); 8192 at 1M)"
            )
        max_tokens = _require_int("max_tokens", self.max_tokens)
        if not 1 <= max_tokens <= deepseek_v4.MAX_DECODE_TOKENS:
            raise SpecError(f"max_tokens={max_tokens}: expected a bucket from 1 to 64")
        if self.arch not in SUPPORTED_ARCHS:
            raise SpecError(f"arch={self.arch!r}: expected one of {', '.join(SUPPORTED_ARCHS)}")

    def as_dict(self) -> dict[str, object]:
        return self._asdict()

    def project(self, fields: Iterable[str]) -> dict[str, object]:
        """The fields a template reads (always with arch): its key leaves the others out."""
        wanted = set(fields) | {"arch"}
        return {name: value for name, value in self.as_dict().items() if name in wanted}

    def label(self) -> str:
        return f"tp{self.tp}-r{self.ratio}-k{self.topk_width}-m{self.max_tokens}-{self.arch}"

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> "Spec":
        unknown = set(data) - set(SPEC_FIELDS)
        if unknown:
            raise SpecError(f"unknown spec field(s): {', '.join(sorted(unknown))}")
        missing = set(SPEC_FIELDS[:4]) - set(data)
        if missing:
            raise SpecError(f"missing spec field(s): {', '.join(sorted(missing))}")
        return cls(**data)  # type: ignore[arg-type]


def normalise_buckets(buckets: Iterable[int]) -> tuple[int, ...]:
    """Sorted, de-duplicated, validated max-tokens buckets."""
    out = sorted({_require_int("max_tokens", b) for b in buckets})
    if not out:
        raise SpecError("max_tokens: expected at least one bucket")
    for b in out:
        if not 1 <= b <= deepseek_v4.MAX_DECODE_TOKENS:
            raise SpecError(f"max_tokens={b}: expected a bucket from 1 to 64")
    return tuple(out)


def deployment_grid(
    tp: int = 8,
    max_model_len: int = deepseek_v4.MAX_MODEL_LEN,
    max_tokens_buckets: Iterable[int] = STANDARD_MAX_TOKENS,
    ratios: Iterable[int] = RATIOS,
    arch: str = "gfx950",
    *,
    hca_width: int | None = None,
) -> list[Spec]:
    """Every Spec one deployment needs: each compress ratio x each max-tokens bucket. HCA's
    top-k width is `hca_width` when given (the runner has it from vLLM), else the one
    `max_model_len` implies. Prebuild builds this grid and the runner loads it."""
    hca = hca_topk_width(max_model_len) if hca_width is None else hca_width
    widths = {deepseek_v4.CSA_RATIO: deepseek_v4.CSA_INDEX_TOPK, deepseek_v4.HCA_RATIO: hca}
    grid = []
    for ratio in sorted(set(ratios)):
        if ratio not in widths:
            raise SpecError(f"ratio={ratio}: expected 4 (CSA) or 128 (HCA)")
        for bucket in normalise_buckets(max_tokens_buckets):
            grid.append(Spec(tp, ratio, widths[ratio], bucket, arch))
    return grid


def bucket_for(rows: int, buckets: Iterable[int]) -> int:
    """The smallest bucket that holds a step of `rows` rows."""
    _require_int("rows", rows)
    fitting = [b for b in normalise_buckets(buckets) if b >= rows]
    if rows < 1 or not fitting:
        raise SpecError(f"rows={rows}: no built max-tokens bucket holds it (buckets: {sorted(buckets)})")
    return fitting[0]
