"""mla_draft_strict_loading

Bug: the MLA EAGLE-3 draft's loader (``Eagle3DeepseekV2ForCausalLM.load_weights`` in ``models/kimi_k25_eagle3.py``)
logs a warning for a name it does not know and never checks for a parameter no tensor reached; a down projection
stored without its partner (``q_a_proj`` without ``kv_a_proj_with_mqa``, which it fuses) is dropped without a word.

What users see: a draft with a tensor missing or misnamed serves with that parameter at its random init: a low
accept length, and at most a warning line among thousands.

What the patch changes: the Llama draft's strict loading (``eagle3_draft_strict_loading``: the same observing
ledger, the same message) on ``Eagle3DeepseekV2ForCausalLM.load_weights``: every tensor no parameter received,
every parameter no tensor reached, and a bad ``d2t`` are refused with ``Eagle3ConfigError`` before the server
starts.  The pair the loader fuses counts as loaded when the fused parameter was written.

Releases: 0.5.12 (the first with ``models/kimi_k25_eagle3.py``) and later.

Upstream probe: none (no release checked checks for missing tensors).

Tests: ``tests/patches/test_mla_draft.py``: real draft ``ModelRunner`` objects load the tiny MLA draft: correct, it
loads silently and bit-exactly (the fused down projection compared); without ``kv_b_proj``, with an unknown tensor,
and with ``q_a_proj`` alone, stock loads silently and the patch refuses, naming the tensor.  The doctor judges the
same tensors before start (``keys-unknown`` / ``keys-missing`` / ``tensor-shape``: ``expected_draft_tensors``).
"""

from __future__ import annotations

from types import ModuleType

from packaging.specifiers import SpecifierSet

from ..registry import Patch, Saver, expect_attr, expect_source
from .eagle3_draft_strict_loading import strict_load_weights


class MlaDraftStrictLoading(Patch):
    name = "mla_draft_strict_loading"
    # pragma: no mutate core/NumberReplacer: `order` only sorts the patches, and one off sorts them alike
    # (tests/unit/test_registry.py holds every order marked so to it)
    order = 51
    summary = "the MLA draft's loader refuses unknown keys, unloaded parameters and bad d2t"
    module = "sglang.srt.models.kimi_k25_eagle3"
    applies_to = SpecifierSet(">=0.5.12")

    remedy = "refused"

    def check(self, module: ModuleType) -> None:
        expect_source(
            expect_attr(module.Eagle3DeepseekV2ForCausalLM, "load_weights"), "params_dict", "kv_a_proj_with_mqa"
        )
        expect_attr(module, "default_weight_loader")

    def patch(self, module: ModuleType, saver: Saver) -> None:
        saver.wrap(module.Eagle3DeepseekV2ForCausalLM, "load_weights", strict_load_weights)


PATCH = MlaDraftStrictLoading()
