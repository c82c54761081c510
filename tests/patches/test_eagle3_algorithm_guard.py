"""eagle3_algorithm_guard: EAGLE (or NEXTN) with an EAGLE-3 draft is refused at start with the flag."""

from __future__ import annotations

import pytest

from eagle3_patches.testing.isolation import run_isolated

pytestmark = pytest.mark.sglang


def _server_args_outcomes(target: str, draft: str, cases: list[str]):
    from eagle3_patches.testing import sglang_harness as h

    out = {}
    for algorithm in cases:
        try:
            sa = h.launcher_server_args(h.eagle3_server_args, target, draft, algorithm=algorithm)
            out[algorithm] = ("ok", sa.speculative_algorithm)
        except Exception as exc:  # noqa: BLE001
            out[algorithm] = (type(exc).__name__, str(exc))
    return out


@pytest.mark.stock
def test_stock_accepts_eagle_with_an_eagle3_draft(tiny):
    out = run_isolated(_server_args_outcomes, str(tiny["kimi_k25"]), str(tiny["draft"]), ["EAGLE"], patches=None)
    assert out["EAGLE"] == ("ok", "EAGLE")  # the silent misconfiguration


def test_guard_refuses_eagle_and_stays_silent_for_eagle3(tiny):
    out = run_isolated(_server_args_outcomes, str(tiny["kimi_k25"]), str(tiny["draft"]), ["EAGLE", "EAGLE3"],
                       patches=["eagle3_algorithm_guard"])
    kind, message = out["EAGLE"]
    assert kind == "Eagle3ConfigError"
    assert "--speculative-algorithm EAGLE3" in message and "LlamaForCausalLMEagle3" in message
    assert out["EAGLE3"] == ("ok", "EAGLE3")


def test_guard_upgrades_when_opted_in(tiny):
    out = run_isolated(_server_args_outcomes, str(tiny["kimi_k25"]), str(tiny["draft"]), ["EAGLE"],
                       patches=["eagle3_algorithm_guard"], env={"EAGLE3_PATCHES_UPGRADE_ALGORITHM": "1"})
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
