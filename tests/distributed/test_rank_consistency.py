"""rank_consistency: the ranks of one server compare their patch sets at model load (TP 2 over gloo on CPU).

A node started differently from the others is what a two-node Kimi-K2.5 deployment (TP 16) risks: here
rank 1 is started with another EAGLE3_PATCHES_DISABLE, or without eagle3-patches at all.
"""

from __future__ import annotations

import multiprocessing

import pytest

from eagle3_patches.selftest import PASSED
from eagle3_patches.selftest.checks import load_rank
from eagle3_patches.testing.isolation import _child, free_port, run_ranks

pytestmark = [pytest.mark.sglang, pytest.mark.tp2]


def _load(rank: int, world_size: int, port: int, target: str):
    return load_rank(rank, world_size, port, target, {})


def test_ranks_with_the_same_patch_set_start(tiny):
    out = run_ranks(_load, 2, str(tiny["deepseek_v3"]), patches="all")
    assert [r["error"] for r in out] == [None, None], out
    assert {r["states"]["rank_consistency"] for r in out} == {"applied"}


@pytest.fixture(scope="module")
def check(run_check):
    """The selftest check: two ranks, rank 1 started with EAGLE3_PATCHES_DISABLE=eagle3_fc_guard; with
    rank_consistency off on both (stock: nothing compares), then on."""
    return run_check("rank_consistency")


@pytest.mark.stock
def test_ranks_with_different_patch_sets_start_silently_without_the_check(check):
    assert [r["error"] for r in check.observations["stock"]] == [None, None]
    assert check.bug == "present"


def test_a_rank_with_another_patch_set_is_named_and_every_rank_refuses(check):
    assert check.status == PASSED, check.reason
    out = check.observations["patched"]
    assert [r["error"] for r in out] == ["Eagle3ConfigError", "Eagle3ConfigError"], out
    for r in out:
        assert (
            "eagle3_fc_guard" in r["message"]
            and "disabled on rank" in r["message"]
            and "applied on rank" in r["message"]
        )


def test_a_rank_without_eagle3_patches_is_named_instead_of_a_hang(tiny):
    """Rank 1 runs stock sglang: it never reports, rank 0 names it after the timeout.  (Rank 1 itself then
    waits in sglang's next collective for a peer that has stopped; the test ends it.)"""
    ctx = multiprocessing.get_context("spawn")
    port = free_port()
    results = ctx.Queue()
    procs = []
    for rank, patches in ((0, "all"), (1, None)):
        env = {"EAGLE3_PATCHES_RANK_CHECK_TIMEOUT": "10"}
        p = ctx.Process(target=_queue_result, args=(results, rank, port, str(tiny["deepseek_v3"]), patches, env))
        p.start()
        procs.append(p)
    try:
        got = results.get(timeout=300)
        while got["rank"] != 0:
            got = results.get(timeout=300)
    finally:
        for p in procs:
            p.kill()
            p.join()
    assert got["error"] == "Eagle3ConfigError", got
    assert "rank(s) [1]" in got["message"] and "run without eagle3-patches" in got["message"]


def _queue_result(queue, rank, port, target, patches, env):
    queue.put(_child(_load, (rank, 2, port, target), {}, True, patches, env))
