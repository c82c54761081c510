"""aux_capture_validation: layer ids validated; capture count/width checked; TBO and PP refused."""

from __future__ import annotations

import pytest
from support.releases import requires_patch

from eagle3_patches.patches.aux_capture_validation import validate_layer_ids
from eagle3_patches.selftest import PASSED
from eagle3_patches.testing.isolation import run_isolated
from eagle3_patches.testing.tiny_models import NUM_LAYERS

pytestmark = [pytest.mark.sglang, requires_patch("aux_capture_validation")]  # sglang < 0.5.13


@pytest.mark.parametrize(
    "ids, needle",
    [
        ([1, 2, NUM_LAYERS - 1], f"[{NUM_LAYERS - 1}] cannot be captured"),
        ([-1, 2, 3], "[-1] cannot be captured"),
        ([1, 1, 3], "distinct and ascending"),
        ([3, 2, 1], "distinct and ascending"),
        ([1, 3, 2], "distinct and ascending"),
        ([1, 3, 3], "distinct and ascending"),
        ([], "non-empty"),
        ([1.0, 2, 3], "integers"),
    ],
)
def test_bad_layer_ids_are_named(ids, needle):
    from eagle3_patches import Eagle3ConfigError

    with pytest.raises(Eagle3ConfigError, match=None) as info:
        validate_layer_ids(ids, NUM_LAYERS)
    assert needle in str(info.value)
    assert "eagle_aux_hidden_state_layer_ids" in str(info.value)
    if "cannot be captured" in needle:  # the range, and why its end is where it is
        assert f"0 <= id <= {NUM_LAYERS - 2}" in str(info.value)
        assert f"id {NUM_LAYERS - 1} would wait for a layer {NUM_LAYERS} that never runs" in str(info.value)


def test_good_layer_ids_pass():
    validate_layer_ids([0, 2, NUM_LAYERS - 2], NUM_LAYERS)
    validate_layer_ids([2, 30, 58], 61)  # Kimi-K2.5
    validate_layer_ids([2], NUM_LAYERS)  # one captured layer is a list sglang runs (an fc of 1 x hidden)


@pytest.fixture(scope="module")
def check(run_check):
    """The selftest check: checks.CAPTURE_CASES on a real DeepseekV3ForCausalLM, stock, then the same model with the
    patch set applied."""
    return run_check("aux_capture_validation")


@pytest.mark.stock
def test_stock_accepts_uncapturable_ids_silently_or_crashes_far_away(check):
    out = check.observations["stock"]
    assert out["good"] == ("ok", (5, 192))
    # id n-1: only 2 states are captured and stored: a 128-wide tensor where fc expects 192
    assert out["last"] == ("ok", (5, 128))
    assert out["duplicate"] == ("ok", (5, 128))


def test_patched_refuses_them_at_set_time(check):
    assert check.status == PASSED, check.reason
    out = check.observations["patched"]
    assert out["good"] == ("ok", (5, 192))
    assert out["last"][0] == "Eagle3ConfigError" and "cannot be captured" in out["last"][1]
    assert out["duplicate"][0] == "Eagle3ConfigError"


def _capture_lost(target: str, layers_to_capture=(2, 3, NUM_LAYERS + 1), prompt=(5, 6, 7, 8, 9)):
    """Capture on, but layers_to_capture pointing past the last layer (what TBO/PP do): checked per forward."""
    from eagle3_patches.testing import sglang_harness as h

    runner = h.model_runner(h.server_args(target))
    runner.model.set_eagle3_layers_to_capture([1, 2, 3])
    runner.model.model.layers_to_capture = list(layers_to_capture)  # by default one state will never be captured
    try:
        h.prefill(runner, [list(prompt)], return_hidden_states=True)
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__, str(exc)
    return "ok", None


def test_patched_forward_check_names_the_lost_capture(tiny):
    kind, message = run_isolated(_capture_lost, str(tiny["deepseek_v3"]), patches=["aux_capture_validation"])
    assert kind == "Eagle3CaptureError"
    assert "2 states of widths [64, 64]" in message and "3 states of width 64" in message


def test_patched_forward_check_names_a_capture_lost_entirely(tiny):
    """Every state lost: sglang's model returns the hidden state alone (a two-token prompt: a tensor of two rows)."""
    kind, message = run_isolated(
        _capture_lost,
        str(tiny["deepseek_v3"]),
        (NUM_LAYERS + 1, NUM_LAYERS + 2, NUM_LAYERS + 3),
        (5, 6),
        patches=["aux_capture_validation"],
    )
    assert kind == "Eagle3CaptureError"
    assert "no aux states" in message and "3 states of width 64" in message


