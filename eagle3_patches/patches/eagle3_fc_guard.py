"""eagle3_fc_guard

Bug: the EAGLE-3 draft applies ``fc`` only ``if hidden_states.shape[-1] != embeds.shape[-1]``.  When the target
hands it H-wide states instead of k x H (``--speculative-algorithm EAGLE``, or a target that does not capture) and
the draft's hidden size equals the target's (Kimi-K2.5 and its drafters), ``fc`` is skipped in silence.

What users see: accept length about 1.0, no error: the field's symptom.

What the patch changes: ``LlamaModel.forward`` of the draft checks, in the forward modes that carry the target's
states (the draft's prefill ``EXTEND``, ``MIXED``, v1's ``DRAFT_EXTEND`` and the v2 worker's ``DRAFT_EXTEND_V2``,
named explicitly: ``ForwardMode.is_extend()`` leaves ``DRAFT_EXTEND_V2`` out, and 0.5.23's leaves ``DRAFT_EXTEND``
out too), that the incoming width equals ``fc.in_features``; otherwise it raises ``Eagle3CaptureError`` naming the
likely cause (``--speculative-algorithm EAGLE`` instead of ``EAGLE3``, ``eagle_config.use_aux_hidden_state:
false``, or a target that does not capture; for another wrong width, aux ids or a target that do not match the
draft's ``fc.weight``).  Draft decode steps, which carry the draft's own H-wide states, are left alone: the skip is
by design there.  One shape read per draft forward.  ``Eagle3CaptureError`` is not a ``RuntimeError``, so when the
mistake surfaces while sglang captures the draft-extend CUDA graph, the user reads this message, not sglang's
"Capture cuda graph failed" advice about graph memory.

Releases: 0.5.8 and later (every release checked has the silent skip; 0.5.12 sizes ``fc`` by ``len(ids)``
but still skips).

Upstream probe: none known; the patch's check requires the skip condition (``self.fc(hidden_states)`` in the
draft's ``LlamaModel.forward``) to be still there, else ``not-applicable``.

Tests: ``tests/patches/test_eagle3_fc_guard.py``: through the real EAGLEWorker with ``--speculative-algorithm
EAGLE`` and the algorithm guard disabled, stock skips fc silently (hook never called, asserted) and the guard raises
naming the flag.  At Kimi-K2.5's real widths, sglang's ``LlamaForCausalLMEagle3`` built with the SpecForge
Kimi-K2.5 draft dimensions (hidden 7168, head_dim 128, aux ids ``[2, 30, 58]``; heads, intermediate size and
vocabulary shrunk, dummy weights) receives ``[4, 21504]`` at ``fc``, and a 7168-wide input is refused; stock skips
it silently.  The draft-extend CUDA graph: sglang's real ``EAGLEDraftExtendCudaGraphRunner`` (static buffers,
``ForwardBatch``, the draft forward of ``capture_one_batch_size``, inside the runner's own ``__init__`` and its
error handling) for the v1 worker (``DRAFT_EXTEND``) and ``EAGLEWorkerV2`` (``DRAFT_EXTEND_V2``), with only the CUDA
graph calls run eagerly: ``fc`` receives the 3 x H buffer and the guard passes; with ``use_aux_hidden_state: false``
(an H-wide buffer) stock captures a graph that skips ``fc`` silently, and the patch set refuses it with its own
message.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

from packaging.specifiers import SpecifierSet

from ..checkpoint.formats import SGLANG_EAGLE3
from ..diagnostic import ERROR, Diagnostics
from ..errors import Eagle3CaptureError
from ..registry import Patch, Saver, expect_attr, expect_source
from ..sglang_runtime import linear_widths

if TYPE_CHECKING:  # for the annotations only: a serving process does not load the doctor's layer
    from ..preflight import PatchSetup

#: the draft's forward modes whose ``spec_info.hidden_states`` come from the target (k x H when captured):
#: the draft's prefill, and its extends after verify (v1 ``DRAFT_EXTEND``; the v2 worker's
#: ``DRAFT_EXTEND_V2`` from 0.5.13, which ``ForwardMode.is_extend()`` leaves out unless asked, and
#: 0.5.23's ``is_extend()`` leaves out ``DRAFT_EXTEND`` too).  Draft decode steps carry the draft's
#: own H-wide states, for which the skip is by design; IDLE batches carry none.  ``SPLIT_PREFILL``
#: (``--enable-pdmux``) never reaches the guarded ``forward``: the runner calls ``forward_split_prefill``.
TARGET_STATE_MODES = frozenset({"EXTEND", "MIXED", "DRAFT_EXTEND", "DRAFT_EXTEND_V2"})


def fc_guard(where: str):
    """The wrapper of a draft model's ``forward(input_ids, positions, forward_batch, ...)`` whose ``fc`` is skipped
    when the incoming width equals the embedding's; ``where`` names that forward in the message."""

    def guard(wrapped, instance, args, kwargs):
        # pragma: no mutate core/NumberReplacer `> 3`, `> 1`: sglang calls `self.model(input_ids, positions,
        # forward_batch, input_embeds, pp_proxy_tensors=...)` (`LlamaForCausalLM.forward`, which the EAGLE-3 draft
        # inherits): four positional arguments in every call, so the condition is true either way and `args[2]` is the
        # batch (four positional arguments)
        # pragma: no mutate core/ReplaceComparisonOperator_Gt_GtE: sglang calls `self.model(input_ids, positions,
        # forward_batch, input_embeds, pp_proxy_tensors=...)` (`LlamaForCausalLM.forward`, which the EAGLE-3 draft
        # inherits): four positional arguments in every call, so the condition is true either way and `args[2]` is the
        # batch
        forward_batch = args[2] if len(args) > 2 else kwargs["forward_batch"]
        if forward_batch.forward_mode.name in TARGET_STATE_MODES:
            hidden_states = forward_batch.spec_info.hidden_states
            width = hidden_states.shape[-1]  # a shape read: no device synchronisation
            expected, _ = linear_widths(instance.fc)
            if expected is not None and width != expected and hidden_states.shape[0] > 0:
                raise fc_width_error(width, expected, instance.config.hidden_size, where=where)
        return wrapped(*args, **kwargs)

    return guard


