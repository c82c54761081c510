"""dp_attention_aux_gather

Bug: with an all-to-all MoE backend (``--moe-a2a-backend deepep`` or ``mooncake``) sglang gathers each aux hidden
state it captures past the dense layers (``DeepseekV2Model.forward``) with ``tensor_model_parallel_all_gather``, over
the whole TP group.  Under DP attention each attention-DP rank serves its own tokens, so the gathered state holds the
tokens of every DP rank of the TP group (tp / attention-tp times the rows) and the draft's ``fc`` gets other requests'
states, or the gather breaks when the ranks' token counts differ.  sglang 0.5.10 gathers over the attention-TP group
(sglang PR #20492, tested upstream on Kimi-K2.5 at DP 16).

What users see: Kimi-K2.5 served with the production flags of sglang's cookbook (DP attention with DeepEP) and an
EAGLE-3 draft on 0.5.9: an accept length far below the draft's, or a shape error in the logits processor when the
dense layers' states and the gathered ones differ in rows; no message that names the gather.
``aux_capture_validation`` names the rows where this patch is off.

What the patch changes: ``deepseek_v2``'s module-level ``tensor_model_parallel_all_gather``, which that module calls
only in this capture (the check verifies it), gathers over the attention-TP group, as 0.5.10 does.  Without DP
attention the attention-TP group is the TP group (``_ATTN_TP = _TP``): nothing changes there.

Releases: 0.5.8 - 0.5.9.  Its check requires that ``DeepseekV2Model.forward`` gathers with
``tensor_model_parallel_all_gather`` under ``self.enable_a2a_moe`` and that the module calls it nowhere else, else
``not-applicable``.

Upstream probe: ``DeepseekV2Model.forward`` gathers with ``get_attention_tp_group().all_gather`` (0.5.10 - 0.5.16;
from 0.5.17 the capture lives in the decoder layer).

Tests: ``tests/patches/test_dp_attention_aux_gather.py``: the real 0.5.9 forward with ``enable_a2a_moe`` on and TP 2
with DP attention 2 emulated (the TP group's gather returns this rank's rows and a second rank's, the attention-TP
group is this rank alone; scenario ``a2a_capture_rows``): stock stores 10 rows of aux states for 5 tokens, patched 5;
the doctor's ``dp-attention-a2a-aux-rows``: an error on stock 0.5.9, a note with the patch, silent from 0.5.10,
without DP attention, without an all-to-all backend and without capture.

Not verified on CPU: DeepEP or mooncake themselves and a real DP-attention group of several ranks (GPUs).
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

from packaging.specifiers import SpecifierSet

from ..diagnostic import ERROR, Diagnostics
from ..registry import NotApplicable, Patch, Saver, expect_attr, expect_source, read_source_file

# pragma: no mutate core/AddNot: only mypy reads PatchSetup here; importing preflight at run time as well changes
# nothing a test or an operator sees
if TYPE_CHECKING:  # for the annotations only: a serving process does not load the doctor's layer
    from ..preflight import PatchSetup

NAME = "dp_attention_aux_gather"
GATHER = "tensor_model_parallel_all_gather"
UPSTREAM_GATHER = "get_attention_tp_group().all_gather("
#: the all-to-all MoE backends with which sglang gathers a captured aux state past the dense layers
A2A_GATHERING_BACKENDS = ("deepep", "mooncake")
#: the release that gathers over the attention-TP group (read from the 0.5.9 and 0.5.10 wheels)
FIXED_IN = "0.5.10"


class DpAttentionAuxGather(Patch):
    name = NAME
    # pragma: no mutate core/NumberReplacer: `order` only sorts the patches, and one off sorts them alike
    # (tests/unit/test_registry.py holds every order marked so to it)
    order = 22
    summary = "DP attention + an a2a MoE backend: captured aux states gathered over the attention-TP group"
    module = "sglang.srt.models.deepseek_v2"
    applies_to = SpecifierSet(f">=0.5.8,<{FIXED_IN}")

    def upstream(self, module: ModuleType) -> str | None:
        model = getattr(module, "DeepseekV2Model", None)
        try:
            expect_source(model.forward if model else None, UPSTREAM_GATHER)
        except NotApplicable:
            return None
        return "DeepseekV2Model.forward gathers the captured aux states over the attention-TP group"

    def check(self, module: ModuleType) -> None:
        model = expect_attr(module, "DeepseekV2Model")
        expect_source(model.forward, "self.enable_a2a_moe", f"{GATHER}(")
        expect_attr(module, GATHER)
        calls = read_source_file(module.__file__ or "", module.__name__).count(f"{GATHER}(")
        # pragma: no mutate core/ReplaceComparisonOperator_NotEq_Gt: the expect_source above found the call in
        # forward, so the module calls the gather at least once here
        if calls != 1:
            raise NotApplicable(
                f"{module.__name__} calls {GATHER} {calls} times: rebinding it would change more than the capture"
            )

    def patch(self, module: ModuleType, saver: Saver) -> None:
        from sglang.srt.layers.dp_attention import get_attention_tp_group

        # pragma: no mutate core/NumberReplacer: the default is sglang's; the one caller (the capture in
        # DeepseekV2Model.forward, the check holds it the only one) passes dim=0
        def attention_tp_all_gather(input_, dim: int = -1):
            """The aux capture's gather over the attention-TP group (sglang 0.5.10's)."""
            return get_attention_tp_group().all_gather(input_, dim)

        saver.set(module, GATHER, attention_tp_all_gather)

    def preflight(self, setup: PatchSetup) -> Diagnostics:
        out = Diagnostics()
        la = setup.launch
        if (
            setup.checkpoint_only
            or not setup.eagle3
            or not la.enable_dp_attention
            or (la.moe_a2a_backend or "none") not in A2A_GATHERING_BACKENDS
            or not self.covers(setup.version)
        ):
            return out
        out.add(
            ERROR,
            "dp-attention-a2a-aux-rows",
            f"DP attention with --moe-a2a-backend {la.moe_a2a_backend} and EAGLE-3 on sglang {setup.version}: the "
            "target gathers each captured aux state over the whole TP group, so the draft's fc gets other "
            "attention-DP ranks' tokens mixed in (garbage, no error)" + setup.once_eagle3,
            where="--enable-dp-attention --moe-a2a-backend",
            found=f"--enable-dp-attention, --moe-a2a-backend {la.moe_a2a_backend}",
            expected="the aux states gathered over the attention-TP group",
            fix=f"launch under `eagle3-patches run` ({NAME}), upgrade to sglang >= {FIXED_IN}, or serve without "
            "--enable-dp-attention",
        )
        return out


PATCH = DpAttentionAuxGather()