@pytest.mark.stock
def test_stock_forward_with_a_lost_capture_passes_silently(tiny):
    assert run_isolated(_capture_lost, str(tiny["deepseek_v3"]), patches=None) == ("ok", None)


def _aux_gathered_over_the_tp_group(target: str, prompt=(5, 6, 7, 8, 9)):
    """The real forward with an all-to-all MoE backend on (``enable_a2a_moe``: sglang gathers each aux state past
    the dense layers) and a gather that returns this rank's rows and another rank's, which serves other tokens
    (zeros here): the TP group's gather of 0.5.9 under DP attention, or any other gather over too large a group.
    The group object is replaced in place, so the gather sglang calls (0.5.9's TP group, or the attention-TP group
    of 0.5.10 and of ``dp_attention_aux_gather``: the same object without DP attention) returns both."""
    import torch
    from sglang.srt.distributed.parallel_state import get_tp_group

    from eagle3_patches.testing import sglang_harness as h

    runner = h.model_runner(h.server_args(target))
    runner.model.set_eagle3_layers_to_capture([1, 2, 3])  # layers 2, 3, 4: past first_k_dense_replace = 1
    runner.model.model.enable_a2a_moe = True
    get_tp_group().all_gather = lambda x, dim=-1: torch.cat([x, torch.zeros_like(x)], dim=dim)
    try:
        step = h.prefill(runner, [list(prompt)], return_hidden_states=True)
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__, str(exc)
    return "ok", tuple(step.logits_output.hidden_states.shape)


@pytest.mark.stock
def test_stock_hands_the_draft_other_ranks_rows_silently(tiny):
    """Five tokens, ten rows of aux states stored for the draft: the other rank's tokens mixed in, no error."""
    assert run_isolated(_aux_gathered_over_the_tp_group, str(tiny["deepseek_v3"]), patches=None) == ("ok", (10, 192))


def test_patched_forward_check_names_aux_states_of_other_tokens(tiny):
    kind, message = run_isolated(
        _aux_gathered_over_the_tp_group, str(tiny["deepseek_v3"]), patches=["aux_capture_validation"]
    )
    assert kind == "Eagle3CaptureError", message
    assert "aux states of [10, 10, 10] rows" in message and "5 rows each" in message
    assert "--enable-dp-attention" in message and "0.5.10" in message


def _stored_width_checked(target: str, case: str):
    """A real prefill with the capture on.  ``final-state``: a build whose logits processor is not handed the aux
    states (it stores the final hidden state, width H, where the draft needs 3 x H).  ``no-states``: a forward that
    stores no hidden states (nothing to check).  Also returns the eagle3_patches log lines of the set calls."""
    from eagle3_patches.testing import sglang_harness as h

    log = h.eagle3_log()
    runner = h.model_runner(h.server_args(target))
    if case != "capture-off":  # capture-off: a target served without EAGLE-3, nothing configured, nothing checked
        runner.model.set_eagle3_layers_to_capture([1, 2, 3])
        runner.model.set_eagle3_layers_to_capture([1, 2, 3])  # the same configuration again: logged once
        runner.model.set_eagle3_layers_to_capture([0, 2, 3])
        runner.model.set_eagle3_layers_to_capture([1, 2, 3])
    lp = runner.model.logits_processor
    original = lp.forward
    if case == "final-state":
        lp.forward = lambda input_ids, hidden, head, meta, aux=None, *a, **kw: original(
            input_ids, hidden, head, meta, None, *a, **kw
        )
    if case == "extra-state":
        lp.forward = lambda input_ids, hidden, head, meta, aux=None, *a, **kw: original(
            input_ids, hidden, head, meta, [*aux, hidden], *a, **kw
        )
    try:
        h.prefill(runner, [[5, 6, 7, 8, 9]], return_hidden_states=case != "no-states")
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__, str(exc), [r.getMessage() for r in log]
    return "ok", None, [r.getMessage() for r in log]


@pytest.mark.parametrize("case, width", [("final-state", 64), ("extra-state", 256)])
def test_patched_refuses_a_stored_state_of_the_wrong_width(tiny, case, width):
    kind, message, _ = run_isolated(
        _stored_width_checked, str(tiny["deepseek_v3"]), case, patches=["aux_capture_validation"]
    )
    assert kind == "Eagle3CaptureError", message
    assert f"found:    width {width}\n" in message and "192 = 3 aux layers x hidden 64" in message


