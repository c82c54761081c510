"""eagle3_algorithm_guard: ``--speculative-algorithm EAGLE`` with an EAGLE-3 draft is refused in the launcher."""

from __future__ import annotations

from .. import scenarios as sc
from ..base import Check, Context, Finding, describe_error


def algorithm_guard(ctx: Context) -> Finding:
    kimi, draft = ctx.path("kimi_k25"), ctx.path("draft")
    cases = {"EAGLE": (kimi, draft, "EAGLE"), "EAGLE3": (kimi, draft, "EAGLE3")}
    seen = ctx.observe(sc.stock_then_patched, sc.launcher_outcomes, cases, ctx.overrides())
    if seen[0] != "ok":
        return Finding(False, describe_error(seen), None)
    stock, patched = seen[1]["stock"], seen[1]["patched"]
    bug = stock["EAGLE"] == ("ok", "EAGLE")
    stock_text = (
        "--speculative-algorithm EAGLE with the EAGLE-3 draft accepted as EAGLE"
        if bug
        else f"EAGLE with the EAGLE-3 draft: {describe_error(stock['EAGLE'])}"
    )
    refused = patched["EAGLE"]
    fixed = (
        refused[0] == "Eagle3ConfigError"
        and "--speculative-algorithm EAGLE3" in refused[1]
        and patched["EAGLE3"] == ("ok", "EAGLE3")
    )
    patched_text = f"EAGLE refused ({describe_error(refused)}); EAGLE3 resolves to {patched['EAGLE3'][1]}"
    return Finding(fixed, patched_text, bug, stock_text, *seen.patch("eagle3_algorithm_guard"), observations=seen[1])


CHECKS: tuple[Check, ...] = (
    Check(
        "eagle3_algorithm_guard",
        "--speculative-algorithm EAGLE with an EAGLE-3 draft is refused at start",
        algorithm_guard,
        patch="eagle3_algorithm_guard",
    ),
)
