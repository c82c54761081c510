"""hicache_draft_kv: HiCache beside a draft model is refused in the launcher where HiCache restores only the target's
KV."""

from __future__ import annotations

from .. import scenarios as sc
from ..base import Check, Context, Finding, describe_error

HICACHE = {"enable_hierarchical_cache": True}


def hicache_refused(ctx: Context) -> Finding:
    kimi, draft = ctx.path("kimi_k25"), ctx.path("draft")
    cases = {"hicache": (kimi, draft, "EAGLE3", HICACHE), "no_hicache": (kimi, draft, "EAGLE3")}
    seen = ctx.observe(sc.stock_then_patched, sc.launcher_outcomes, cases, ctx.overrides())
    if seen[0] != "ok":
        return Finding(False, describe_error(seen), None)
    stock, patched = seen[1]["stock"], seen[1]["patched"]
    state, state_reason = seen.patch("hicache_draft_kv")
    if state in ("upstream", "not-applicable"):
        # the release's HiCache moves the draft's KV (the patch's upstream probe): nothing to refuse, and a launch
        # the launcher resolves is the right one; the launcher alone cannot see which KV HiCache restores
        resolved = patched["hicache"] == ("ok", "EAGLE3")
        text = f"HiCache with EAGLE3 {'resolves' if resolved else describe_error(patched['hicache'])}"
        return Finding(resolved, text, False, text, state, state_reason, observations=seen[1])
    bug = stock["hicache"] == ("ok", "EAGLE3")
    stock_text = (
        "HiCache with EAGLE3 resolved: the draft's KV is not restored with the target's"
        if bug
        else f"HiCache with EAGLE3: {describe_error(stock['hicache'])}"
    )
    refused = patched["hicache"]
    fixed = (
        refused[0] == "Eagle3ConfigError"
        and "--enable-hierarchical-cache" in refused[1]
        and patched["no_hicache"] == ("ok", "EAGLE3")
    )
    patched_text = f"HiCache with EAGLE3 refused ({describe_error(refused)}); without HiCache it resolves"
    return Finding(fixed, patched_text, bug, stock_text, state, state_reason, observations=seen[1])


CHECKS: tuple[Check, ...] = (
    Check(
        "hicache_draft_kv",
        "HiCache with an EAGLE-3 draft is refused at start where it would restore only the target's KV",
        hicache_refused,
        patch="hicache_draft_kv",
    ),
)
