"""dp_attention_aux_gather: with DP attention and an all-to-all MoE backend, the captured aux states are gathered over
the attention-TP group (sglang 0.5.10's), not the whole TP group."""

from __future__ import annotations

import pytest

from eagle3_patches.diagnostic import ERROR, INFO
from eagle3_patches.doctor import doctor
from eagle3_patches.selftest import PASSED
from eagle3_patches.testing.releases import requires_patch
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
