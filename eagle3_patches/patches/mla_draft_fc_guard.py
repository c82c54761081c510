"""mla_draft_fc_guard

Bug: the MLA EAGLE-3 draft (``Eagle3MLAModel.forward`` in ``models/kimi_k25_eagle3.py``, the class of the Kimi-K2.x
MLA drafts) applies ``fc`` only ``if hidden_states.shape[-1] != embeds.shape[-1]``, as the Llama draft does
(``eagle3_fc_guard``).  When the target hands it H-wide states instead of k x H (``--speculative-algorithm EAGLE``,
or a target that does not capture), ``fc`` is skipped in silence: the draft's hidden size is the target's.

What users see: accept length about 1.0, no error.

What the patch changes: the same check as ``eagle3_fc_guard`` (:func:`.eagle3_fc_guard.fc_guard`), on
``Eagle3MLAModel.forward``: in the forward modes that carry the target's states the incoming width must equal
``fc``'s input size, else ``Eagle3CaptureError`` names the likely cause.  Draft decode steps are left alone.

Releases: 0.5.12 (the first with ``models/kimi_k25_eagle3.py``) and later.

Upstream probe: none known; the check requires the skip (``self.fc(hidden_states)`` in ``Eagle3MLAModel.forward``).

Tests: ``tests/patches/test_mla_draft.py``: the real EAGLE worker with the tiny MLA draft and ``--speculative-algorithm
EAGLE`` (the algorithm guard disabled): stock skips fc silently (no fc call), patched raises naming the flag; with
EAGLE3, fc receives ``[tokens, 3 x hidden]``.
"""

from __future__ import annotations

from types import ModuleType

from packaging.specifiers import SpecifierSet

from ..registry import Patch, Saver, expect_attr, expect_source
from .eagle3_fc_guard import fc_guard

WHERE = "draft model Eagle3MLAModel.forward (sglang/srt/models/kimi_k25_eagle3.py)"


class MlaDraftFcGuard(Patch):
    name = "mla_draft_fc_guard"
    # pragma: no mutate core/NumberReplacer: `order` only sorts the patches, and one off sorts them alike
    # (tests/unit/test_registry.py holds every order marked so to it)
    order = 61
    summary = "the MLA draft's silent fc skip on H-wide input becomes an error naming the cause"
    module = "sglang.srt.models.kimi_k25_eagle3"
    applies_to = SpecifierSet(">=0.5.12")

    remedy = "refused"

    def check(self, module: ModuleType) -> None:
        expect_source(
            expect_attr(module.Eagle3MLAModel, "forward"), "self.fc(hidden_states)", "spec_info.hidden_states"
        )

    def patch(self, module: ModuleType, saver: Saver) -> None:
        saver.wrap(module.Eagle3MLAModel, "forward", fc_guard(WHERE))


PATCH = MlaDraftFcGuard()
