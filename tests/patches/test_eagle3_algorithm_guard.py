"""eagle3_algorithm_guard: EAGLE (or NEXTN) with an EAGLE-3 draft is refused at start with the flag."""

from __future__ import annotations

import pytest

from eagle3_patches.selftest import PASSED
from eagle3_patches.selftest.scenarios import launcher_outcomes
from eagle3_patches.testing.isolation import run_isolated

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def check(run_check):
    """The selftest check: EAGLE and EAGLE3 with the EAGLE-3 draft resolved as the launcher resolves them, stock
    and then with the patch set applied in the same process."""
    return run_check("eagle3_algorithm_guard")


@pytest.mark.stock
def test_stock_accepts_eagle_with_an_eagle3_draft(check):
    assert check.observations["stock"]["EAGLE"] == ("ok", "EAGLE")  # the silent misconfiguration
    assert check.bug == "present"


def test_guard_refuses_eagle_and_stays_silent_for_eagle3(check):
    assert check.status == PASSED, check.reason
    kind, message = check.observations["patched"]["EAGLE"]
    assert kind == "Eagle3ConfigError"
    assert "--speculative-algorithm EAGLE3" in message and "LlamaForCausalLMEagle3" in message
    assert check.observations["patched"]["EAGLE3"] == ("ok", "EAGLE3")


def test_guard_upgrades_when_opted_in(tiny):
    cases = {"EAGLE": (str(tiny["kimi_k25"]), str(tiny["draft"]), "EAGLE")}
    out = run_isolated(launcher_outcomes, cases, patches=["eagle3_algorithm_guard"],
                       env={"EAGLE3_PATCHES_UPGRADE_ALGORITHM": "1"})
    assert out["EAGLE"] == ("ok", "EAGLE3")


def test_draft_kind_evidence(tiny, tmp_path):
    """The detection the guard relies on: architecture, eagle_config, speculators type, fc width."""
    import json
    import shutil

    from eagle3_patches.checkpoint.draft_kind import eagle3_draft_evidence

    assert "LlamaForCausalLMEagle3" in eagle3_draft_evidence(tiny["draft"])
    assert "Eagle3DraftModel" in eagle3_draft_evidence(tiny["speculators_draft"])
    renamed = tmp_path / "renamed"
    shutil.copytree(tiny["draft"], renamed)
    cfg = json.loads((renamed / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLMEagle"]
    del cfg["eagle_config"]
    (renamed / "config.json").write_text(json.dumps(cfg))
    assert "3 x hidden" in eagle3_draft_evidence(renamed)
    assert eagle3_draft_evidence(tiny["deepseek_v3"]) is None  # not a draft
    assert eagle3_draft_evidence(tmp_path / "nowhere") is None
