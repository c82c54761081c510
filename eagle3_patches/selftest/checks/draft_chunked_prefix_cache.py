"""draft_chunked_prefix_cache: the draft's model runner leaves the target's chunked-prefix-cache switch alone."""

from __future__ import annotations

from ..base import Check, Context, Finding, describe_error
from ..scenarios import apply_patch_set, outcome

ON = {"target": False, "draft": False}  # disable_chunked_prefix_cache after each runner's adjustment


def switch_left(ctx: Context) -> Finding:
    """One process: the target's and the draft's adjustment on their shared ``ServerArgs``, stock, then with the patch
    set applied (scenario ``chunked_prefix_switch``)."""
    seen = ctx.observe(chunked_prefix_switch, ctx.path("deepseek_v3"), ctx.path("draft"), ctx.overrides(), True)
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


# the scenario, run in an isolated process (``ctx.observe``)
def chunked_prefix_switch(target: str, draft: str, overrides: dict | None = None, then_patched: bool = False) -> dict:
    """The real target and draft model runners on their shared ``ServerArgs``, each running its own
    ``model_specific_adjustment`` as it does when it is built, with an MLA backend that reads the chunked prefix cache
    named (fa3: the flag value only, no kernel runs) and the switch on.  ``{"target": switch after the target's
    adjustment, "draft": after the draft's}`` (``disable_chunked_prefix_cache``); ``then_patched``: again after the
    patch set was applied in this process, ``{"stock": ..., "patched": ...}``."""
    from eagle3_patches.testing import sglang_harness as h

    sa = h.eagle3_server_args(target, draft, **(overrides or {}))
    target_runner = h.model_runner(sa)
    draft_runner = h.draft_runner(sa, target_runner)
    backend = sa.attention_backend

    def run() -> dict:
        sa.attention_backend, sa.disable_chunked_prefix_cache = "fa3", False
        try:
            target_runner.model_specific_adjustment()
            after_target = sa.disable_chunked_prefix_cache
            draft_runner.model_specific_adjustment()
            return {"target": after_target, "draft": sa.disable_chunked_prefix_cache}
        finally:
            sa.attention_backend = backend

    stock = outcome(run)
    if not then_patched:
        return {"stock": stock}
    apply_patch_set()
    return {"stock": stock, "patched": outcome(run)}
