"""Aux capture at tensor parallel 2 on CPU (gloo): identical across ranks, equal to TP 1."""

from __future__ import annotations

import pytest
import torch

from eagle3_patches.testing.isolation import run_isolated, run_ranks
from eagle3_patches.testing.tiny_models import DRAFT_AUX_IDS, HIDDEN

pytestmark = [pytest.mark.sglang, pytest.mark.tp2]

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12]]


def _capture(rank: int, world_size: int, port: int, target: str):
    import os

    from eagle3_patches.testing import sglang_harness as h

    sa = h.server_args(target, tp_size=world_size, dtype="float32")
    runner = h.model_runner(sa, tp_rank=rank, nccl_port=port)
    runner.model.set_eagle3_layers_to_capture(list(DRAFT_AUX_IDS))  # through the Kimi delegation patch
    step = h.prefill(runner, PROMPTS, return_hidden_states=True)
    return {
        "rank": rank,
        "pid": os.getpid(),
        "aux": step.logits_output.hidden_states.clone(),
        "tokens": step.next_token_ids.tolist(),
        "state": __import__("eagle3_patches").status()["kimi_k25_eagle3_delegation"].state.value,
    }


@pytest.fixture(scope="module")
def tp1(tiny):
    return run_isolated(_capture, 0, 1, 0, str(tiny["kimi_k25"]), patches="all")


@pytest.fixture(scope="module")
def tp2(tiny):
    return run_ranks(_capture, 2, str(tiny["kimi_k25"]), patches="all")


def test_tp2_ranks_capture_identical_3h_states_equal_to_tp1(tp1, tp2, figure):
    r0, r1 = tp2
    assert {r0["state"], r1["state"], tp1["state"]} == {"applied"}
    assert r0["pid"] != r1["pid"]
    assert r0["aux"].shape == r1["aux"].shape == tp1["aux"].shape == (8, 3 * HIDDEN)
    assert torch.equal(r0["aux"], r1["aux"])
    diff = (r0["aux"] - tp1["aux"]).abs().max().item()
    figure(f"TP 1 vs TP 2 aux hidden states (ranks {r0['pid']}, {r1['pid']}): max |diff| = {diff:.3g} (float32)")
    assert diff < 1e-4
    assert r0["tokens"] == r1["tokens"] == tp1["tokens"]
