"""kimi_k25_eagle3_delegation, through the real TpModelWorker + EAGLEWorker on the tiny Kimi-K2.5.

The stock and patched runs are the selftest check ``kimi_k25_eagle3_delegation`` (eagle3_patches/selftest).
"""

from __future__ import annotations

import pytest
from support.releases import expected_state, requires_patch, stock_bug

from eagle3_patches.selftest import PASSED
from eagle3_patches.selftest.scenarios import eagle_prefill_fc_widths
from eagle3_patches.testing.isolation import run_isolated
from eagle3_patches.testing.tiny_models import DRAFT_AUX_IDS, HIDDEN

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def check(run_check):
    return run_check("kimi_k25_eagle3_delegation")


def test_patched_kimi_eagle3_feeds_3h_to_fc(check):
    assert check.status == PASSED, check.reason
    patched = check.observations["patched"]
    # runtime patch (0.5.9), the fork-path diff, or upstream (0.5.10+: sglang delegates itself)
    assert patched.value["state"] in (expected_state("kimi_k25_eagle3_delegation"), "in-source")
    assert patched.value["layers_to_capture"] == [i + 1 for i in DRAFT_AUX_IDS]
    assert patched.value["target_width"] == (8, 3 * HIDDEN)
    assert patched.value["fc_inputs"] == [(8, 3 * HIDDEN)]


@pytest.mark.stock
@stock_bug("kimi_k25_eagle3_delegation")
def test_stock_kimi_eagle3_fails_at_start(check):
    stock = check.observations["stock"]
    assert stock.kind == "AttributeError" and "set_eagle3_layers_to_capture" in stock.value
    assert (check.bug, check.needed) == ("present", True)


@pytest.mark.stock
@stock_bug("kimi_k25_eagle3_delegation")
def test_reverted_kimi_eagle3_fails_at_start_as_stock(tiny):
    with pytest.raises(AttributeError, match="set_eagle3_layers_to_capture"):
        run_isolated(eagle_prefill_fc_widths, str(tiny["kimi_k25"]), str(tiny["draft"]), True, patches="all")


def _next_token_with_a_swapped_head(target: str, draft: str) -> dict:
    """The target's greedy next token, then again after ``set_embed_and_head`` hands it a head whose rows for that
    token and another are swapped (what sglang does with a model's embedding and head when it shares them)."""
    import torch

    from eagle3_patches.testing import sglang_harness as h

    runner = h.model_runner(h.eagle3_server_args(target, draft))
    prompt = [[5, 6, 7, 8]]
    before = int(h.prefill(runner, prompt).next_token_ids[0])
    embed, head = runner.model.get_embed_and_head()
    other = (before + 1) % head.shape[0]
    swapped = head.detach().clone()
    swapped[[before, other]] = swapped[[other, before]]
    # sglang's DeepseekV2ForCausalLM.set_embed_and_head ends with torch.cuda.synchronize(), which a CPU build of
    # torch refuses; on CPU there is nothing to wait for
    torch.cuda.synchronize = lambda *args, **kwargs: None
    runner.model.set_embed_and_head(embed, torch.nn.Parameter(swapped, requires_grad=False))
    after = int(h.prefill(runner, prompt).next_token_ids[0])
    return {
        "before": before,
        "other": other,
        "after": after,
        "head_is_the_new_one": runner.model.get_embed_and_head()[1].data_ptr() == swapped.data_ptr(),
    }


@requires_patch("kimi_k25_eagle3_delegation")
def test_patched_kimi_target_serves_with_the_embed_and_head_it_is_given(tiny):
    """All three hooks work on the patched Kimi-K2.5, set_embed_and_head included: the target's next token follows
    the head it was handed."""
    out = run_isolated(
        _next_token_with_a_swapped_head,
        str(tiny["kimi_k25"]),
        str(tiny["draft"]),
        patches=["kimi_k25_eagle3_delegation"],
    )
    assert out["head_is_the_new_one"]
    assert out["after"] == out["other"] != out["before"]


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


@pytest.mark.parametrize("algorithm", [None, "EAGLE", "EAGLE3", "NEXTN"])
def test_doctor_names_the_missing_hooks_for_every_speculative_launch_on_0_5_9(tiny, algorithm):
    """Each algorithm whose worker calls the hooks fails at start on stock 0.5.9, which the doctor says, pointing at
    the target's top-level architectures; serving without speculative decoding, or on 0.5.10, needs no delegation."""
    from eagle3_patches.doctor import doctor

    launch = ["python", "-m", "sglang.launch_server", "--model-path", str(tiny["kimi_k25"])]
    if algorithm:
        launch += ["--speculative-algorithm", algorithm, "--speculative-draft-model-path", str(tiny["draft"])]
    found = [f for f in doctor(launch=launch, sglang_version="0.5.9").findings if f.code == "kimi-k25-delegation"]
    if algorithm is None:
        assert found == []
        return
    (finding,) = found
    assert finding.severity == "error" and "AttributeError" in finding.what
    assert finding.where == f"{tiny['kimi_k25'] / 'config.json'}: architectures"
    assert "kimi-k25-delegation" not in doctor(launch=launch, sglang_version="0.5.10").codes()


def test_status_on_a_release_that_delegates_itself_names_the_release():
    """On sglang >= 0.5.10 the class has the hooks; the patch reports `upstream` with the release that fixed it.
    (sglang 0.5.10 is not installed here: a class of the shape it has stands in for its kimi_k25 module.)"""
    import types

    from eagle3_patches.patches.kimi_k25_eagle3_delegation import PATCH

    class KimiK25ForConditionalGeneration:
        def set_eagle3_layers_to_capture(self, layer_ids=None):
            pass

    fixed = types.ModuleType("sglang.srt.models.kimi_k25")
    fixed.KimiK25ForConditionalGeneration = KimiK25ForConditionalGeneration
    assert PATCH.upstream(fixed) == (
        "KimiK25ForConditionalGeneration defines set_eagle3_layers_to_capture itself (sglang >= 0.5.10)"
    )
