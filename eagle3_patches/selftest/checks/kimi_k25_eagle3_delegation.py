"""kimi_k25_eagle3_delegation: the real EAGLE worker on the tiny Kimi-K2.5 gets ``[tokens, 3 x hidden]`` into fc."""

from __future__ import annotations

from ...testing.tiny_models import HIDDEN
from .. import scenarios as sc
from ..base import Check, Context, Finding, describe_error
from ._shared import CONFIGURED

TOKENS = sum(len(p) for p in sc.PROMPTS)


def kimi_fc_width(ctx: Context) -> Finding:
    """Stock and patched: the real TpModelWorker + EAGLE worker on the tiny Kimi-K2.5, one prefill."""
    args = (ctx.path("kimi_k25"), ctx.path("draft"))
    stock = ctx.observe(sc.eagle_prefill_fc_widths, *args, overrides=ctx.overrides())
    patched = ctx.observe(sc.eagle_prefill_fc_widths, *args, overrides=ctx.overrides(), patches="all")
    want = [(TOKENS, 3 * HIDDEN)]

    if stock[0] == "ok":
        bug = stock[1]["fc_inputs"] != want
        stock_text = f"fc received {stock[1]['fc_inputs']} (target captured layers {stock[1]['layers_to_capture']})"
    else:
        missing = any(m in stock[1] for m in ("set_eagle3_layers_to_capture", "get_embed_and_head"))
        bug = True if missing and stock[0] == "AttributeError" else None
        stock_text = f"the EAGLE worker did not start: {describe_error(stock)}"
    if patched[0] != "ok":
        return Finding(
            False,
            f"the EAGLE worker did not start: {describe_error(patched)}",
            bug,
            stock_text,
            observations={"stock": stock, "patched": patched},
        )
    p = patched[1]
    fixed = p["fc_inputs"] == want and p["target_width"] == want[0] and p["layers_to_capture"] == CONFIGURED
    text = (
        f"target captured layers {p['layers_to_capture']} -> [{p['target_width'][0]}, {p['target_width'][1]}]; "
        f"fc received {p['fc_inputs']} (want {want}: 3 x hidden {HIDDEN})"
    )
    return Finding(
        fixed, text, bug, stock_text, *patched.patch("kimi_k25_eagle3_delegation"), {"stock": stock, "patched": patched}
    )


CHECKS: tuple[Check, ...] = (
    Check(
        "kimi_k25_eagle3_delegation",
        "real TpModelWorker + EAGLE worker on the tiny Kimi-K2.5: [tokens, 3 x hidden] reaches fc",
        kimi_fc_width,
        patch="kimi_k25_eagle3_delegation",
    ),
)
