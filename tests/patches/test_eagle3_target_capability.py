"""eagle3_target_capability: a target that cannot capture is refused once, in the launcher.

The selftest check ``eagle3_target_capability`` resolves the flags stock and then with the patch set applied, for
a config-only GPT-2 target (a real sglang model class without the capture hooks, on every release) and the tiny
Kimi-K2.5 and DeepSeek-V3 targets.
"""

from __future__ import annotations

import pytest

from eagle3_patches.selftest import PASSED
from eagle3_patches.selftest.scenarios import launcher_outcomes
from eagle3_patches.testing.isolation import run_isolated
from eagle3_patches.testing.releases import stock_bug

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def check(run_check):
    return run_check("eagle3_target_capability")


@pytest.fixture(scope="module")
def cases(tiny):
    return {"kimi": (str(tiny["kimi_k25"]), str(tiny["draft"]), "EAGLE3"),
            "deepseek": (str(tiny["deepseek_v3"]), str(tiny["draft"]), "EAGLE3")}


@pytest.mark.stock
def test_stock_accepts_a_target_that_cannot_capture(check):
    """Nothing in sglang checks the target class at start: the launcher resolves EAGLE3 for GPT-2."""
    assert check.observations["stock"]["missing"]["no_capture"] == ["set_eagle3_layers_to_capture", "get_embed_and_head"]
    assert check.observations["stock"]["outcomes"]["no_capture"] == ("ok", "EAGLE3")
    assert check.bug == "present"


def test_a_target_that_cannot_capture_is_refused_and_capable_ones_pass_silently(check):
    assert check.status == PASSED, check.reason
    outcomes = check.observations["patched"]["outcomes"]
    kind, message = outcomes["no_capture"]
    assert kind in ("Eagle3TargetError", "Eagle3ConfigError")  # the second: the fork-path diff's own class
    assert "GPT2LMHeadModel" in message and "set_eagle3_layers_to_capture" in message
    assert outcomes["kimi"] == outcomes["deepseek"] == ("ok", "EAGLE3")


@pytest.mark.runtime_only
@stock_bug("kimi_k25_eagle3_delegation")  # from 0.5.10 the Kimi class has the hooks itself
def test_kimi_without_the_delegation_is_refused_in_the_launcher(cases):
    out = run_isolated(launcher_outcomes, cases, patches="all",
                       env={"EAGLE3_PATCHES_DISABLE": "kimi_k25_eagle3_delegation"})
    kind, message = out["kimi"]
    assert kind == "Eagle3TargetError"
    assert "KimiK25ForConditionalGeneration" in message and "set_eagle3_layers_to_capture" in message
    assert "kimi_k25_eagle3_delegation" in message  # the fix
    assert out["deepseek"] == ("ok", "EAGLE3")


@pytest.mark.stock
@stock_bug("kimi_k25_eagle3_delegation")
def test_stock_accepts_the_kimi_target_and_fails_later_in_each_rank(check):
    """Stock 0.5.9 lets ServerArgs through; the AttributeError comes per rank (tests/sglang, tests/distributed)."""
    assert check.observations["stock"]["outcomes"]["kimi"] == ("ok", "EAGLE3")
    assert check.observations["stock"]["missing"]["kimi"] == ["set_eagle3_layers_to_capture", "get_embed_and_head"]
