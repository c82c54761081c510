"""aux_capture_validation: uncapturable or duplicate layer ids are refused when they are set."""

from __future__ import annotations

from ...testing.tiny_models import HIDDEN, NUM_LAYERS
from ..base import Check, Context, Finding, describe_error
from ..scenarios import PROMPTS, apply_patch_set, outcome

CAPTURE_CASES = {"good": [1, 2, 3], "last": [1, 2, NUM_LAYERS - 1], "duplicate": [1, 1, 3]}


def aux_validation(ctx: Context) -> Finding:
    """One process: the cases on stock sglang, then on the same model with the patch set applied (the setter and
    the forward are what the fix changes)."""
    seen = ctx.observe(capture_outcomes, ctx.path("deepseek_v3"), CAPTURE_CASES, ctx.overrides(), True)
    if seen[0] != "ok":
        return Finding(False, describe_error(seen), None)
    s, p = seen[1]["stock"], seen[1]["patched"]
    lost = [n for n in ("last", "duplicate") if s[n][0] == "ok" and s[n][1][-1] < 3 * HIDDEN]
    bug = bool(lost)
    stock_text = (
        f"ids {CAPTURE_CASES['last']} and {CAPTURE_CASES['duplicate']} on a {NUM_LAYERS}-layer target: "
        f"{s['last'][1]} and {s['duplicate'][1]}, no error"
        if bug
        else f"last {s['last']}, duplicate {s['duplicate']}"
    )
    fixed = (
        p["good"] == ("ok", (5, 3 * HIDDEN))
        and p["last"][0] == "Eagle3ConfigError"
        and "cannot be captured" in p["last"][1]
        and p["duplicate"][0] == "Eagle3ConfigError"
    )
    patched_text = (
        f"valid ids capture {p['good'][1]}; {CAPTURE_CASES['last']}: {describe_error(p['last'])}; "
        f"{CAPTURE_CASES['duplicate']}: {p['duplicate'][0]}"
    )
    return Finding(fixed, patched_text, bug, stock_text, *seen.patch("aux_capture_validation"), observations=seen[1])


CHECKS: tuple[Check, ...] = (
    Check(
        "aux_capture_validation",
        "uncapturable or duplicate layer ids are refused when they are set",
        aux_validation,
        patch="aux_capture_validation",
        runs_on="<0.5.13",
        outside="the ids mean something else from 0.5.13 (layer_id_convention's check covers them)",
    ),
)


# the scenario, run in an isolated process (``ctx.observe``)
def capture_outcomes(
    target: str, cases: dict[str, list], overrides: dict | None = None, then_patched: bool = False
) -> dict:
    """For each case, the ids set on a real target model and one capturing prefill: ``("ok", aux shape)``
    or ``(exception type, message)``.  ``then_patched``: the cases again on the same model after the patch set
    was applied in this process: ``{"stock": ..., "patched": ...}``."""
    from eagle3_patches.testing import sglang_harness as h

    runner = h.model_runner(h.server_args(target, **(overrides or {})))
    model = runner.model

    def run_cases() -> dict:
        out = {}
        for name, ids in cases.items():
            model.model.layers_to_capture = []

            def run(ids=ids):
                model.set_eagle3_layers_to_capture(ids)
                step = h.prefill(runner, PROMPTS[:1], return_hidden_states=True)
                return tuple(step.logits_output.hidden_states.shape)

            out[name] = outcome(run)
        return out

    stock = run_cases()
    if not then_patched:
        return stock
    apply_patch_set()
    return {"stock": stock, "patched": run_cases()}
