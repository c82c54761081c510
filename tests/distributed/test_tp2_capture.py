"""Aux capture at tensor parallel 2 on CPU (gloo): identical across ranks, equal to TP 1."""

from __future__ import annotations

import pytest
import torch

from eagle3_patches.selftest.device_scenarios import tp_capture
from eagle3_patches.testing.isolation import run_isolated, run_ranks
from eagle3_patches.testing.tiny_models import HIDDEN

pytestmark = [pytest.mark.sglang, pytest.mark.tp2]


def _capture(rank: int, world_size: int, port: int, target: str):
    return tp_capture(rank, world_size, port, target, {"dtype": "float32"})  # through the Kimi delegation patch


@pytest.fixture(scope="module")
def tp1(tiny):
    return run_isolated(_capture, 0, 1, 0, str(tiny["kimi_k25"]), patches="all")


@pytest.fixture(scope="module")
def tp2(tiny):
    return run_ranks(_capture, 2, str(tiny["kimi_k25"]), patches="all")


def test_tp2_ranks_capture_identical_3h_states_equal_to_tp1(tp1, tp2, figure):
    r0, r1 = tp2
    assert {r["states"]["kimi_k25_eagle3_delegation"] for r in (r0, r1, tp1)} == {"applied"}
    assert r0["pid"] != r1["pid"]
    assert r0["aux"].shape == r1["aux"].shape == tp1["aux"].shape == (8, 3 * HIDDEN)
    assert torch.equal(r0["aux"], r1["aux"])
    diff = (r0["aux"] - tp1["aux"]).abs().max().item()
    figure(f"TP 1 vs TP 2 aux hidden states (ranks {r0['pid']}, {r1['pid']}): max |diff| = {diff:.3g} (float32)")
    assert diff < 1e-4
    assert r0["tokens"] == r1["tokens"] == tp1["tokens"]
