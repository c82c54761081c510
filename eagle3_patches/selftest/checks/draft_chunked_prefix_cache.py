"""draft_chunked_prefix_cache: the draft's model runner leaves the target's chunked-prefix-cache switch alone."""

from __future__ import annotations

from .. import scenarios as sc
from ..base import Check, Context, Finding, describe_error

ON = {"target": False, "draft": False}  # disable_chunked_prefix_cache after each runner's adjustment


def switch_left(ctx: Context) -> Finding:
    """One process: the target's and the draft's adjustment on their shared ``ServerArgs``, stock, then with the patch
    set applied (scenario ``chunked_prefix_switch``)."""
    seen = ctx.observe(sc.chunked_prefix_switch, ctx.path("deepseek_v3"), ctx.path("draft"), ctx.overrides(), True)
    if seen[0] != "ok":
        return Finding(False, describe_error(seen), None)
    s, p = seen[1]["stock"], seen[1]["patched"]
    bug = s == ("ok", {"target": False, "draft": True})
    stock_text = (
        "the target left the chunked prefix cache on (fa3, MLA); the Llama draft's adjustment turned it off"
        if bug
        else f"after the target's and the draft's adjustment: {s}"
    )
    fixed = p == ("ok", ON)
    patched_text = "the switch stays as the target set it (on)" if fixed else f"after both adjustments: {p}"
    return Finding(
        fixed, patched_text, bug, stock_text, *seen.patch("draft_chunked_prefix_cache"), observations=seen[1]
    )


CHECKS: tuple[Check, ...] = (
    Check(
        "draft_chunked_prefix_cache",
        "the draft's model runner leaves the target's chunked-prefix-cache switch as the target set it",
        switch_left,
        patch="draft_chunked_prefix_cache",
        runs_on="<0.5.16",
        outside="from 0.5.16 the draft runner returns before it sets the switch",
    ),
)
