"""dp_attention_aux_gather: with DP attention and an all-to-all MoE backend, the captured aux states are gathered over
the attention-TP group (sglang 0.5.10's), not the whole TP group."""

from __future__ import annotations

import pytest

from eagle3_patches.diagnostic import ERROR, INFO
from eagle3_patches.doctor import doctor
from eagle3_patches.selftest import PASSED
from eagle3_patches.testing.releases import requires_patch
from eagle3_patches.testing.tiny_models import HIDDEN

TOKENS = 5  # the scenario's prompt


@pytest.fixture(scope="module")
def check(run_check):
    """The selftest check: a capturing prefill with TP 2 and DP attention 2 emulated, stock then patched."""
    return run_check("dp_attention_aux_gather")


@pytest.mark.sglang
@pytest.mark.stock
@requires_patch("dp_attention_aux_gather")
def test_stock_stores_another_ranks_tokens_for_the_draft(check):
    assert check.observations["stock"] == ("ok", (2 * TOKENS, 3 * HIDDEN))
    assert check.bug == "present"


@pytest.mark.sglang
@requires_patch("dp_attention_aux_gather")
def test_patched_stores_this_ranks_tokens_only(check):
    assert check.status == PASSED, check.reason
    assert check.observations["patched"] == ("ok", (TOKENS, 3 * HIDDEN))


#: Kimi-K2.5's production flags at scale: DP attention with expert parallelism over DeepEP
A2A_DP = "--speculative-algorithm EAGLE3 --tp-size 2 --enable-dp-attention --dp-size 2 --moe-a2a-backend deepep"
CODE = "dp-attention-a2a-aux-rows"


@pytest.mark.parametrize("backend", ["deepep", "mooncake"])
def test_the_doctor_flags_the_launch_on_stock_0_5_9(tiny, backend):
    r = doctor(tiny["deepseek_v3"], tiny["draft"], sglang_version="0.5.9", launch=A2A_DP.replace("deepep", backend))
    assert CODE in r.codes(ERROR), r.format()
    assert "upgrade to sglang >= 0.5.10" in r.format() and "eagle3-patches run" in r.format()


def test_the_doctor_notes_the_fix_with_the_patch(tiny):
    r = doctor(tiny["deepseek_v3"], tiny["draft"], sglang_version="0.5.9", launch=A2A_DP, with_patches=True)
    assert CODE in r.codes(INFO) and CODE not in r.codes(ERROR), r.format()
    assert "fixed by eagle3-patches' dp_attention_aux_gather" in r.format()


@pytest.mark.parametrize(
    "version, launch",
    [
        ("0.5.10", A2A_DP),  # gathered over the attention-TP group
        ("0.5.9", A2A_DP.replace(" --enable-dp-attention --dp-size 2", "")),  # the attention-TP group is the TP group
        ("0.5.9", A2A_DP.replace("deepep", "none")),  # nothing gathered
        ("0.5.9", A2A_DP.replace("EAGLE3", "STANDALONE")),  # nothing captured
    ],
)
def test_the_doctor_is_silent_where_the_rows_are_right(tiny, version, launch):
    r = doctor(tiny["deepseek_v3"], tiny["draft"], sglang_version=version, launch=launch)
    assert CODE not in r.codes(), r.format()
