"""aux_capture_validation: layer ids validated; capture count/width checked; TBO and PP refused."""

from __future__ import annotations

import pytest

from eagle3_patches.patches.aux_capture_validation import validate_layer_ids
from eagle3_patches.selftest import PASSED
from eagle3_patches.testing.isolation import run_isolated
from eagle3_patches.testing.releases import requires_patch
from eagle3_patches.testing.tiny_models import NUM_LAYERS

pytestmark = [pytest.mark.sglang, requires_patch("aux_capture_validation")]  # sglang < 0.5.13


@pytest.mark.parametrize(
    "ids, needle",
    [
        ([1, 2, NUM_LAYERS - 1], f"[{NUM_LAYERS - 1}] cannot be captured"),
        ([-1, 2, 3], "[-1] cannot be captured"),
        ([1, 1, 3], "distinct and ascending"),
        ([3, 2, 1], "distinct and ascending"),
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


def test_good_layer_ids_pass():
    validate_layer_ids([0, 2, NUM_LAYERS - 2], NUM_LAYERS)
    validate_layer_ids([2, 30, 58], 61)  # Kimi-K2.5


@pytest.fixture(scope="module")
def check(run_check):
    """The selftest check: checks.CAPTURE_CASES on a real DeepseekV3ForCausalLM, stock, then the same model with the patch
    set applied."""
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


def _capture_lost(target: str):
    """Capture on, but layers_to_capture pointing past the last layer (what TBO/PP do): checked per forward."""
    from eagle3_patches.testing import sglang_harness as h

    runner = h.model_runner(h.server_args(target))
    runner.model.set_eagle3_layers_to_capture([1, 2, 3])
    runner.model.model.layers_to_capture = [2, 3, NUM_LAYERS + 1]  # one state will never be captured
    try:
        h.prefill(runner, [[5, 6, 7, 8, 9]], return_hidden_states=True)
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__, str(exc)
    return "ok", None


def test_patched_forward_check_names_the_lost_capture(tiny):
    kind, message = run_isolated(_capture_lost, str(tiny["deepseek_v3"]), patches=["aux_capture_validation"])
    assert kind == "Eagle3CaptureError"
    assert "2 states" in message and "3 states of width 64" in message


@pytest.mark.stock
def test_stock_forward_with_a_lost_capture_passes_silently(tiny):
    assert run_isolated(_capture_lost, str(tiny["deepseek_v3"]), patches=None) == ("ok", None)


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
    kind, message = run_isolated(_parallelism_refusal, str(tiny["deepseek_v3"]), str(tiny["draft"]), flag,
                                 patches=["aux_capture_validation"])
    if needle is None:
        assert (kind, message) == ("ok", None)  # silent on a correct setup
    else:
        assert kind == "Eagle3ConfigError" and needle in message


@pytest.mark.stock
@pytest.mark.parametrize("flag", ["tbo", "pp"])
def test_stock_starts_with_two_batch_overlap_or_pipeline_parallel_and_capture(tiny, flag):
    assert run_isolated(_parallelism_refusal, str(tiny["deepseek_v3"]), str(tiny["draft"]), flag) == ("ok", None)
