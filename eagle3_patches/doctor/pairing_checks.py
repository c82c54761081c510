"""The doctor's checks of the pair and the launch: sizes against the target, ``fc``'s shape, the aux layer ids
as the draft states them, and the speculative algorithm against the draft's kind."""

from __future__ import annotations

from ..checkpoint import layer_ids as L
from ..checkpoint.draft_layouts import KIND_EAGLE1, classify
from ..checkpoint.formats import SGLANG_EAGLE3, SPECULATORS
from ..diagnostic import ERROR, INFO, WARNING
from .context import Context


# ---------------------------------------------------------------- sizes
def check_sizes(ctx: Context) -> None:
    dv, tv = ctx.draft_view, ctx.target_view
    if dv.hidden and tv.hidden and dv.hidden != tv.hidden:
        ctx.add(
            ERROR,
            "hidden-mismatch",
            "the draft's hidden size differs from the target's: sglang gives the draft the target's embedding, so its "
            "input is the wrong width",
            where=ctx.dcfg(dv.layer_prefix + "hidden_size"),
            found=f"draft {dv.hidden}",
            expected=f"target {tv.hidden}",
            fix="this draft was trained for another target",
        )
    if dv.target_hidden is not None and tv.hidden and dv.target_hidden != tv.hidden:
        ctx.add(
            ERROR,
            "target-hidden-size",
            "the draft's target_hidden_size is not the target's hidden size",
            where=ctx.dcfg("target_hidden_size"),
            found=str(dv.target_hidden),
            expected=str(tv.hidden),
            fix="this draft was trained for another target (or fix target_hidden_size)",
        )
    if dv.vocab and tv.vocab and dv.vocab != tv.vocab:
        ctx.add(
            ERROR,
            "vocab-mismatch",
            "the draft's vocab_size differs from the target's: d2t/t2d and the shared embedding index the target "
            "vocabulary",
            where=ctx.dcfg(dv.layer_prefix + "vocab_size"),
            found=f"draft {dv.vocab}",
            expected=f"target {tv.vocab}",
            fix="this draft was trained for another target's tokenizer",
        )
    if dv.draft_vocab and dv.vocab and dv.draft_vocab > dv.vocab:
        ctx.add(
            ERROR,
            "draft-vocab-size",
            "draft_vocab_size is larger than vocab_size",
            where=ctx.dcfg("draft_vocab_size"),
            found=str(dv.draft_vocab),
            expected=f"<= {dv.vocab}",
            fix="fix draft_vocab_size (the rows of lm_head.weight)",
        )
    # pragma: no mutate core/NumberReplacer `0`: as `>= 1` above: at tp 1 every count splits evenly
    # pragma: no mutate core/ReplaceComparisonOperator_Gt_GtE: at tp 1 every head, kv-head and intermediate count splits
    # evenly (`x % 1 == 0`), so the split checks find nothing either way
    if ctx.tp > 1:
        bad = []
        if dv.heads and dv.heads % ctx.tp:
            bad.append(f"num_attention_heads {dv.heads}")
        kv = dv.kv_heads
        # pragma: no mutate core/ReplaceComparisonOperator_GtE_Gt: at kv == tp both remainders are 0
        if kv and (kv % ctx.tp if kv >= ctx.tp else ctx.tp % kv):
            bad.append(f"num_key_value_heads {kv}")
        if dv.intermediate and dv.intermediate % ctx.tp:
            bad.append(f"intermediate_size {dv.intermediate}")
        if bad:
            ctx.add(
                ERROR,
                "tp-draft-split",
                f"the draft cannot be split over tp {ctx.tp}",
                where=ctx.dcfg(),
                found=", ".join(bad),
                expected=f"divisible by {ctx.tp}",
                fix="use a tp size that divides the draft's heads and intermediate size",
            )


# ---------------------------------------------------------------- fc
def check_fc_shape(ctx: Context) -> None:
    """fc.weight is a [hidden, k x target hidden] matrix (its width against the aux ids: eagle3_fc_guard's rule)."""
    dv = ctx.draft_view
    fc = ctx.draft_tensors.get("fc.weight")
    th, k = ctx.fc_input()
    if fc is not None and len(fc.shape) != 2:
        ctx.add(
            ERROR,
            "tensor-shape",
            "fc.weight is not a matrix",
            where=ctx.draft_tensor_where("fc.weight"),
            found=str(list(fc.shape)),
            expected=f"[{dv.hidden}, {k} x {th}]",
            fix="re-export the draft",
        )
    elif fc is not None and th and dv.hidden and fc.shape[0] != dv.hidden:
        ctx.add(
            ERROR,
            "tensor-shape",
            "fc.weight's output width is not the draft's hidden size",
            where=ctx.draft_tensor_where("fc.weight"),
            found=str(list(fc.shape)),
            expected=f"[{dv.hidden}, {fc.shape[1]}]",
            fix="the config.json does not belong to these weights",
        )


