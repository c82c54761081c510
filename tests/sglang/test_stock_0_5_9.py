"""Stock sglang 0.5.9 on CPU, no EAGLE-3 patches: what works and the Kimi bug, pinned."""

from __future__ import annotations

import pytest
from support.releases import stock_bug

from eagle3_patches.testing.isolation import run_isolated
from eagle3_patches.testing.tiny_models import DRAFT_AUX_IDS, HIDDEN

pytestmark = pytest.mark.sglang


def _deepseek_eagle3_prefill_and_decode(target: str, draft: str):
    from eagle3_patches.testing import sglang_harness as h

    sa = h.eagle3_server_args(target, draft)
    sa.attention_backend = "torch_native"  # the target alone runs on torch_native (faster than interpreted triton)
    runner = h.model_runner(sa)
    layers = list(runner.model.model.layers_to_capture)
    step = h.prefill(runner, [[5, 6, 7, 8, 9], [10, 11, 12]], return_hidden_states=True)
    dec = h.decode(runner, step)
    return {
        "layers_to_capture": layers,
        "prefill_width": tuple(step.logits_output.hidden_states.shape),
        "decode_tokens": dec.next_token_ids.tolist(),
    }


def test_deepseek_v3_eagle3_prefill_captures_3h_and_decode_runs(tiny):
    out = run_isolated(_deepseek_eagle3_prefill_and_decode, str(tiny["deepseek_v3"]), str(tiny["draft"]))
    # 0.5.9 captures before layer id+1, i.e. the outputs of layers 1, 2, 3
    assert out["layers_to_capture"] == [i + 1 for i in DRAFT_AUX_IDS]
    assert out["prefill_width"] == (8, len(DRAFT_AUX_IDS) * HIDDEN)
    assert len(out["decode_tokens"]) == 2


def _kimi_plain_prefill_and_decode(target: str):
    from eagle3_patches.testing import sglang_harness as h

    runner = h.model_runner(h.server_args(target))
    step = h.prefill(runner, [[5, 6, 7, 8, 9]])
    dec = h.decode(runner, step)
    return type(runner.model).__name__, step.next_token_ids.tolist(), dec.next_token_ids.tolist()


def test_kimi_k25_without_speculation_prefill_and_decode(tiny):
    arch, first, second = run_isolated(_kimi_plain_prefill_and_decode, str(tiny["kimi_k25"]))
    assert arch == "KimiK25ForConditionalGeneration"
    assert len(first) == 1 and len(second) == 1
    assert all(0 <= t < 1024 for t in first + second)


def _kimi_eagle3_workers(target: str, draft: str):
    from eagle3_patches.testing import sglang_harness as h

    h.eagle_workers(h.eagle3_server_args(target, draft))


@stock_bug("kimi_k25_eagle3_delegation")
def test_kimi_k25_eagle3_fails_at_start_on_stock_0_5_9(tiny):
    """The bug, pinned: this test fails the day a release delegates (then see docs/compat.md)."""
    with pytest.raises(AttributeError, match="KimiK25ForConditionalGeneration.*set_eagle3_layers_to_capture"):
        run_isolated(_kimi_eagle3_workers, str(tiny["kimi_k25"]), str(tiny["draft"]), patches=None)
