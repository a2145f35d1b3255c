"""The router reference against an independent, loop-by-loop formulation."""

import math

import torch

from mono_jit.templates.router.reference import route, select_experts, sqrt_softplus


def naive_route(x, gate, bias, hash_ids=None):
    ids_out, w_out = [], []
    for r in range(x.shape[0]):
        logits = [float(torch.dot(x[r].float(), gate[e].float())) for e in range(gate.shape[0])]
        scores = [math.sqrt(max(l, 0.0) + math.log1p(math.exp(-abs(l)))) for l in logits]
        if hash_ids is None:
            biased = [(-math.inf if math.isnan(s + float(b)) else s + float(b), e) for e, (s, b) in enumerate(zip(scores, bias))]
            ids = [e for _, e in sorted(biased, key=lambda t: (-t[0], t[1]))[:6]]
        else:
            ids = [int(i) for i in hash_ids[r]]
        raw = [0.0 if not (0 <= e < len(scores)) or math.isnan(scores[e]) else scores[e] for e in ids]
        total = max(sum(raw), 1e-20)
        ids_out.append(ids)
        w_out.append([v / total * 2.5 for v in raw])
    return torch.tensor(ids_out, dtype=torch.int32), torch.tensor(w_out)


def make(rows=3, experts=384, hidden=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, hidden, generator=g).to(torch.bfloat16)
    gate = (torch.randn(experts, hidden, generator=g) * 0.2).to(torch.bfloat16)
    bias = torch.randn(experts, generator=g) * 0.1
    return x, gate, bias


def test_matches_naive_formulation():
    x, gate, bias = make()
    ids, weights = route(x, gate, bias)
    ref_ids, ref_w = naive_route(x, gate, bias)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_w, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weights.sum(-1), torch.full((3,), 2.5), rtol=1e-5, atol=1e-6)


def test_ties_go_to_lower_index():
    values = torch.zeros(1, 384)
    values[0, [7, 3, 300, 5, 100, 42, 8]] = 1.0
    assert select_experts(values).tolist() == [[3, 5, 7, 8, 42, 100]]


def test_nan_is_never_preferred_and_all_nan_falls_back_to_index_order():
    values = torch.full((2, 384), float("nan"))
    values[0, 10] = -5.0
    assert select_experts(values).tolist()[0][0] == 10
    assert select_experts(values).tolist()[1] == [0, 1, 2, 3, 4, 5]


def test_nan_scores_weigh_zero():
    x, gate, bias = make(rows=1)
    gate = gate.clone()
    gate[17] = float("nan")
    ids, weights = route(x, gate, bias, hash_ids=torch.tensor([[17, 1, 2, 3, 4, 5]], dtype=torch.int32))
    assert weights[0, 0] == 0
    torch.testing.assert_close(weights.sum(), torch.tensor(2.5))


def test_hash_layers_ignore_bias_and_keep_given_order():
    x, gate, bias = make(rows=2)
    hash_ids = torch.tensor([[5, 4, 3, 2, 1, 0], [383, 0, 7, 7, 9, 10]], dtype=torch.int32)
    ids, weights = route(x, gate, bias * 100, hash_ids)
    ref_ids, ref_w = naive_route(x, gate, bias * 100, hash_ids)
    assert torch.equal(ids, hash_ids)
    torch.testing.assert_close(weights, ref_w, rtol=1e-5, atol=1e-6)


def test_out_of_range_hash_id_weighs_zero():
    x, gate, bias = make(rows=1)
    ids, weights = route(x, gate, bias, torch.tensor([[-1, 1, 2, 3, 4, 999]], dtype=torch.int32))
    assert weights[0, 0] == 0 and weights[0, 5] == 0


def test_softplus_is_stable_at_extremes():
    out = sqrt_softplus(torch.tensor([-1000.0, 0.0, 1000.0]))
    assert out[0] == 0 and math.isclose(out[1].item(), math.sqrt(math.log(2)), rel_tol=1e-6)
    assert math.isclose(out[2].item(), math.sqrt(1000.0), rel_tol=1e-6)