# ---------------------------------------------------------------- layer ids
def check_layer_ids(ctx: Context) -> None:
    """The ids as the draft states them; what sglang does with them is judged by the rules of
    aux_capture_validation (ids sglang cannot capture) and layer_id_convention (what they mean)."""
    dv = ctx.draft_view
    if not dv.is_eagle3:
        return
    n = ctx.target.num_layers if ctx.target else None
    where = ctx.dcfg(dv.aux_ids_where)
    if dv.aux_ids is None:
        if dv.ignored_top_level_ids is not None:
            ctx.add(
                ERROR,
                "aux-ids-ignored",
                "the layer ids are at the top level of config.json, where sglang never reads them; it uses its "
                "defaults instead",
                where=ctx.dcfg("eagle_aux_hidden_state_layer_ids"),
                found=str(dv.ignored_top_level_ids),
                expected="eagle_config.eagle_aux_hidden_state_layer_ids",
                fix=f"move them into eagle_config (and state eagle_config.{L.CONVENTION_KEY})",
            )
        defaults = L.default_capture_points(n) if n else None
        outputs = [p - 1 for p in defaults] if defaults else None
        ctx.add(
            ERROR,
            "aux-ids-missing",
            "the draft config names no aux layer ids: sglang captures its defaults "
            + (
                f"(before layers {defaults} = the outputs of layers {outputs})"
                if defaults
                else "[2, n//2, n-3] (before those layers)"
            ),
            where=where,
            found="no eagle_config.eagle_aux_hidden_state_layer_ids",
            fix="state the ids the draft was trained on in eagle_config.eagle_aux_hidden_state_layer_ids "
            f'(and eagle_config.{L.CONVENTION_KEY} = "{L.OUTPUT_OF_LAYER}" for sglang <= 0.5.12 ids)',
        )
        return
    ids = dv.aux_ids
    if not ids:
        ctx.add(
            ERROR,
            "aux-ids-invalid",
            "the aux layer id list is empty",
            where=where,
            found="[]",
            fix="list the 3 target layers the draft was trained on",
        )
        return
    intended = dv.output_ids or []  # aux_ids is a list here, so are its output ids
    if not dv.convention_stated and dv.format == SGLANG_EAGLE3:
        ctx.add(
            INFO,
            "aux-ids-convention-assumed",
            f"the draft config does not state what its ids mean; assuming {L.OUTPUT_OF_LAYER} (sglang <= 0.5.12 / "
            "SpecForge: id i = output of layer i)",
            where=where,
            fix=f'state it: eagle_config.{L.CONVENTION_KEY} = "{L.OUTPUT_OF_LAYER}" (eagle3-patches convert writes it)',
        )
    if dv.format == SPECULATORS:
        # what the converted config will say, range-checked against the target
        if n is not None:
            bad = [i for i, o in zip(ids, intended) if not 0 <= o <= n - 2]
            if bad:
                ctx.add(
                    ERROR,
                    "aux-ids-out-of-range",
                    f"speculators ids {bad} (HF hidden_states index) have no capture point in sglang on a {n}-layer "
                    f"target (valid 1..{n - 1})",
                    where=where,
                    found=str(ids),
                    expected=f"ids in 1..{n - 1}",
                    fix="id 0 (embeddings) and id num_layers (final state) cannot be captured by sglang: retrain on "
                    "inner layers",
                )
            else:
                ctx.add(
                    INFO,
                    "aux-ids-capture",
                    f"ids {ids} (speculators' meaning) are the outputs of layers {intended} of {n} (what "
                    "`eagle3-patches convert` writes, and what speculators_draft_config hands sglang)",
                    where=where,
                )
        return
    cap = ctx.capture()
    # pragma: no mutate eagle3/DropGuard: never None here (an sglang-format EAGLE-3 draft with ids: the returns above);
    # the test is the type checker's
    if cap is None:
        return
    ctx.report.facts["capture"] = {
        "ids": ids,
        "convention": dv.convention,
        "convention_stated": dv.convention_stated,
        "capture_before_layers": list(cap.points),
        "captured_outputs": list(cap.outputs),
        "intended_outputs": intended,
        "num_layers": n,
    }
    if n is not None:
        ctx.add(INFO, "aux-ids-capture", cap.describe(), where=where)


# ---------------------------------------------------------------- algorithm
def check_algorithm(ctx: Context) -> None:
    algo = ctx.algorithm
    if ctx.draft is None:
        return
    is3, why = ctx.draft_is_eagle3()
    if algo is None:
        ctx.add(
            WARNING,
            "no-speculation",
            "the launch command names a draft but no --speculative-algorithm: sglang does not speculate at all",
            where="--speculative-algorithm",
            fix="add --speculative-algorithm EAGLE3",
        )
        return
    # EAGLE / NEXTN with an EAGLE-3 draft: eagle3_algorithm_guard's preflight rule
    found = classify(ctx.draft.config, ctx.draft_shapes())
    if algo == "EAGLE3" and not is3 and found is not None and found.kind == KIND_EAGLE1:
        ctx.add(
            ERROR,
            "algorithm-eagle3-with-non-eagle3-draft",
            f"--speculative-algorithm EAGLE3 with a draft that is not EAGLE-3 ({why})",
            where="--speculative-algorithm",
            found="EAGLE3",
            expected="EAGLE for an EAGLE-1/2 draft",
            fix="use --speculative-algorithm EAGLE for this draft, or an EAGLE-3 draft",
        )
    elif algo in ("STANDALONE", "NGRAM", "DFLASH"):
        ctx.add(
            INFO,
            "algorithm-not-eagle",
            f"--speculative-algorithm {algo}: the EAGLE-3 checks do not apply",
            where="--speculative-algorithm",
        )
