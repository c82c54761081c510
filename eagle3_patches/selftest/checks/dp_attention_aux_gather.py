"""dp_attention_aux_gather: with DP attention and an all-to-all MoE backend, each captured aux state holds this
rank's tokens only."""

from __future__ import annotations

from ...testing.tiny_models import HIDDEN
from .. import scenarios as sc
from ..base import Check, Context, Finding, describe_error


def gathered_rows(ctx: Context) -> Finding:
    """One process: a capturing prefill on stock sglang, then on the same model with the patch set applied, with TP 2
    and DP attention 2 emulated (scenario ``a2a_capture_rows``)."""
    seen = ctx.observe(sc.a2a_capture_rows, ctx.path("deepseek_v3"), ctx.overrides(), True)
    if seen[0] != "ok":
        return Finding(False, describe_error(seen), None)
    s, p = seen[1]["stock"], seen[1]["patched"]
    tokens = len(sc.PROMPTS[0])
    bug = s == ("ok", (2 * tokens, 3 * HIDDEN))
    stock_text = (
        f"{tokens} tokens, {s[1][0]} rows of aux states stored for the draft: another rank's tokens mixed in, no error"
        if s[0] == "ok"
        else describe_error(s)
    )
    fixed = p == ("ok", (tokens, 3 * HIDDEN))
    patched_text = f"{tokens} tokens, {p[1][0]} rows of aux states" if p[0] == "ok" else describe_error(p)
    return Finding(fixed, patched_text, bug, stock_text, *seen.patch("dp_attention_aux_gather"), observations=seen[1])


CHECKS: tuple[Check, ...] = (
    Check(
        "dp_attention_aux_gather",
        "with DP attention and an all-to-all MoE backend, the captured aux states hold this rank's tokens only",
        gathered_rows,
        patch="dp_attention_aux_gather",
        runs_on="<0.5.10",
        outside="from 0.5.10 sglang gathers the captured aux states over the attention-TP group",
    ),
)