_guard = fc_guard("draft model LlamaModel.forward (sglang/srt/models/llama_eagle3.py)")


def fc_width_error(width: int, expected: int, hidden: int, *, where: str) -> Eagle3CaptureError:
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
        where=where,
        found=found,
        expected=f"{expected} = fc.in_features (len(aux layer ids) x target hidden)",
        fix=fix,
    )


class Eagle3FcGuard(Patch):
    name = "eagle3_fc_guard"
    # pragma: no mutate core/NumberReplacer: `order` only sorts the patches, and one off sorts them alike
    # (tests/unit/test_registry.py holds every order marked so to it)
    order = 60
    summary = "the draft's silent fc skip on H-wide input becomes an error naming the cause"
    module = "sglang.srt.models.llama_eagle3"
    applies_to = SpecifierSet(">=0.5.8")

    remedy = "refused"

    def preflight(self, setup: PatchSetup) -> Diagnostics:
        """What would reach fc at the wrong width: a draft config that turns the capture off, an fc.weight whose width
        is not len(aux ids) x the target's hidden size, or (before 0.5.12, where fc is always 3 x hidden) not 3 ids."""
        out = Diagnostics()
        dv = setup.draft
        if dv is None or not dv.is_eagle3:
            return out
        if dv.format == SGLANG_EAGLE3 and dv.use_aux_hidden_state is False:
            out.add(
                ERROR,
                "aux-disabled",
                "eagle_config.use_aux_hidden_state is false: the target captures nothing, the draft "
                "gets the final H-wide state and its fc is skipped (accept length ~1)",
                where=setup.dcfg("eagle_config.use_aux_hidden_state"),
                found="false",
                expected="true",
                fix="set it to true",
            )
        fc = setup.draft_tensors.get("fc.weight")
        th, k = setup.fc_input()
        if fc is not None and len(fc.shape) == 2 and th and fc.shape[1] != k * th:
            width = fc.shape[1]
            states = f"{width // th} states" if width % th == 0 else f"{width / th:.2f} x hidden"
            out.add(
                ERROR,
                "fc-width",
                f"fc.weight takes {width} inputs but the target delivers {k} x {th} = {k * th}",
                where=setup.draft_tensor_where("fc.weight"),
                found=f"[{fc.shape[0]}, {width}] ({states})",
                expected=f"[{dv.hidden}, {k * th}] (len({dv.aux_ids_where.split('.')[-1]}) = {k} x target hidden {th})",
                fix="the aux layer ids or the target do not belong to this draft",
            )
        if not setup.rf.fc_width_from_ids and dv.aux_ids is not None and len(dv.aux_ids) != 3:
            out.add(
                ERROR,
                "aux-ids-count",
                f"sglang {setup.version} builds fc for exactly 3 aux states (hidden_size_in * 3), the draft lists "
                f"{len(dv.aux_ids)} ids",
                where=setup.dcfg(dv.aux_ids_where),
                found=str(dv.aux_ids),
                expected="3 ids",
                fix="use sglang >= 0.5.12 (fc = hidden_in x len(ids)) or a 3-layer draft",
            )
        return out

    def check(self, module: ModuleType) -> None:
        # pragma: no mutate eagle3/DeleteCallStatement: a guard of `check()`: every release the patch applies to
        # passes it (the matrix applies the patch on each), so only a release that fails it tells the mutant apart
        expect_source(expect_attr(module.LlamaModel, "forward"), "self.fc(hidden_states)", "spec_info.hidden_states")

    def patch(self, module: ModuleType, saver: Saver) -> None:
        saver.wrap(module.LlamaModel, "forward", _guard)


PATCH = Eagle3FcGuard()