def test_patched_target_served_without_eagle3_runs_unchecked(tiny):
    kind, message, _ = run_isolated(
        _stored_width_checked, str(tiny["deepseek_v3"]), "capture-off", patches=["aux_capture_validation"]
    )
    assert (kind, message) == ("ok", None)


@pytest.mark.stock
def test_stock_stores_the_final_state_for_the_draft_silently(tiny):
    assert run_isolated(_stored_width_checked, str(tiny["deepseek_v3"]), "final-state")[:2] == ("ok", None)


@pytest.mark.runtime_only  # the evidence lines come from the runtime patch's logger
def test_patched_checks_nothing_where_no_state_is_stored_and_logs_each_configuration_once(tiny):
    kind, message, lines = run_isolated(
        _stored_width_checked, str(tiny["deepseek_v3"]), "no-states", patches=["aux_capture_validation"]
    )
    assert (kind, message) == ("ok", None)
    evidence = [line for line in lines if "aux layer ids" in line]
    assert len(evidence) == 2, lines  # [1, 2, 3] once, [0, 2, 3] once (the process and model are the same)
    assert "tp rank 0/1" in evidence[0] and "aux layer ids [1, 2, 3] -> layers_to_capture [2, 3, 4]" in evidence[0]
    assert "aux layer ids [0, 2, 3] -> layers_to_capture [1, 3, 4]" in evidence[1]
    assert "aux_capture_validation=applied" in evidence[0]


def _parallelism_refusal(target: str, draft: str, flag: str):
    """Two-batch overlap and pipeline parallel cannot be built on CPU (deepep/mooncake, several
    stages); the flag the guard reads is set on the real objects instead."""
    from types import SimpleNamespace

    from eagle3_patches.testing import sglang_harness as h

    sa = h.eagle3_server_args(target, draft)
    sa.enable_two_batch_overlap = flag == "tbo"
    try:
        runner = h.model_runner(sa)  # calls set_eagle3_layers_to_capture with the draft's ids
        if flag == "pp":
            runner.model.pp_group = SimpleNamespace(world_size=2, is_last_rank=True)
            runner.model.set_eagle3_layers_to_capture([1, 2, 3])
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__, str(exc)
    return "ok", None


@pytest.mark.parametrize("flag, needle", [("tbo", "--enable-two-batch-overlap"), ("pp", "--pp-size 2"), ("none", None)])
def test_patched_refuses_two_batch_overlap_and_pipeline_parallel(tiny, flag, needle):
    kind, message = run_isolated(
        _parallelism_refusal, str(tiny["deepseek_v3"]), str(tiny["draft"]), flag, patches=["aux_capture_validation"]
    )
    if needle is None:
        assert (kind, message) == ("ok", None)  # silent on a correct setup
    else:
        assert kind == "Eagle3ConfigError" and needle in message


@pytest.mark.stock
@pytest.mark.parametrize("flag", ["tbo", "pp"])
def test_stock_starts_with_two_batch_overlap_or_pipeline_parallel_and_capture(tiny, flag):
    assert run_isolated(_parallelism_refusal, str(tiny["deepseek_v3"]), str(tiny["draft"]), flag) == ("ok", None)


@pytest.mark.parametrize(("rows", "refused"), [([5, 5, 5], False), ([5, 10, 5], True), ([3, 3, 3], True)])
def test_the_forward_check_refuses_any_state_of_another_row_count(rows, refused):
    """One state of other rows is enough (a layer captured on the other side of a gather), and fewer rows than the
    forward's tokens as much as more."""
    from types import SimpleNamespace

    import torch

    from eagle3_patches.errors import Eagle3CaptureError
    from eagle3_patches.patches.aux_capture_validation import _checked_model_forward

    model = SimpleNamespace(layers_to_capture=[2, 3, 4], pp_group=SimpleNamespace(is_last_rank=True))
    out = (torch.zeros(5, 8), [torch.zeros(n, 8) for n in rows])
    if refused:
        with pytest.raises(Eagle3CaptureError, match="other tokens than its own"):
            _checked_model_forward(lambda: out, model, (), {})
    else:
        assert _checked_model_forward(lambda: out, model, (), {}) is out
