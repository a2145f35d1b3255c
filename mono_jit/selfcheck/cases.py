"""One seeded case per template: inputs, a launch of the cached code object, and the comparison
with the template's torch reference. Each returns its figure of merit and the bound it is held
to, or raises Mismatch (or AssertionError from torch's comparison) naming what disagreed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from ..templates.base import in_order
from ..spec import Spec
from ..templates import get
from ..templates.keytable.reference import key_table
from ..templates.router.reference import route
from .k1_world import K1Run, Mismatch, random_weights
from .k2_ranks import K2Ranks
from .k2_world import hash_route_ids, sparse_moe_ranks, world

Launcher = Callable[..., Any]
H = 7168


@dataclass(frozen=True)
class Measure:
    """What a case measured: `error` (its figure of merit) against `bound`, and what it is."""

    error: float
    bound: float
    what: str


def positional(template: str, spec: Spec, values: Mapping[str, Any]) -> tuple:
    """`values` by argument name as a launcher's positional arguments, in the template's order."""
    return in_order(template, [a.name for a in get(template).arguments(spec)], values)


def router_case(spec: Spec, launch: Launcher, seed: int) -> Measure:
    """m = bucket - 1 rows (hash routing on odd buckets): ids and weights against `route`."""
    bucket = spec.max_tokens
    rows, use_hash = max(1, bucket - 1), bucket % 2
    g = torch.Generator().manual_seed(seed + bucket)
    x = torch.randn(bucket, H, generator=g).to(torch.bfloat16)
    gate = (torch.randn(384, H, generator=g) * 0.02).to(torch.bfloat16)
    bias = torch.randn(384, generator=g) * 0.05
    hash_ids = torch.randint(0, 384, (bucket, 6), generator=g, dtype=torch.int32)
    ids = torch.full((bucket, 6), -7, dtype=torch.int32)
    weights = torch.zeros(bucket, 6)
    launch(*positional("router", spec, {"x": x.flatten(), "gate": gate.flatten(), "bias": bias,
                                        "hash_ids": hash_ids.flatten(), "ids": ids.view(-1),
                                        "weights": weights.view(-1), "m": rows, "use_hash": use_hash}))
    ref_ids, ref_w = route(x[:rows], gate, bias, hash_ids[:rows] if use_hash else None)
    if not (ids[rows:] == -7).all():
        raise Mismatch("rows past m were written")
    # Logit sums run in another order than torch's: ids may swap only on near-ties.
    swapped = 1.0 - (ids[:rows] == ref_ids).float().mean().item()
    if swapped > 0.01:
        raise Mismatch(f"{swapped:.1%} of the expert ids differ from the reference (at most 1 % may swap on ties)")
    torch.testing.assert_close(weights[:rows].sum(-1), torch.full((rows,), 2.5), rtol=1e-4, atol=1e-4)
    match = ids[:rows] == ref_ids
    torch.testing.assert_close(weights[:rows][match], ref_w[match], rtol=2e-3, atol=2e-4)
    return Measure(swapped, 0.01, "fraction of expert ids swapped")


def keytable_case(spec: Spec, launch: Launcher, seed: int) -> Measure:
    """m = bucket - 1 rows of SWA and top-k indices: slots and lengths exactly as `key_table`."""
    bucket, width, per_page = spec.max_tokens, spec.topk_width, 64
    rows = max(1, bucket - 1)
    g = torch.Generator().manual_seed(seed + spec.ratio + bucket)
    swa = torch.randint(-1, 5000, (bucket, 128), generator=g, dtype=torch.int32)
    lens = torch.randint(0, 129, (bucket,), generator=g, dtype=torch.int32)
    lens[0] = 128
    limit = 3 * per_page if spec.ratio == 4 else 100000
    topk = torch.randint(-1, limit, (bucket, width), generator=g, dtype=torch.int32)
    req = torch.randint(0, 2, (bucket,), generator=g, dtype=torch.int32)
    table = torch.randint(0, 1000, (2, 3), generator=g, dtype=torch.int32)
    slots = torch.full((bucket, width + 128), -7, dtype=torch.int32)
    out_lens = torch.full((bucket,), -7, dtype=torch.int32)
    launch(*positional("keytable", spec, {
        "swa_indices": swa.flatten(), "swa_lens": lens, "token_req": req, "topk": topk.flatten(),
        "block_table": table.flatten(), "slots": slots.view(-1), "lens": out_lens, "m": rows,
        "block_table_stride": table.shape[1], "entries_per_page": per_page}))
    ref_slots, ref_lens = key_table(swa[:rows], lens[:rows], topk[:rows], spec.ratio, req[:rows], table, per_page)
    wrong = int((slots[:rows] != ref_slots).sum()) + int((out_lens[:rows] != ref_lens).sum())
    if wrong:
        raise Mismatch(f"{wrong} slots or lengths differ from the reference (they must be exact)")
    if not (slots[rows:] == -7).all():
        raise Mismatch("rows past m were written")
    return Measure(0.0, 0.0, "slots and lengths that differ")


def k1_case(spec: Spec, launch: Launcher, seed: int) -> Measure:
    """m = bucket - 3 rows (all rows below 8), every output and the KV cache against
    `reference.k1`; the figure is q's mean error."""
    bucket = spec.max_tokens
    m = bucket if bucket < 8 else bucket - 3
    run = K1Run(bucket, random_weights(seed=seed, row_pad=256), row_pad=256, shuffled=bucket % 2 == 0,
                device="cpu", launcher=launch)
    step = run.set_step(m, seed=seed + m, do_fold=1)
    before = run.cache.clone()
    run.launch(step)
    error, bound = run.check(step, cache_before=before)["q"]
    if run.sync[:3].tolist() != [1, 0, 0]:
        raise Mismatch(f"sync area after one launch is {run.sync[:3].tolist()}, expected [1, 0, 0]")
    return Measure(error, bound, "q's mean abs error")


def k2_case(spec: Spec, launch: Launcher, seed: int) -> Measure:
    """K2 on 8 emulated ranks sharing peer buffers: m = min(3, bucket) rows (row 1 a graph-pad
    row, rows past m the bucket's pad rows), HCA's top-k at the spec's width with 30 and 200
    active keys, a sparse 384-expert MoE layer (a hash layer at odd buckets); every rank's
    outputs against part one's and moe_reference's (K2Ranks.check); the figure is out's mean error."""
    bucket = spec.max_tokens
    rows = min(3, bucket)
    route_ids = hash_route_ids(rows, seed + 5) if bucket % 2 else None
    ranks = K2Ranks.build(world(spec.ratio, seed=seed + 1, rows=rows, width=spec.topk_width), bucket,
                          sparse_moe_ranks(seed + 3, hash_layer=route_ids is not None), route_ids)
    try:
        ranks.launch(launch)
        return Measure(ranks.check(epoch=1), 3e-3, "out's mean abs error")
    finally:
        ranks.peers.close()


CASES: dict[str, Callable[[Spec, Launcher, int], Measure]] = {
    "router": router_case, "keytable": keytable_case, "k1": k1_case, "k2": k2_case}
