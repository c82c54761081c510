"""eagle3_target_capability: a target that cannot capture is refused once, in the launcher."""

from __future__ import annotations

import pytest

from eagle3_patches.testing.isolation import run_isolated
from eagle3_patches.testing.releases import stock_bug

pytestmark = pytest.mark.sglang


def _server_args_outcomes(cases: dict):
    from eagle3_patches.testing import sglang_harness as h

    out = {}
    for name, (target, draft) in cases.items():
        try:
            h.launcher_server_args(h.eagle3_server_args, target, draft)
            out[name] = ("ok", None)
        except Exception as exc:  # noqa: BLE001
            out[name] = (type(exc).__name__, str(exc))
    return out


@pytest.fixture(scope="module")
def cases(tiny):
    return {"kimi": (str(tiny["kimi_k25"]), str(tiny["draft"])), "deepseek": (str(tiny["deepseek_v3"]), str(tiny["draft"]))}


@pytest.mark.runtime_only
@stock_bug("kimi_k25_eagle3_delegation")  # from 0.5.10 the Kimi class has the hooks itself
def test_kimi_without_the_delegation_is_refused_in_the_launcher(cases):
    out = run_isolated(_server_args_outcomes, cases, patches="all",
                       env={"EAGLE3_PATCHES_DISABLE": "kimi_k25_eagle3_delegation"})
    kind, message = out["kimi"]
    assert kind == "Eagle3TargetError"
    assert "KimiK25ForConditionalGeneration" in message and "set_eagle3_layers_to_capture" in message
    assert "kimi_k25_eagle3_delegation" in message  # the fix
    assert out["deepseek"] == ("ok", None)


def test_targets_that_can_capture_pass_silently(cases):
    out = run_isolated(_server_args_outcomes, cases, patches="all")
    assert out == {"kimi": ("ok", None), "deepseek": ("ok", None)}


@pytest.mark.stock
@stock_bug("kimi_k25_eagle3_delegation")
def test_stock_accepts_the_kimi_target_and_fails_later_in_each_rank(cases):
    """Stock 0.5.9 lets ServerArgs through; the AttributeError comes per rank (tests/sglang, tests/distributed)."""
    assert run_isolated(_server_args_outcomes, cases, patches=None)["kimi"] == ("ok", None)
