"""qwen3_vl_eagle3_capture: EAGLE-3 on Qwen3-VL targets before sglang 0.5.11.

Real sglang ``TpModelWorker`` + EAGLE worker on tiny Qwen3-VL targets (dense and MoE, built with
transformers' own classes; text prompts): stock fails at start, the patch feeds the draft's ``fc``
``[tokens, 3 x hidden]`` and the layers it captures are the configured ones.
"""

from __future__ import annotations

import pytest

from eagle3_patches.testing import tiny_models as tm
from eagle3_patches.testing.isolation import run_isolated
from eagle3_patches.testing.releases import requires_patch, stock_bug

pytestmark = pytest.mark.sglang
PATCHES = ["qwen3_vl_eagle3_capture", "eagle3_fc_guard", "eagle3_draft_strict_loading"]


@pytest.fixture(scope="module", params=["dense", "moe"])
def qwen3_vl(request, tiny_root):
    from eagle3_patches.testing.tiny_vl_models import build_qwen3_vl

    return build_qwen3_vl(tiny_root / f"tiny-qwen3-vl-{request.param}", moe=request.param == "moe")


def _eagle3_prefill(target: str, draft: str) -> dict:
    from eagle3_patches.testing import sglang_harness as h

    sa = h.eagle3_server_args(target, draft)
    try:
        tw, dw = h.eagle_workers(sa)
    except Exception as exc:  # noqa: BLE001 - returned to the test
        return {"error": f"{type(exc).__name__}: {exc}"}
    fc_inputs = h.record_fc_inputs(dw)
    model = tw.model_runner.model
    result, _ = h.eagle_prefill(tw, dw, [[5, 6, 7, 8, 9]])
    return {"error": None, "class": type(model).__name__, "fc_inputs": fc_inputs,
            "layers_to_capture": list(model.model.layers_to_capture), "tokens": result.next_token_ids.tolist()}


@pytest.mark.stock
@stock_bug("qwen3_vl_eagle3_capture")
def test_stock_qwen3_vl_cannot_serve_an_eagle3_draft(qwen3_vl, tiny):
    out = run_isolated(_eagle3_prefill, str(qwen3_vl), str(tiny["draft"]), patches=None)
    assert out["error"] and "set_eagle3_layers_to_capture" in out["error"], out


@requires_patch("qwen3_vl_eagle3_capture")
def test_patched_qwen3_vl_feeds_3h_to_fc_from_the_configured_layers(qwen3_vl, tiny, figure):
    out = run_isolated(_eagle3_prefill, str(qwen3_vl), str(tiny["draft"]), patches=PATCHES)
    assert out["error"] is None, out["error"]
    assert out["fc_inputs"] == [(5, 3 * tm.HIDDEN)]
    assert out["layers_to_capture"] == [i + 1 for i in tm.DRAFT_AUX_IDS]
    figure(f"{out['class']} (tiny, text prompt) with an EAGLE-3 draft: fc input {out['fc_inputs'][0]}")


def _launch(target: str, draft: str) -> str | None:
    from eagle3_patches.testing import sglang_harness as h

    try:
        h.launcher_server_args(h.eagle3_server_args, target, draft)
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
    return None


def test_the_capability_guard_names_the_patch_when_it_is_disabled(qwen3_vl, tiny):
    out = run_isolated(_launch, str(qwen3_vl), str(tiny["draft"]), patches="all",
                       env={"EAGLE3_PATCHES_DISABLE": "qwen3_vl_eagle3_capture"})
    from eagle3_patches.testing.releases import patch_applies

    if patch_applies("qwen3_vl_eagle3_capture"):
        assert out.startswith("Eagle3TargetError") and "qwen3_vl_eagle3_capture" in out
    else:
        assert out is None  # the release's own Qwen3-VL captures
