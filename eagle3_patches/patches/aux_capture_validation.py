"""aux_capture_validation

Bug: the aux layer ids are never validated and the capture is never checked.  On 0.5.9 an id ``i`` captures before
layer ``i + 1``: id ``n - 1`` becomes ``n`` and is never reached (two states instead of three), ``-1`` becomes layer
0 with no residual, duplicates are merged and ids are captured in layer order, not config order.  Two-batch overlap
captures nothing past ``first_k_dense_replace``; pipeline parallelism captures only the last stage's layers.

What users see: a shape error deep in the draft's ``fc``, a ``TypeError`` on a ``None`` residual, a crash far away,
or, worst, nothing: a narrower or reordered concatenation (garbage), or other ranks' rows mixed in, and a low accept
length.

What the patch changes: ``DeepseekV2ForCausalLM.set_eagle3_layers_to_capture`` validates the ids against the
target's layer count (``0 <= id <= n - 2``, integers, distinct, ascending) and raises ``Eagle3ConfigError`` naming
``eagle_config.eagle_aux_hidden_state_layer_ids`` in the draft config; it refuses two-batch overlap and pipeline
parallel with capture on, and logs once per rank and configuration which layers it captures and which patches are
live there.  After every capturing forward, ``DeepseekV2Model.forward`` checks that exactly
``len(layers_to_capture)`` states of the hidden width came back, each with as many rows as the hidden state beside
it (the tokens of this forward on this rank: on 0.5.9, DP attention with an all-to-all MoE backend gathers the aux
states over the whole TP group where ``dp_attention_aux_gather`` is off, other ranks' tokens mixed in), and
``DeepseekV2ForCausalLM.forward`` that the stored ``logits_output.hidden_states`` is ``len(ids) x hidden`` wide
(``Eagle3CaptureError`` otherwise).  The checks read shapes only (no device synchronisation).

Releases: 0.5.8 - 0.5.12 (the +1 rule it validates against changed in 0.5.13).  Its check requires that
``set_eagle3_layers_to_capture`` still contains the ``val + 1`` rule, else ``not-applicable``.

Upstream probe: none (0.5.23 raises for too few states, still nothing for TBO).

Tests: ``tests/patches/test_aux_capture_validation.py``: stock 0.5.9 accepts ``[1, 2, 5]`` and ``[1, 1, 3]`` and
stores a 128-wide tensor where the draft's fc expects 192 (asserted); patched refuses both at set time; a capture
lost in the forward is named with the counts; two-batch overlap and pipeline parallel are refused (the flags are
set on the real objects: neither can be built on CPU), stock starts with both; aux states gathered over a group
larger than the attention-TP group (the real forward with ``enable_a2a_moe`` on and the gather of a TP group of two
whose other rank holds other tokens) are named by their rows, stock passes them on; a correct setup stays silent.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import TYPE_CHECKING

from packaging.specifiers import SpecifierSet

from ..checkpoint.releases import NEWEST_CHECKED
from ..diagnostic import ERROR, Diagnostics
from ..errors import Eagle3CaptureError, Eagle3ConfigError
from ..registry import Patch, Saver, expect_attr, expect_source
from ..sglang_runtime import server_arg
from . import get_registry
from .dp_attention_aux_gather import A2A_GATHERING_BACKENDS, FIXED_IN
from .dp_attention_aux_gather import NAME as GATHER_PATCH

if TYPE_CHECKING:  # for the annotations only: a serving process does not load the doctor's layer
    from ..preflight import PatchSetup

logger = logging.getLogger("eagle3_patches")

FIELD = "eagle_config.eagle_aux_hidden_state_layer_ids"


def validate_layer_ids(layer_ids, num_layers: int) -> None:
    """0.5.8-0.5.12 meaning: id i captures the output of layer i, i.e. before layer i + 1."""
    where = f"draft config.json {FIELD} (target has {num_layers} layers)"
    if not isinstance(layer_ids, (list, tuple)) or not layer_ids:
        raise Eagle3ConfigError(
            "EAGLE-3 aux layer ids must be a non-empty list",
            where=where,
            found=repr(layer_ids),
            expected="a list such as [2, 30, 58] for Kimi-K2.5",
            fix=f"set {FIELD} in the draft config",
        )
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in layer_ids):
        raise Eagle3ConfigError(
            "EAGLE-3 aux layer ids must be integers",
            where=where,
            found=repr(layer_ids),
            expected="integers",
            fix=f"fix {FIELD}",
        )
    last = num_layers - 2
    bad = [i for i in layer_ids if i < 0 or i > last]
    if bad:
        raise Eagle3ConfigError(
            f"EAGLE-3 aux layer id(s) {bad} cannot be captured",
            where=where,
            found=repr(list(layer_ids)),
            expected=f"0 <= id <= {last}: id i captures the output of layer i before layer i + 1 runs, so id "
            f"{num_layers - 1} would wait for a layer {num_layers} that never runs and a negative id has no residual",
            fix="use the ids the draft was trained with in sglang's convention; a speculators/vLLM id N (the input of "
            "layer N) is N - 1 here (`eagle3-patches convert` translates them)",
        )
    if list(layer_ids) != sorted(set(layer_ids)):  # a duplicate or a step down
        raise Eagle3ConfigError(
            "EAGLE-3 aux layer ids must be distinct and ascending: sglang captures in layer order and merges "
            "duplicates",
            where=where,
            found=repr(list(layer_ids)),
            expected=repr(sorted(set(layer_ids))),
            fix="list each layer once, in ascending order, in the order the draft's fc was trained on",
        )


def _refuse_unsupported_parallelism(model) -> None:
    if server_arg("enable_two_batch_overlap"):
        raise Eagle3ConfigError(
            "EAGLE-3 aux capture does not work with two-batch overlap: the overlapped layers capture nothing",
            where="--enable-two-batch-overlap",
            found="two-batch overlap on with --speculative-algorithm EAGLE3",
            expected="two-batch overlap off",
            fix="drop --enable-two-batch-overlap when serving an EAGLE-3 draft",
        )
    pp_size = model.pp_group.world_size
    if pp_size > 1:
        raise Eagle3ConfigError(
            "EAGLE-3 aux capture does not work with pipeline parallelism: only the last stage's layers are captured",
            where=f"--pp-size {pp_size}",
            found="pipeline parallel with --speculative-algorithm EAGLE3",
            expected="--pp-size 1",
            fix="use tensor parallelism (--tp) instead of --pp-size for EAGLE-3",
        )


def _validated_set_layers(wrapped, instance, args, kwargs):
    # pragma: no mutate core/NumberReplacer `-1`: every caller in sglang 0.5.9 - 0.5.12 passes the ids as the one
    # positional argument (`set_eagle3_layers_to_capture(ids)`: the model runner, the wrappers' delegations) or none, so
    # the first argument is the last
    layer_ids = args[0] if args else kwargs.get("layer_ids")
    _refuse_unsupported_parallelism(instance)
    if layer_ids is not None:
        validate_layer_ids(layer_ids, instance.config.num_hidden_layers)
    result = wrapped(*args, **kwargs)
    _log_rank_evidence(instance, layer_ids)
    return result


_logged: set[tuple] = set()


def _log_rank_evidence(model, layer_ids) -> None:
    """One line per rank and configuration: which layers it captures, which patches are live here."""
    import os

    from sglang.srt.distributed import (
        get_tensor_model_parallel_rank,
        get_tensor_model_parallel_world_size,
    )

    key = (os.getpid(), id(model), tuple(model.model.layers_to_capture))
    if key in _logged:
        return
    _logged.add(key)
    states = ", ".join(f"{n}={s.state.value}" for n, s in get_registry().status().items())
    logger.info(
        "eagle3-patches: tp rank %d/%d pid %d: aux layer ids %s -> layers_to_capture %s; %s",
        get_tensor_model_parallel_rank(),
        get_tensor_model_parallel_world_size(),
        os.getpid(),
        layer_ids,
        list(model.model.layers_to_capture),
        states,
    )


def _checked_model_forward(wrapped, instance, args, kwargs):
    out = wrapped(*args, **kwargs)
    expected = len(instance.layers_to_capture)
    if expected and instance.pp_group.is_last_rank:
        aux = out[1] if isinstance(out, tuple) else None  # (hidden, aux), or hidden alone when nothing was captured
        hidden = (out[0] if isinstance(out, tuple) else out).shape[-1]
        # the count here (what TBO, PP and unreachable ids lose); the width where the states are stored for the
        # draft (_checked_causal_lm_forward: n x hidden)
        # pragma: no mutate core/ReplaceComparisonOperator_NotEq_Lt: sglang's `DeepseekV2Model.forward` appends a state
        # for a layer in `layers_to_capture`, once per layer: never more states than entries, so `!=` is `<`
        if aux is None or len(aux) != expected:
            found = "no aux states" if aux is None else f"{len(aux)} states of widths {[a.shape[-1] for a in aux]}"
            raise Eagle3CaptureError(
                "the target forward did not capture the configured EAGLE-3 aux hidden states",
                where=f"DeepseekV2Model.forward, layers_to_capture={instance.layers_to_capture}",
                found=found,
                expected=f"{expected} states of width {hidden}",
                fix="check the launch flags with `eagle3-patches doctor` (two-batch overlap, pipeline parallel and "
                "out-of-range layer ids all lose captures)",
            )
        rows = (out[0] if isinstance(out, tuple) else out).shape[0]
        if any(a.shape[0] != rows for a in aux):
            raise Eagle3CaptureError(
                "the target captured EAGLE-3 aux hidden states of other tokens than its own",
                where=f"DeepseekV2Model.forward, layers_to_capture={instance.layers_to_capture}",
                found=f"aux states of {[a.shape[0] for a in aux]} rows",
                expected=f"{rows} rows each: the tokens of this forward on this rank",
                fix=f"before sglang {FIXED_IN}, DP attention with an all-to-all MoE backend (--moe-a2a-backend "
                f"{' or '.join(A2A_GATHERING_BACKENDS)}) gathers the aux states over the whole TP group: keep "
                f"{GATHER_PATCH} on, upgrade or serve without --enable-dp-attention; else report it with "
                "`eagle3-patches status` output",
            )
    return out


def _checked_causal_lm_forward(wrapped, instance, args, kwargs):
    out = wrapped(*args, **kwargs)
    stored = getattr(out, "hidden_states", None)
    n = len(instance.model.layers_to_capture)
    if stored is not None and instance.capture_aux_hidden_states:  # on, set_eagle3_layers_to_capture named >= 1 layer
        expected = n * instance.config.hidden_size
        if stored.shape[-1] != expected:
            raise Eagle3CaptureError(
                "the target stored hidden states of the wrong width for the EAGLE-3 draft",
                where="logits_output.hidden_states of the target forward",
                found=f"width {stored.shape[-1]}",
                expected=f"{expected} = {n} aux layers x hidden {instance.config.hidden_size}",
                fix="report this with `eagle3-patches status` output; the capture path changed in this sglang build",
            )
    return out


class AuxCaptureValidation(Patch):
    name = "aux_capture_validation"
    # pragma: no mutate core/NumberReplacer: `order` only sorts the patches, and one off sorts them alike
    # (tests/unit/test_registry.py holds every order marked so to it)
    order = 20
    summary = "aux layer ids validated; every capturing forward checked for count and width (shapes only)"
    module = "sglang.srt.models.deepseek_v2"
    applies_to = SpecifierSet(">=0.5.8,<0.5.13")

    remedy = "refused"

    def preflight(self, setup: PatchSetup) -> Diagnostics:
        """Ids sglang cannot capture as asked (every release judged by its own rule), and the two parallel modes
        that lose captures (every release checked); the patch refuses them at start on 0.5.8-0.5.12."""
        out = Diagnostics()
        if not setup.checkpoint_only and setup.eagle3:
            if setup.launch.enable_two_batch_overlap:
                out.add(
                    ERROR,
                    "two-batch-overlap",
                    "two-batch overlap with EAGLE-3: the TBO forward captures no aux states "
                    f"(every release through {NEWEST_CHECKED}), so the draft gets an empty list (crash) or garbage"
                    + setup.once_eagle3,
                    where="--enable-two-batch-overlap",
                    found="on",
                    expected="off",
                    fix="drop --enable-two-batch-overlap when serving with an EAGLE-3 draft",
                )
            if setup.pp > 1:
                out.add(
                    ERROR,
                    "pipeline-parallel",
                    f"pipeline parallel (pp {setup.pp}) with EAGLE-3: only the last stage's layers "
                    "are captured, so fewer than the configured states reach fc (shape error or garbage)"
                    + setup.once_eagle3,
                    where="--pp-size",
                    found=str(setup.pp),
                    expected="1",
                    fix="serve with tensor parallelism only (pp 1)",
                )
        cap = setup.capture()
        if cap is None:
            return out
        ids, n, v = list(cap.ids or ()), cap.num_layers, setup.version
        where = setup.dcfg(setup.draft_view.aux_ids_where)
        if cap.crash_points:
            out.add(
                ERROR,
                "aux-ids-out-of-range",
                f"an id makes sglang {v} capture before layer 0, where residual is None: "
                "TypeError at the first forward",
                where=where,
                found=str(ids),
                expected=f"output-of-layer ids in 0..{(n - 2) if n else 'num_layers-2'}",
                fix="remove the negative id",
            )
        if cap.never_reached:
            out.add(
                ERROR,
                "aux-ids-out-of-range",
                f"ids {[i for i, p in zip(ids, cap.points) if p in cap.never_reached]} make sglang {v} capture before "
                "layers "
                f"{list(cap.never_reached)}, which "
                + (f"a {n}-layer target never reaches" if n else "can never be reached")
                + f": {len(cap.outputs)} states instead of {len(ids)} and an fc shape error",
                where=where,
                found=str(ids),
                expected=f"output-of-layer ids in 0..{n - 2 if n else 'num_layers-2'}",
                fix="use ids of inner layers (the output of the last layer is not capturable in sglang)",
            )
        if cap.duplicates:
            out.add(
                ERROR,
                "aux-ids-duplicate",
                f"ids {sorted(set(cap.duplicates))} are listed twice: sglang captures each layer "
                "once, so fewer states arrive than fc expects",
                where=where,
                found=str(ids),
                fix="list distinct layers",
            )
        if cap.reordered:
            out.add(
                ERROR,
                "aux-ids-unsorted",
                "the ids are not in increasing order: sglang concatenates the captured states in "
                "layer order, not config order, so fc sees them permuted",
                where=where,
                found=str(ids),
                expected=str(sorted(ids)),
                fix="sort the ids only if the draft was trained with them sorted; otherwise it cannot be served "
                "correctly by sglang",
            )
        return out

    def check(self, module: ModuleType) -> None:
        expect_source(
            expect_attr(module.DeepseekV2ForCausalLM, "set_eagle3_layers_to_capture"), "val + 1 for val in layer_ids"
        )
        # pragma: no mutate eagle3/DeleteCallStatement: a guard of `check()`: every release the patch applies to
        # passes it (the matrix applies the patch on each), so only a release that fails it tells the mutant apart
        expect_source(expect_attr(module.DeepseekV2Model, "forward"), "layers_to_capture", "aux_hidden_states")
        # pragma: no mutate eagle3/DeleteCallStatement: a guard of `check()`: every release the patch applies to
        # passes it (the matrix applies the patch on each), so only a release that fails it tells the mutant apart
        expect_attr(module.DeepseekV2ForCausalLM, "forward")

    def patch(self, module: ModuleType, saver: Saver) -> None:
        saver.wrap(module.DeepseekV2ForCausalLM, "set_eagle3_layers_to_capture", _validated_set_layers)
        saver.wrap(module.DeepseekV2Model, "forward", _checked_model_forward)
        saver.wrap(module.DeepseekV2ForCausalLM, "forward", _checked_causal_lm_forward)


PATCH = AuxCaptureValidation()
