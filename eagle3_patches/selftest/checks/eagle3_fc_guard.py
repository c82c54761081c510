"""eagle3_fc_guard: H-wide states at the draft raise instead of skipping fc (eager, and in draft-extend CUDA graphs)."""

from __future__ import annotations

from ...testing.tiny_models import HIDDEN
from .. import device_scenarios as ds
from .. import scenarios as sc
from ..base import Check, Context, Finding, describe_error


def fc_skip(ctx: Context) -> Finding:
    """--speculative-algorithm EAGLE with the EAGLE-3 draft: nothing captured; is fc skipped in silence?  One process:
    stock first, then the same workers with the patch set applied.  The algorithm guard, which would refuse the
    flag before any worker exists, is disabled (a fork-path install has it in sglang's source)."""
    seen = ctx.observe(
        sc.eagle_without_capture,
        ctx.path("deepseek_v3"),
        ctx.path("draft"),
        ctx.overrides(),
        True,
        env={"EAGLE3_PATCHES_DISABLE": "eagle3_algorithm_guard"},
    )  # also where it is in sglang's source
    if seen[0] != "ok":
        return Finding(False, f"the EAGLE worker did not start: {describe_error(seen)}", None)
    s, p = seen[1]["stock"], seen[1]["patched"]
    bug = s["error"] is None and s["fc_inputs"] == []
    stock_text = (
        "H-wide states reached the draft; fc never ran, nothing raised"
        if bug
        else f"fc inputs {s['fc_inputs']}, error {s['error'] or 'none'}"
    )
    fixed = (
        p["error"] == "Eagle3CaptureError" and "--speculative-algorithm EAGLE3" in p["message"] and p["fc_inputs"] == []
    )
    patched_text = (
        f"refused: {describe_error((p['error'], p['message']))}"
        if p["error"]
        else f"nothing raised; fc inputs {p['fc_inputs']}"
    )
    return Finding(fixed, patched_text, bug, stock_text, *seen.patch("eagle3_fc_guard"), observations=seen[1])


def draft_extend_graph(ctx: Context) -> Finding:
    target, draft, no_aux = ctx.path("deepseek_v3"), ctx.path("draft"), ctx.path("no_aux_draft")
    good = ctx.observe(ds.draft_extend_graphs, target, draft, ctx.overrides(), patches="all")
    stock = ctx.observe(ds.draft_extend_graphs, target, no_aux, ctx.overrides())
    refused = ctx.observe(ds.draft_extend_graphs, target, no_aux, ctx.overrides(), patches="all")
    obs = {"good": good, "stock_no_aux": stock, "patched_no_aux": refused}
    if stock[0] != "ok" or good[0] != "ok" or refused[0] != "ok":
        return Finding(
            False, describe_error(next(x for x in (good, stock, refused) if x[0] != "ok")), None, observations=obs
        )
    g, s, r = good[1], stock[1], refused[1]
    bug = s["error"] is None and s["fc_inputs"] == []
    stock_text = (
        "draft-extend graphs captured from an H-wide buffer with use_aux_hidden_state false: fc never ran"
        if bug
        else f"use_aux_hidden_state false: {s['error'] or 'captured'}, fc inputs {sorted(set(s['fc_inputs']))}"
    )
    good_ok = (
        g["error"] is None
        and g["captured"]
        and {x[-1] for x in g["fc_inputs"]} == {3 * HIDDEN}
        and g["buffer"] in (None, 3 * HIDDEN)
    )
    ours = r["error"] == "Eagle3CaptureError" and "Capture cuda graph failed" not in r["message"]
    patched_text = (
        f"draft-extend graphs captured ({g['runner']}, buffer {g['buffer']}, fc inputs "
        f"{sorted({x[-1] for x in g['fc_inputs']})} wide); use_aux_hidden_state false: "
        f"{describe_error((r['error'], r['message'])) if r['error'] else 'NOT refused'}"
    )
    if g["error"]:
        patched_text = f"the correct draft's graphs failed: {describe_error((g['error'], g['message']))}"
    return Finding(good_ok and ours, patched_text, bug, stock_text, *refused.patch("eagle3_fc_guard"), observations=obs)


CHECKS: tuple[Check, ...] = (
    Check(
        "eagle3_fc_guard",
        "H-wide states at the draft (nothing captured) raise instead of skipping fc",
        fc_skip,
        patch="eagle3_fc_guard",
    ),
    Check(
        "draft_extend_cuda_graph",
        "draft-extend CUDA graphs capture 3 x hidden into fc; use_aux_hidden_state false is refused in our words",
        draft_extend_graph,
        patch="eagle3_fc_guard",
        needs=("cuda",),
    ),
)
