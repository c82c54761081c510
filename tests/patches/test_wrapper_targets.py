"""Multimodal wrapper targets sglang cannot serve an EAGLE-3 draft with, made to work by a patch each:
``kimi_vl_eagle3_delegation`` (delegation to the language model: the mechanism Kimi-K2.5's patch uses) and
``qwen3_vl_eagle3_capture`` (hooks plus a forward that hands the aux states on: Qwen3-VL dense and MoE).

Tiny targets of each class (text prompts), the real ``TpModelWorker`` + EAGLE worker: stock fails at start,
the patch feeds the draft's ``fc`` ``[tokens, 3 x hidden]`` from the configured layers, and with the patch
disabled the launcher's capability guard refuses the launch naming it.
"""

from __future__ import annotations

import pytest
from support.releases import patch_applies

from eagle3_patches.testing import tiny_models as tm
from eagle3_patches.testing.isolation import run_isolated

pytestmark = pytest.mark.sglang
WRAPPERS = {  # name -> (patch, builder)
    "kimi-vl": ("kimi_vl_eagle3_delegation", lambda root: tm.build_kimi_vl(root / "tiny-kimi-vl")),
    "qwen3-vl": ("qwen3_vl_eagle3_capture", lambda root: _qwen3_vl(root, moe=False)),
    "qwen3-vl-moe": ("qwen3_vl_eagle3_capture", lambda root: _qwen3_vl(root, moe=True)),
}


def _qwen3_vl(root, moe: bool):
    from eagle3_patches.testing.tiny_vl_models import build_qwen3_vl

    return build_qwen3_vl(root / f"tiny-qwen3-vl-{'moe' if moe else 'dense'}", moe=moe)


@pytest.fixture(scope="module", params=sorted(WRAPPERS))
def wrapper(request, tiny_root):
    patch, build = WRAPPERS[request.param]
    if not patch_applies(patch):
        pytest.skip(f"{patch} does not apply to this sglang release (docs/targets.md)")
    return patch, str(build(tiny_root))


def _eagle3_prefill(target: str, draft: str) -> dict:
    """The selftest's scenario (eagle3_patches.selftest.scenarios), its outcome as the tests read it."""
    from eagle3_patches.selftest.scenarios import wrapper_eagle3_prefill

    try:
        return {"error": None, **wrapper_eagle3_prefill(target, draft)}
    except Exception as exc:  # noqa: BLE001 - returned to the test
        return {"error": f"{type(exc).__name__}: {exc}"}


@pytest.mark.stock
def test_stock_wrapper_cannot_serve_an_eagle3_draft(wrapper, tiny):
    _, target = wrapper
    out = run_isolated(_eagle3_prefill, target, str(tiny["draft"]), patches=None)
    assert out["error"] and any(
        hook in out["error"] for hook in ("set_eagle3_layers_to_capture", "get_embed_and_head")
    ), out


def test_patched_wrapper_feeds_3h_to_fc_from_the_configured_layers(wrapper, tiny, figure):
    patch, target = wrapper
    out = run_isolated(_eagle3_prefill, target, str(tiny["draft"]), patches=[patch, "eagle3_fc_guard"])
    assert out["error"] is None, out["error"]
    assert out["fc_inputs"] == [(5, 3 * tm.HIDDEN)]
    assert out["layers_to_capture"] == [i + 1 for i in tm.DRAFT_AUX_IDS]
    figure(f"{out['class']} (tiny, text prompt) with an EAGLE-3 draft ({patch}): fc input {out['fc_inputs'][0]}")


def _launch(target: str, draft: str) -> str | None:
    from eagle3_patches.testing import sglang_harness as h

    try:
        h.launcher_server_args(h.eagle3_server_args, target, draft)
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
    return None


@pytest.mark.runtime_only  # the fork path's copy of the guard knows no runtime patch (its fix names the way to one)
def test_the_capability_guard_names_the_patch_when_it_is_disabled(wrapper, tiny):
    patch, target = wrapper
    out = run_isolated(_launch, target, str(tiny["draft"]), patches="all", env={"EAGLE3_PATCHES_DISABLE": patch})
    assert out is not None and out.startswith("Eagle3TargetError") and patch in out
    assert run_isolated(_launch, target, str(tiny["draft"]), patches="all") is None  # silent with the patch on


def _default_capture(target: str, draft: str) -> dict:
    """The hook called without ids, as sglang calls it for a draft config without ids and before capturing CUDA
    graphs (model_runner.py): the layers the target then captures."""
    from eagle3_patches.testing import sglang_harness as h

    tw, _ = h.eagle_workers(h.eagle3_server_args(target, draft))
    model = tw.model_runner.model
    model.set_eagle3_layers_to_capture()
    captured = next(m.layers_to_capture for m in model.modules() if getattr(m, "layers_to_capture", None))
    return {"num_layers": model.config.num_hidden_layers, "layers_to_capture": list(captured)}


def test_qwen3_vl_without_ids_captures_the_upstream_defaults(tiny, tiny_root):
    """Without ids the patched Qwen3-VL captures what sglang 0.5.11's own hook does: [2, n // 2, n - 3]."""
    patch, build = WRAPPERS["qwen3-vl"]
    if not patch_applies(patch):
        pytest.skip(f"{patch} does not apply to this sglang release (docs/targets.md)")
    out = run_isolated(_default_capture, str(build(tiny_root)), str(tiny["draft"]), patches=[patch])
    n = out["num_layers"]
    assert n == tm.NUM_LAYERS and out["layers_to_capture"] == [2, n // 2, n - 3]


def _qwen3_vl_check_on_an_edited_release(edit: str) -> dict:
    import importlib

    from eagle3_patches.patches.qwen3_vl_eagle3_capture import PATCH
    from eagle3_patches.registry import NotApplicable

    module = importlib.import_module(PATCH.module)
    PATCH.check(module)  # the release as installed: the patch fits
    if edit == "inherited":  # Qwen3LLMModel inherits Qwen3Model's forward instead of defining its own
        del module.Qwen3LLMModel.forward
    else:  # the wrapper's forward rewritten: no multimodal embedding routine, the logits computed elsewhere

        def forward(self, input_ids, positions, forward_batch, **kwargs):
            return self.model(input_ids, positions, forward_batch)

        module.Qwen3VLForConditionalGeneration.forward = forward
    try:
        PATCH.check(module)
    except NotApplicable as exc:
        return {"refused": str(exc)}
    return {"refused": None}


@pytest.mark.parametrize(
    "edit, refusal",
    [
        ("inherited", "Qwen3LLMModel.forward does not exist"),
        ("rewritten", "no longer contains 'general_mm_embed_routine'"),
    ],
)
def test_qwen3_vl_patch_refuses_a_release_whose_forwards_it_was_not_written_for(edit, refusal):
    """The patch's check refuses a tree whose ``Qwen3LLMModel`` has no ``forward`` of its own, or whose wrapper
    ``forward`` no longer runs the multimodal embedding and the logits processor, naming what is missing: the patch
    is then not applicable (sglang left untouched) instead of wrapping a forward it was not written for."""
    if not patch_applies("qwen3_vl_eagle3_capture"):
        pytest.skip("qwen3_vl_eagle3_capture does not apply to this sglang release (docs/targets.md)")
    out = run_isolated(_qwen3_vl_check_on_an_edited_release, edit)
    assert out["refused"] is not None and out["refused"].endswith(refusal), out
