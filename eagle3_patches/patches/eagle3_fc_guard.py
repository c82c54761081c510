"""eagle3_fc_guard

Bug: the EAGLE-3 draft applies ``fc`` only ``if hidden_states.shape[-1] != embeds.shape[-1]``;
when the target hands it H-wide states instead of k x H (``--speculative-algorithm EAGLE``,
or a target that does not capture) and draft hidden == target hidden (Kimi-K2.5 and its
drafters), ``fc`` is skipped in silence and the accept length falls to ~1.0.
Releases: every release through 0.5.23 (0.5.12 sizes fc by len(ids) but still skips).
Upstream probe: none known; the check below tells whether the skip condition is still there.
"""

from __future__ import annotations

from types import ModuleType

from packaging.specifiers import SpecifierSet

from ..errors import Eagle3CaptureError
from ..registry import Patch, Saver, expect_attr, expect_source


#: the draft's forward modes whose ``spec_info.hidden_states`` come from the target (k x H when captured):
#: the draft's prefill, and its extends after verify (v1 ``DRAFT_EXTEND``; the v2 worker's
#: ``DRAFT_EXTEND_V2`` from 0.5.13, which ``ForwardMode.is_extend()`` leaves out unless asked, and
#: 0.5.23's ``is_extend()`` leaves out ``DRAFT_EXTEND`` too).  Draft decode steps carry the draft's
#: own H-wide states, for which the skip is by design; IDLE batches carry none.
TARGET_STATE_MODES = frozenset({"EXTEND", "MIXED", "SPLIT_PREFILL", "DRAFT_EXTEND", "DRAFT_EXTEND_V2"})


def _guard(wrapped, instance, args, kwargs):
    forward_batch = args[2] if len(args) > 2 else kwargs["forward_batch"]
    if forward_batch.forward_mode.name in TARGET_STATE_MODES:
        hidden_states = forward_batch.spec_info.hidden_states
        width = hidden_states.shape[-1]  # a shape read: no device synchronisation
        expected = instance.fc.in_features
        if width != expected and hidden_states.shape[0] > 0:
            raise fc_width_error(width, expected, instance.config.hidden_size)
    return wrapped(*args, **kwargs)


def fc_width_error(width: int, expected: int, hidden: int) -> Eagle3CaptureError:
    if width == hidden:
        found = f"{width}-wide hidden states (one layer's width) entering the draft in a draft-extend step"
        fix = (
            "launch with --speculative-algorithm EAGLE3 (not EAGLE): only EAGLE3 makes the target capture the aux "
            "layers; if it already is EAGLE3, the target does not capture them: the draft config's "
            "eagle_config.use_aux_hidden_state must not be false and eagle_aux_hidden_state_layer_ids must be set, and "
            "`eagle3-patches status` shows whether the target model's capture patches are active"
        )
    else:
        found = f"{width}-wide hidden states entering the draft"
        fix = (
            "make the number of aux layer ids in the draft config (eagle_config.eagle_aux_hidden_state_layer_ids) "
            "match the draft's fc.weight, and the draft's target_hidden_size match the target's hidden_size"
        )
    return Eagle3CaptureError(
        "the EAGLE-3 draft's fc would be skipped or fed the wrong width (accept length would fall to ~1.0)",
        where="draft model LlamaModel.forward (sglang/srt/models/llama_eagle3.py)",
        found=found,
        expected=f"{expected} = fc.in_features (len(aux layer ids) x target hidden)",
        fix=fix,
    )


class Eagle3FcGuard(Patch):
    name = "eagle3_fc_guard"
    summary = "the draft's silent fc skip on H-wide input becomes an error naming the cause"
    module = "sglang.srt.models.llama_eagle3"
    applies_to = SpecifierSet(">=0.5.8")

    def check(self, module: ModuleType) -> None:
        expect_source(expect_attr(module.LlamaModel, "forward"), "self.fc(hidden_states)", "spec_info.hidden_states")

    def patch(self, module: ModuleType, saver: Saver) -> None:
        saver.wrap(module.LlamaModel, "forward", _guard)


PATCH = Eagle3FcGuard()
