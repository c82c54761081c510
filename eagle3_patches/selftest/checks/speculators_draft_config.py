"""speculators_draft_config: a speculators-format draft served directly loads the parameters of its conversion."""

from __future__ import annotations

from .. import scenarios as sc
from ..base import Check, Context, Finding, describe_error


def speculators_served(ctx: Context) -> Finding:
    """The speculators fixture (written by the real speculators library) as the draft itself, and converted."""
    target = ctx.path("deepseek_v3")
    drafts = [ctx.path("speculators_draft"), ctx.path("speculators_converted")]
    stock = ctx.observe(sc.load_drafts_to_host, target, drafts[:1], ctx.overrides())
    patched = ctx.observe(sc.load_drafts_to_host, target, drafts, ctx.overrides(), patches="all")
    bug = stock[0] != "ok" or not stock[1][0]["ok"]
    stock_text = "sglang cannot read the speculators config" if bug else "sglang loaded the speculators draft"
    if patched[0] != "ok":
        return Finding(False, describe_error(patched), bug, stock_text)
    direct, converted = patched[1]
    diff = (
        sc.differing_tensors(direct.get("params"), converted.get("params"))
        if direct["ok"] and converted["ok"]
        else None
    )
    fixed = diff == []
    text = (
        "served directly: the same parameters as the converted draft, bit for bit"
        if fixed
        else f"direct {direct.get('message') or 'loaded'}; differs from converted in {diff}"
    )
    return Finding(fixed, text, bug, stock_text, *patched.patch("speculators_draft_config"))


CHECKS: tuple[Check, ...] = (
    Check(
        "speculators_draft_config",
        "a speculators-format draft served directly loads the parameters of its conversion",
        speculators_served,
        patch="speculators_draft_config",
    ),
)
