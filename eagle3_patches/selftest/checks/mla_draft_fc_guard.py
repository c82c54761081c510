"""mla_draft_fc_guard: H-wide states at the MLA draft raise instead of skipping fc; with EAGLE3 fc gets 3 x H."""

from __future__ import annotations

from ...testing.tiny_models import HIDDEN
from .. import scenarios as sc
from ..base import Check, Context, Finding, describe_error


def fc_skip(ctx: Context) -> Finding:
    """--speculative-algorithm EAGLE with the MLA draft beside the tiny Kimi-K2.5 (the algorithm guard disabled):
    stock, then the same workers with the patch set; and EAGLE3 under the patch set, where fc gets 3 x H."""
    target, draft = ctx.path("kimi_k25"), ctx.path("mla_draft")
    seen = ctx.observe(
        sc.eagle_without_capture,
        target,
        draft,
        ctx.overrides(),
        True,
        env={"EAGLE3_PATCHES_DISABLE": "eagle3_algorithm_guard"},
    )
    if seen[0] != "ok":
        return Finding(False, f"the EAGLE worker did not start: {describe_error(seen)}", None)
    widths = ctx.observe(sc.eagle_prefill_fc_widths, target, draft, False, ctx.overrides(), patches="all")
    if widths[0] != "ok":
        return Finding(False, f"the EAGLE3 worker did not start: {describe_error(widths)}", None)
    s, p = seen[1]["stock"], seen[1]["patched"]
    fc_inputs = widths[1]["fc_inputs"]
    bug = s["error"] is None and s["fc_inputs"] == []
    stock_text = (
        "H-wide states reached the MLA draft; fc never ran, nothing raised"
        if bug
        else f"fc inputs {s['fc_inputs']}, error {s['error'] or 'none'}"
    )
    fed = bool(fc_inputs) and all(shape[-1] == 3 * HIDDEN for shape in fc_inputs)
    fixed = (
        p["error"] == "Eagle3CaptureError"
        and "--speculative-algorithm EAGLE3" in p["message"]
        and p["fc_inputs"] == []
        and fed
    )
    patched_text = (
        f"EAGLE refused: {describe_error((p['error'], p['message']))}" if p["error"] else "EAGLE: nothing raised"
    ) + f"; EAGLE3: fc inputs {fc_inputs}"
    return Finding(
        fixed,
        patched_text,
        bug,
        stock_text,
        *seen.patch("mla_draft_fc_guard"),
        observations={**seen[1], "eagle3": widths[1]},
    )


CHECKS: tuple[Check, ...] = (
    Check(
        "mla_draft_fc_guard",
        "H-wide states at the MLA draft are refused naming the flag; with EAGLE3 its fc gets 3 x hidden",
        fc_skip,
        patch="mla_draft_fc_guard",
        runs_on=">=0.5.12",
        outside="sglang's MLA draft class (models/kimi_k25_eagle3.py) arrived in 0.5.12",
    ),
)
