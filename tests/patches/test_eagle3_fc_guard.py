"""eagle3_fc_guard: the silent fc skip becomes an error; silent on a correct setup.

Also at Kimi-K2.5's real widths: sglang's LlamaForCausalLMEagle3 built with the SpecForge
Kimi-K2.5 draft dimensions (hidden 7168, aux ids [2, 30, 58]; heads, intermediate size and
vocabulary shrunk, none of which touches the fc width) receives 21504-wide inputs, and a
7168-wide input is refused.
"""

from __future__ import annotations

import pytest

from eagle3_patches.selftest import PASSED
from eagle3_patches.selftest.checkpoints import no_aux_draft as build_no_aux_draft
from eagle3_patches.testing import tiny_models as tm
from eagle3_patches.testing.isolation import run_isolated

pytestmark = pytest.mark.sglang

KIMI_HIDDEN = 7168
KIMI_AUX_IDS = (2, 30, 58)


@pytest.fixture(scope="module")
def check(run_check):
    """The selftest check: --speculative-algorithm EAGLE with the EAGLE-3 draft on the tiny DeepSeek-V3 (the target
    captures nothing), stock, then the same workers with the patch set applied."""
    return run_check("eagle3_fc_guard")


@pytest.mark.stock
def test_stock_skips_fc_silently_when_the_target_does_not_capture(check):
    """The field's root cause, reproduced on stock sglang: no error, fc never runs."""
    assert check.observations["stock"] == {"error": None, "message": "", "fc_inputs": []}
    assert check.bug == "present"


def test_guard_turns_the_skip_into_an_error_naming_the_flag(check):
    assert check.status == PASSED, check.reason
    out = check.observations["patched"]
    assert out["error"] == "Eagle3CaptureError"
    assert "--speculative-algorithm EAGLE3" in out["message"]
    assert f"{3 * tm.HIDDEN} = fc.in_features" in out["message"]
    assert out["fc_inputs"] == []


def _draft_forward_widths(target: str, draft: str, widths: list):
    """Feed a real draft ModelRunner an EXTEND batch whose spec_info carries each given width (an int: a 4-token
    prompt; a (width, tokens) pair: a prompt of that many tokens; a (width, tokens, mode) triple: the batch's
    forward mode set to that ``ForwardMode`` member's name)."""
    import torch
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
    from sglang.srt.speculative.eagle_info import EagleDraftInput
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from eagle3_patches.testing import sglang_harness as h

    sa = h.eagle3_server_args(target, draft, load_format="dummy")
    target_runner = h.model_runner(sa)
    runner = h.draft_runner(sa, target_runner)
    fc_inputs = h.record_fc_inputs(SimpleWorker(runner))
    results = []
    for case in widths:
        width, tokens, mode = (*case, None)[:3] if isinstance(case, tuple) else (case, 4, None)
        batch = h.schedule_batch(h.make_reqs([list(range(5, 5 + tokens))]), runner, SpeculativeAlgorithm.EAGLE3)
        batch.prepare_for_extend()
        batch.spec_info = EagleDraftInput(hidden_states=torch.randn(tokens, width))
        batch.capture_hidden_mode = CaptureHiddenMode.LAST
        mwb = h.worker_batch(batch)  # ModelWorkerBatch (<= 0.5.12) or the ScheduleBatch (0.5.13+)
        fb = h.forward_batch(mwb, runner)
        if mode is not None:
            fb.forward_mode = ForwardMode[mode]
        try:
            with torch.no_grad():
                runner.forward(fb)
            results.append(None)
        except Exception as exc:  # noqa: BLE001
            results.append(f"{type(exc).__name__}: {exc}")
    return {"fc_in_features": runner.model.model.fc.in_features, "fc_inputs": fc_inputs, "results": results}


class SimpleWorker:
    def __init__(self, runner):
        self.draft_model_runner = runner


@pytest.fixture(scope="module")
def kimi_width_draft(tiny_root):
    spec = tm.TinyDraftSpec(
        hidden=KIMI_HIDDEN,
        target_hidden=KIMI_HIDDEN,
        aux_ids=KIMI_AUX_IDS,
        num_heads=2,
        num_kv_heads=2,
        intermediate_size=64,
        vocab=tm.VOCAB,
        draft_vocab=tm.DRAFT_VOCAB,
    )
    cfg = tm.eagle3_draft_config(spec)
    cfg["head_dim"] = 128  # SpecForge's Kimi-K2.5 draft: head_dim 128
    path = tiny_root / "kimi-width-draft"
    path.mkdir(exist_ok=True)
    import json

    (path / "config.json").write_text(json.dumps(cfg))  # weights: --load-format dummy
    tm.write_tokenizer(path, tm.VOCAB)
    return path


