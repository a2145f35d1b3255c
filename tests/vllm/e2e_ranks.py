"""The end-to-end tests' eight rank processes (e2e_rank.py) and layer_math's view of what each
layer got: shared by test_e2e_layer.py (reference backend) and test_e2e_layer_emulated.py (the
code objects on one emulated device a process)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from e2e_world import ACTIVE, KV_BLOCK, LAYERS
from layer_math import LayerStep

from mono_jit import deepseek_v4

HERE = Path(__file__).resolve().parent
RANKS = 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(out: Path, timeout: float, **environ: str) -> list[dict]:
    """The 8 rank processes' records, after they all ended (`environ` added to each one's
    environment, every MONO_JIT_* of the caller's dropped); the test fails with the first failed
    rank's log."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONO_JIT_")} | environ
    logs = [open(out / f"rank{r}.log", "w") for r in range(RANKS)]
    procs = [subprocess.Popen([sys.executable, str(HERE / "e2e_rank.py"), str(r), str(port), str(out)],
                              stdout=logs[r], stderr=subprocess.STDOUT, env=env) for r in range(RANKS)]
    try:
        codes = [p.wait(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            p.kill()
        for f in logs:
            f.close()
    failed = [r for r, code in enumerate(codes) if code != 0]
    if failed:
        tail = (out / f"rank{failed[0]}.log").read_text()[-4000:]
        pytest.fail(f"ranks {failed} failed; rank {failed[0]}'s log ends:\n{tail}")
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(RANKS)]


def layer_step(step: dict, entry: dict) -> LayerStep:
    """layer_math's view of what one layer got from vLLM's hook (rank 0's record)."""
    md, (x, residual, post_mix, res_mix) = entry["metadata"], entry["inputs"]
    rows, first = step["plan"].rows, residual is None
    topk = md["topk"]
    csa = md["comp_block"] == KV_BLOCK // deepseek_v4.CSA_RATIO  # records a compressed page: 64 CSA, 2 HCA
    if not csa:  # HCA: the live rows' slots at vLLM's active width, -1 for pad rows
        assert topk.shape[1] == ACTIVE
        padded = torch.full((rows, topk.shape[1]), -1, dtype=torch.int32)
        padded[:topk.shape[0]] = topk
        topk = padded
    route = md["route_ids"][step["input_ids"][:rows].long()] if md["route_ids"] is not None else None
    return LayerStep(
        x=None if first else x, residual=x if first else residual, post_mix=post_mix, res_mix=res_mix,
        positions=step["positions"], slot_mapping=md["slot_mapping"], swa_cache=entry["swa_before"],
        swa_page_stride=md["swa_page_stride"], swa_block=md["swa_block"], swa_indices=md["swa_indices"],
        swa_lens=md["swa_lens"], topk=topk, token_req=md["token_req"] if csa else None,
        block_table=md["block_table"] if csa else None, entries_per_page=md["comp_block"] if csa else None,
        comp_cache=entry["comp_after"], comp_page_stride=md["comp_page_stride"], comp_block=md["comp_block"],
        route_ids=route)


def assert_same_bits_on_every_rank(ranks: list[dict]) -> None:
    """Every layer's outputs of every step equal rank 0's, bit for bit, on every rank."""
    for rank in ranks[1:]:
        for mine, theirs in zip(ranks[0]["steps"].values(), rank["steps"].values()):
            for i in LAYERS:
                assert all(torch.equal(a, b) for a, b in zip(mine["layers"][i]["out"], theirs["layers"][i]["out"]))
