"""dp_attention_aux_gather: with DP attention and an all-to-all MoE backend, the captured aux states are gathered over
the attention-TP group (sglang 0.5.10's), not the whole TP group."""

from __future__ import annotations

import pytest
from support.releases import requires_patch

from eagle3_patches.diagnostic import ERROR, INFO
from eagle3_patches.doctor import doctor
from eagle3_patches.selftest import PASSED
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
    """The emulated TP group of two is the group itself (``parallel_state._TP``): a patch that gathers over the TP
    group by another name (``get_tp_group()``, stock 0.5.9's group) stores both ranks' rows and fails here."""
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


def _module_calling_the_gather(tmp_path, calls: int):
    """A module shaped as 0.5.9's deepseek_v2 (the capture's gather under ``enable_a2a_moe``), calling the gather
    ``calls`` times in all."""
    import importlib.util

    extra = "".join(
        f"\n\ndef other_{i}(x):\n    return tensor_model_parallel_all_gather(x)\n" for i in range(calls - 1)
    )
    path = tmp_path / f"deepseek_v2_{calls}.py"
    path.write_text(
        "from operator import getitem as tensor_model_parallel_all_gather  # imported, as sglang's is\n\n\n"
        "class DeepseekV2Model:\n    def forward(self, x):\n        if self.enable_a2a_moe:\n"
        "            return tensor_model_parallel_all_gather(x, dim=0)\n        return x\n" + extra
    )
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_check_refuses_a_module_that_gathers_elsewhere_too(tmp_path):
    """Rebinding the module's gather is exact only while the capture is its one caller."""
    from eagle3_patches.patches.dp_attention_aux_gather import PATCH
    from eagle3_patches.registry import NotApplicable

    PATCH.check(_module_calling_the_gather(tmp_path, 1))
    with pytest.raises(NotApplicable, match="calls tensor_model_parallel_all_gather 2 times"):
        PATCH.check(_module_calling_the_gather(tmp_path, 2))


def _module(tmp_path, name: str, text: str):
    import importlib.util

    path = tmp_path / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_check_refuses_a_module_whose_forward_does_not_gather_the_capture(tmp_path):
    """One call of the gather, but not in the capture: rebinding it would change something else."""
    from eagle3_patches.patches.dp_attention_aux_gather import PATCH
    from eagle3_patches.registry import NotApplicable

    module = _module(
        tmp_path,
        "deepseek_v2_elsewhere",
        "from operator import getitem as tensor_model_parallel_all_gather\n\n\n"
        "class DeepseekV2Model:\n    def forward(self, x):\n        if self.enable_a2a_moe:\n            return x\n"
        "        return x\n\n\ndef other(x):\n    return tensor_model_parallel_all_gather(x, 0)\n",
    )
    with pytest.raises(NotApplicable):
        PATCH.check(module)


def test_status_says_upstream_where_forward_gathers_over_the_attention_tp_group(tmp_path):
    """sglang 0.5.10's forward (the upstream fix) is named; 0.5.9's is not."""
    from eagle3_patches.patches.dp_attention_aux_gather import PATCH

    fixed = _module(
        tmp_path,
        "deepseek_v2_fixed",
        "class DeepseekV2Model:\n    def forward(self, x):\n"
        "        return get_attention_tp_group().all_gather(x, dim=0)\n",
    )
    assert "attention-TP group" in PATCH.upstream(fixed)
    assert PATCH.upstream(_module_calling_the_gather(tmp_path, 1)) is None
    assert PATCH.upstream(_module(tmp_path, "no_model", "x = 1\n")) is None


def test_the_patched_gather_gathers_the_tokens_along_the_dimension_the_capture_names(tmp_path, monkeypatch):
    """With an attention-TP group of two, the patched gather stacks the ranks' tokens (dim 0, as the capture asks),
    not their hidden states."""
    import sys
    import types

    import torch

    from eagle3_patches.patches.dp_attention_aux_gather import PATCH
    from eagle3_patches.registry import Saver

    class AttentionTpGroupOfTwo:
        def all_gather(self, input_, dim: int = -1):
            return torch.cat([input_, torch.zeros_like(input_)], dim=dim)

    # sglang's module as the patch imports it, without its imports (a CUDA build's)
    dp_attention = types.ModuleType("sglang.srt.layers.dp_attention")
    dp_attention.get_attention_tp_group = AttentionTpGroupOfTwo
    for name in ("sglang", "sglang.srt", "sglang.srt.layers"):
        if name not in sys.modules:
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.layers.dp_attention", dp_attention)
    module = _module_calling_the_gather(tmp_path, 1)
    saver = Saver()
    PATCH.patch(module, saver)
    try:
        assert tuple(module.tensor_model_parallel_all_gather(torch.ones(TOKENS, HIDDEN), dim=0).shape) == (
            2 * TOKENS,
            HIDDEN,
        )
    finally:
        saver.restore()


def test_the_check_refuses_a_forward_that_imports_the_gather_itself(tmp_path):
    """Rebinding the module's name reaches nothing when forward imports the gather on its own."""
    from eagle3_patches.patches.dp_attention_aux_gather import PATCH
    from eagle3_patches.registry import NotApplicable

    module = _module(
        tmp_path,
        "deepseek_v2_local_import",
        "class DeepseekV2Model:\n    def forward(self, x):\n"
        "        from operator import getitem as tensor_model_parallel_all_gather\n\n"
        "        if self.enable_a2a_moe:\n            return tensor_model_parallel_all_gather(x, 0)\n"
        "        return x\n",
    )
    with pytest.raises(NotApplicable):
        PATCH.check(module)