@pytest.mark.runtime_only
def test_kimi_width_draft_fc_receives_21504_and_refuses_7168_and_28672(tiny, kimi_width_draft):
    """3 x hidden passes; one layer's width (EAGLE, or no capture) and four layers' (a target capturing four aux
    layers for a draft whose fc takes three) are refused before fc, each with its own fix, a one-token prompt too."""
    out = run_isolated(
        _draft_forward_widths,
        str(tiny["deepseek_v3"]),
        str(kimi_width_draft),
        [3 * KIMI_HIDDEN, KIMI_HIDDEN, 4 * KIMI_HIDDEN, (KIMI_HIDDEN, 1)],
        patches=["eagle3_fc_guard"],
    )
    assert out["fc_in_features"] == 21504
    assert out["fc_inputs"] == [(4, 21504)]
    assert out["results"][0] is None
    assert out["results"][1].startswith("Eagle3CaptureError") and "7168-wide" in out["results"][1]
    assert "--speculative-algorithm EAGLE3" in out["results"][1]
    wider = out["results"][2]
    assert wider.startswith("Eagle3CaptureError") and "28672-wide" in wider and "21504 = fc.in_features" in wider
    assert "eagle_aux_hidden_state_layer_ids" in wider
    assert out["results"][3].startswith("Eagle3CaptureError") and "7168-wide" in out["results"][3]


@pytest.mark.runtime_only
def test_a_mixed_chunk_batch_is_checked_like_an_extend_one(tiny, kimi_width_draft):
    """A MIXED batch (chunked prefill mixed with decode: sglang 0.5.9 turns it off under speculative decoding, later
    releases keep it for EAGLE3) carries target states too: 3 x hidden reaches fc, a 7168-wide one is refused
    before fc like an EXTEND batch."""
    out = run_isolated(
        _draft_forward_widths,
        str(tiny["deepseek_v3"]),
        str(kimi_width_draft),
        [(3 * KIMI_HIDDEN, 4, "MIXED"), (KIMI_HIDDEN, 4, "MIXED")],
        patches=["eagle3_fc_guard"],
    )
    assert out["results"][0] is None and out["fc_inputs"] == [(4, 21504)]
    assert out["results"][1].startswith("Eagle3CaptureError") and "7168-wide" in out["results"][1]


@pytest.mark.stock
def test_kimi_width_draft_on_stock_skips_fc_for_7168(tiny, kimi_width_draft):
    out = run_isolated(
        _draft_forward_widths, str(tiny["deepseek_v3"]), str(kimi_width_draft), [KIMI_HIDDEN], patches=None
    )
    assert out["results"] == [None] and out["fc_inputs"] == []  # silent skip: the bug


# --------------------------------------------------------------------------- draft-extend CUDA graphs
# sglang captures the draft's extend step in a CUDA graph (on by default on a GPU) from a static
# hidden-state buffer 3 x hidden wide, or hidden wide when the draft config says
# use_aux_hidden_state: false.  sglang's real EAGLEDraftExtendCudaGraphRunner runs here with only
# the graph calls made eager (sglang_harness.capture_draft_extend_graphs_eagerly): the v1 worker
# captures DRAFT_EXTEND, EAGLEWorkerV2 (the overlap scheduler's worker; the only one from 0.5.13)
# DRAFT_EXTEND_V2.
WORKERS = ["v1", "v2"]


def _capture_draft_extend(target: str, draft: str, worker: str) -> dict:
    from eagle3_patches.testing import sglang_harness as h

    if worker == "v1" and not h.has_spec_v1_worker():
        return {"skip": "this sglang release has only the v2 EAGLE worker"}
    sa = h.eagle3_server_args(target, draft, cuda_graph_bs=[1, 2])
    _, eagle = h.eagle_workers(sa, spec_v2=worker == "v2")
    fc_inputs = h.record_fc_inputs(eagle)
    fc = (eagle.draft_worker.draft_runner if h.is_spec_v2(eagle) else eagle.draft_model_runner).model.model.fc
    try:
        runner = h.capture_draft_extend_graphs_eagerly(eagle)
    except h.UnsupportedHere as exc:
        return {"skip": str(exc)}
    except Exception as exc:  # noqa: BLE001 - returned to the test
        return {"error": type(exc).__name__, "message": str(exc), "fc_inputs": fc_inputs}
    return {
        "error": None,
        "mode": runner.forward_mode.name,
        "buffer": h.draft_extend_buffer_width(runner),
        "fc_in_features": fc.in_features,
        "fc_inputs": fc_inputs,
    }


@pytest.fixture(scope="module")
def no_aux_draft(tiny_root):
    """The tiny draft with eagle_config.use_aux_hidden_state: false (the target then captures nothing)."""
    return build_no_aux_draft(tiny_root / "draft-no-aux-states")


def _skip_if_asked(out: dict) -> dict:
    if "skip" in out:
        pytest.skip(out["skip"])
    return out


@pytest.mark.parametrize("worker", WORKERS)
def test_draft_extend_graph_capture_feeds_fc_3h_and_the_guard_passes(tiny, worker):
    out = _skip_if_asked(
        run_isolated(_capture_draft_extend, str(tiny["deepseek_v3"]), str(tiny["draft"]), worker, patches="all")
    )
    assert out["error"] is None, out.get("message")
    assert out["mode"] == {"v1": "DRAFT_EXTEND", "v2": "DRAFT_EXTEND_V2"}[worker]
    assert out["buffer"] == out["fc_in_features"] == 3 * tm.HIDDEN
    assert out["fc_inputs"] and {shape[-1] for shape in out["fc_inputs"]} == {3 * tm.HIDDEN}


