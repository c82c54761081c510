"""eagle3_image_draft_rows: EAGLE3 with image input is refused in the launcher where the draft's prefill reads wrong
rows for image requests."""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

from ...checkpoint.releases import MM_DRAFT_EMBEDS_COPIED_FROM
from .. import scenarios as sc
from ..base import Check, Context, Finding, describe_error

RESOLVED = ("ok", "EAGLE3")


def _srt() -> Path:
    spec = find_spec("sglang")
    return Path(spec.origin if spec and spec.origin else "").parent / "srt"


def image_rows_refused(ctx: Context) -> Finding:
    from eagle3_patches.patches import eagle3_image_draft_rows as ir

    kimi, draft, text = ctx.path("kimi_k25"), ctx.path("draft"), ctx.path("deepseek_v3")
    cases = {
        # sglang's own default: multimodal input on for Kimi-K2.5 (its ModelConfig decides)
        "image": (kimi, draft, "EAGLE3", {"enable_multimodal": None}),
        "text_only": (kimi, draft, "EAGLE3", {"enable_multimodal": False}),
        "text_target": (text, draft, "EAGLE3", {"enable_multimodal": None}),
    }
    seen = ctx.observe(sc.stock_then_patched, sc.launcher_outcomes, cases, ctx.overrides())
    if seen[0] != "ok":
        return Finding(False, describe_error(seen), None)
    stock, patched = seen[1]["stock"], seen[1]["patched"]
    state, state_reason = seen.patch("eagle3_image_draft_rows")
    srt = _srt()
    # the bug, read from the installed release's own source: the draft reads the target's rows, without all the fixes
    bug = ir.reads_target_rows(srt) and not ir.fixed_upstream(srt)
    resolved = stock["image"] == RESOLVED
    stock_text = (
        f"EAGLE3 with image input resolves; the draft reads the target's rows ({'without' if bug else 'with'} "
        "every fix of them in this release's source)"
        if resolved
        else f"EAGLE3 with image input: {describe_error(stock['image'])}"
    )
    silent = all(patched[c] == RESOLVED for c in ("text_only", "text_target"))
    if bug:
        refused = patched["image"]
        fixed = (
            refused[0] == "Eagle3ConfigError" and f"sglang >= {MM_DRAFT_EMBEDS_COPIED_FROM}" in refused[1] and silent
        )
        patched_text = f"image input refused ({describe_error(refused)}); text only and a text target resolve"
    else:
        fixed = patched["image"] == RESOLVED and silent
        patched_text = f"image input {'resolves' if fixed else describe_error(patched['image'])}: nothing to refuse"
    return Finding(
        fixed, patched_text, bug if resolved else None, stock_text, state, state_reason, observations=seen[1]
    )


CHECKS: tuple[Check, ...] = (
    Check(
        "eagle3_image_draft_rows",
        "EAGLE3 with image input is refused at start where the draft's prefill reads wrong rows for images",
        image_rows_refused,
        patch="eagle3_image_draft_rows",
    ),
)
