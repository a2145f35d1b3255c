"""Kernel launches against the torch references. They need an MI355X (gfx950) and are skipped
elsewhere; nothing here has run on hardware yet. The launch goes through FlyDSL's own JIT
call (the ctypes runner comes with the runner issue)."""

import pytest
import torch

from mono_jit.spec import Spec
from mono_jit.templates import get
from mono_jit.templates.keytable.reference import key_table
from mono_jit.templates.router.reference import route


def _on_gfx950() -> bool:
    if not torch.cuda.is_available() or getattr(torch.version, "hip", None) is None:
        return False
    return "gfx950" in torch.cuda.get_device_properties(0).gcnArchName


pytestmark = [
    pytest.mark.gfx950,
    pytest.mark.skipif(not _on_gfx950(), reason="needs an AMD MI355X (gfx950) GPU with ROCm; none on this machine"),
]


@pytest.mark.parametrize("rows, bucket, use_hash", [(1, 1, 0), (3, 4, 0), (5, 8, 1)])
def test_router_matches_reference(rows, bucket, use_hash):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(bucket, 7168, generator=g).to(torch.bfloat16)
    gate = (torch.randn(384, 7168, generator=g) * 0.02).to(torch.bfloat16)
    bias = torch.randn(384, generator=g) * 0.05
    hash_ids = torch.randint(0, 384, (bucket, 6), generator=g, dtype=torch.int32)
    ids = torch.full((bucket, 6), -7, dtype=torch.int32, device="cuda")
    weights = torch.zeros(bucket, 6, device="cuda")
    build = get("router").build(Spec(8, 4, 1024, bucket))
    build.launcher(x.cuda().flatten(), gate.cuda().flatten(), bias.cuda(), hash_ids.cuda().flatten(),
                   ids.view(-1), weights.view(-1), rows, use_hash)
    torch.cuda.synchronize()
    ref_ids, ref_w = route(x[:rows], gate, bias, hash_ids[:rows] if use_hash else None)
    # Logit sums run in another order than torch's: ids may swap only on near-ties.
    assert (ids[:rows].cpu() == ref_ids).float().mean() > 0.99
    torch.testing.assert_close(weights[:rows].cpu().sum(-1), torch.full((rows,), 2.5), rtol=1e-4, atol=1e-4)
    match = ids[:rows].cpu() == ref_ids
    torch.testing.assert_close(weights[:rows].cpu()[match], ref_w[match], rtol=2e-3, atol=2e-4)
    assert (ids[rows:].cpu() == -7).all(), "rows past m must stay untouched"


@pytest.mark.parametrize("ratio, width", [(4, 1024), (128, 256)])
def test_keytable_matches_reference(ratio, width):
    rows, bucket, per_page = 3, 4, 64
    g = torch.Generator().manual_seed(ratio)
    swa = torch.randint(-1, 5000, (bucket, 128), generator=g, dtype=torch.int32)
    lens = torch.tensor([128, 7, 1, 0], dtype=torch.int32)
    limit = 3 * per_page if ratio == 4 else 100000
    topk = torch.randint(-1, limit, (bucket, width), generator=g, dtype=torch.int32)
    req = torch.tensor([0, 1, 0, 1], dtype=torch.int32)
    table = torch.randint(0, 1000, (2, 3), generator=g, dtype=torch.int32)
    slots = torch.full((bucket, width + 128), -7, dtype=torch.int32, device="cuda")
    out_lens = torch.full((bucket,), -7, dtype=torch.int32, device="cuda")
    build = get("keytable").build(Spec(8, ratio, width, bucket))
    build.launcher(swa.cuda().flatten(), lens.cuda(), req.cuda(), topk.cuda().flatten(), table.cuda().flatten(),
                   slots.view(-1), out_lens, rows, table.shape[1], per_page)
    torch.cuda.synchronize()
    ref_slots, ref_lens = key_table(swa[:rows], lens[:rows], topk[:rows], ratio, req[:rows], table, per_page)
    assert torch.equal(out_lens[:rows].cpu(), ref_lens)
    assert torch.equal(slots[:rows].cpu(), ref_slots)
    assert (slots[rows:].cpu() == -7).all()