@pytest.mark.stock
@pytest.mark.parametrize("worker", WORKERS)
def test_stock_draft_extend_graph_capture_without_aux_states_skips_fc_silently(tiny, no_aux_draft, worker):
    out = _skip_if_asked(
        run_isolated(_capture_draft_extend, str(tiny["deepseek_v3"]), str(no_aux_draft), worker, patches=None)
    )
    assert out["error"] is None and out["buffer"] == tm.HIDDEN
    assert out["fc_inputs"] == []  # fc never ran: the graphs would bake the skip in


@pytest.mark.parametrize("worker", WORKERS)
def test_draft_extend_graph_capture_without_aux_states_is_refused_in_our_words(tiny, no_aux_draft, worker):
    out = _skip_if_asked(
        run_isolated(_capture_draft_extend, str(tiny["deepseek_v3"]), str(no_aux_draft), worker, patches="all")
    )
    assert out["error"] == "Eagle3CaptureError", out
    assert "Capture cuda graph failed" not in out["message"]  # not sglang's graph-memory advice
    assert f"{3 * tm.HIDDEN} = fc.in_features" in out["message"]
    assert "use_aux_hidden_state" in out["message"]
    assert out["fc_inputs"] == []


def _empty_batches(target: str, draft: str) -> dict:
    """An EXTEND batch of no rows, as data-parallel attention and other schedulers can hand a rank: through the real
    draft ModelRunner stock and then with the guard (the outcome must be the same: the guard changes nothing for no
    rows), and the guard itself on the real draft model and a real ForwardBatch whose states have no rows."""
    import torch
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
    from sglang.srt.speculative.eagle_info import EagleDraftInput
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from eagle3_patches.patches import eagle3_fc_guard
    from eagle3_patches.selftest.scenarios import apply_patch_set, outcome
    from eagle3_patches.testing import sglang_harness as h

    sa = h.eagle3_server_args(target, draft, load_format="dummy")
    target_runner = h.model_runner(sa)
    runner = h.draft_runner(sa, target_runner)
    hidden = runner.model.config.hidden_size

    def forward_batch(rows: int, width: int):
        batch = h.schedule_batch(
            h.make_reqs([list(range(5, 5 + rows))] if rows else []), runner, SpeculativeAlgorithm.EAGLE3
        )
        batch.prepare_for_extend()
        batch.spec_info = EagleDraftInput(hidden_states=torch.randn(rows, width))
        batch.capture_hidden_mode = CaptureHiddenMode.LAST
        fb = h.forward_batch(h.worker_batch(batch), runner)
        fb.forward_mode = ForwardMode.EXTEND
        return fb

    def through_the_runner() -> dict:
        out = {}
        for width in (hidden, 3 * hidden):
            with torch.no_grad():  # the batch is built inside: 0.5.23 refuses no requests while preparing it
                kind, value = outcome(lambda w=width: runner.forward(forward_batch(0, w)))
            out[width] = (kind, None if kind == "ok" else value)  # the logits output itself is not compared
        return out

    stock = through_the_runner()
    states = apply_patch_set(["eagle3_fc_guard"])
    guarded = through_the_runner()

    def guard(rows: int, width: int):
        fb = forward_batch(max(rows, 1), width)
        fb.spec_info.hidden_states = torch.randn(rows, width)  # the rows the batch carries (none, or some)
        return outcome(eagle3_fc_guard._guard, lambda *a, **k: "forwarded", runner.model.model, (None, None, fb), {})

    return {
        "state": states["eagle3_fc_guard"],
        "stock": stock,
        "guarded": guarded,
        "guard": {
            f"{rows}x{width // hidden}H": guard(rows, width) for rows in (0, 1) for width in (hidden, 3 * hidden)
        },
    }


@pytest.mark.runtime_only
def test_the_guard_stays_silent_on_a_batch_of_no_rows(tiny):
    """The exemption of an empty batch: no rows of the plain hidden width are not the field's fc skip. Through the
    real draft runner the guard changes nothing (on 0.5.9 the runner itself refuses an EXTEND batch of no requests
    before the model runs, stock or guarded, so none reaches the guard there; 0.5.23 refuses it earlier, while the
    batch is prepared; a later release may let one through),
    and the guard, handed such a batch, forwards it; one row of the same width is refused."""
    out = run_isolated(_empty_batches, str(tiny["deepseek_v3"]), str(tiny["draft"]))
    assert out["state"] == "applied"
    assert out["guarded"] == out["stock"]
    assert all(kind != "Eagle3CaptureError" for kind, _ in out["guarded"].values())
    guard = out["guard"]
    assert guard["0x1H"] == guard["0x3H"] == guard["1x3H"] == ("ok", "forwarded")
    assert guard["1x1H"][0] == "Eagle3CaptureError" and f"{tm.HIDDEN}-wide hidden states" in guard["1x1H"][1]
