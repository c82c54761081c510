"""kimi_k25_eagle3_delegation, through the real TpModelWorker + EAGLEWorker on the tiny Kimi-K2.5."""

from __future__ import annotations

import pytest

from eagle3_patches.testing.isolation import run_isolated
from eagle3_patches.testing.releases import expected_state, requires_patch, stock_bug
from eagle3_patches.testing.tiny_models import DRAFT_AUX_IDS, HIDDEN

pytestmark = pytest.mark.sglang


def _eagle_prefill_fc_widths(target: str, draft: str, revert_first: bool = False):
    import eagle3_patches
    from eagle3_patches.testing import sglang_harness as h

    if revert_first:
        eagle3_patches.revert()
    sa = h.eagle3_server_args(target, draft)
    tw, dw = h.eagle_workers(sa)
    fc_inputs = h.record_fc_inputs(dw)
    result, _ = h.eagle_prefill(tw, dw, [[5, 6, 7, 8, 9], [10, 11, 12]])
    lm = tw.model_runner.model.language_model.model
    return {
        "fc_inputs": fc_inputs,
        "target_width": tuple(result.logits_output.hidden_states.shape),
        "layers_to_capture": list(lm.layers_to_capture),
        "state": eagle3_patches.status()["kimi_k25_eagle3_delegation"].state.value,
    }


def test_patched_kimi_eagle3_feeds_3h_to_fc(tiny):
    out = run_isolated(_eagle_prefill_fc_widths, str(tiny["kimi_k25"]), str(tiny["draft"]), patches="all")
    # runtime patch (0.5.9), the fork-path diff, or upstream (0.5.10+: sglang delegates itself)
    assert out["state"] in (expected_state("kimi_k25_eagle3_delegation"), "in-source")
    assert out["layers_to_capture"] == [i + 1 for i in DRAFT_AUX_IDS]
    assert out["target_width"] == (8, 3 * HIDDEN)
    assert out["fc_inputs"] == [(8, 3 * HIDDEN)]


@pytest.mark.stock
@stock_bug("kimi_k25_eagle3_delegation")
def test_reverted_kimi_eagle3_fails_at_start_as_stock(tiny):
    with pytest.raises(AttributeError, match="set_eagle3_layers_to_capture"):
        run_isolated(_eagle_prefill_fc_widths, str(tiny["kimi_k25"]), str(tiny["draft"]), True, patches="all")


def _language_model_without_capture():
    import torch
    from sglang.srt.models.kimi_k25 import KimiK25ForConditionalGeneration

    import eagle3_patches

    model = KimiK25ForConditionalGeneration.__new__(KimiK25ForConditionalGeneration)
    torch.nn.Module.__init__(model)
    model.language_model = torch.nn.Linear(2, 2)  # a language model that cannot capture
    try:
        model.set_eagle3_layers_to_capture([1, 2, 3])
    except eagle3_patches.Eagle3TargetError as exc:
        return str(exc)
    return None


@pytest.mark.runtime_only
@requires_patch("kimi_k25_eagle3_delegation")
def test_delegation_raises_clearly_when_language_model_cannot_capture():
    message = run_isolated(_language_model_without_capture, patches=["kimi_k25_eagle3_delegation"])
    assert message is not None
    assert "set_eagle3_layers_to_capture" in message and "Linear" in message and "fix:" in message
