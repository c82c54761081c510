"""What several patches' checks share: the layers the tiny targets capture; the check of a patch for multimodal
wrapper targets."""

from __future__ import annotations

from ...testing.tiny_models import DRAFT_AUX_IDS, HIDDEN
from .. import scenarios as sc
from ..base import Context, Finding, describe_error

CONFIGURED = [i + 1 for i in DRAFT_AUX_IDS]  # what sglang's target captures for them (before layer id + 1)


def wrapper_check(patch: str, targets: tuple[str, ...]):
    """The check of ``patch``, a patch that makes multimodal wrapper targets capture: ``targets`` are its tiny
    checkpoints (one a wrapper class)."""

    def check(ctx: Context) -> Finding:
        """Each tiny target of the patch's classes through the real EAGLE worker, stock and patched."""
        state: tuple[str | None, str] = (None, "")
        want, bugs, stock_text, fixed_all, texts = [(5, 3 * HIDDEN)], [], [], True, []
        for name in targets:
            args = (ctx.path(name), ctx.path("draft"), ctx.overrides())
            stock = ctx.observe(sc.wrapper_eagle3_prefill, *args)
            patched = ctx.observe(sc.wrapper_eagle3_prefill, *args, patches=[patch])
            missing = stock[0] != "ok" and any(
                h in str(stock[1]) for h in ("set_eagle3_layers_to_capture", "get_embed_and_head")
            )
            bugs.append(missing)
            stock_text.append(
                f"{name}: "
                + (
                    "fails at start without set_eagle3_layers_to_capture"
                    if missing
                    else describe_error(stock)
                    if stock[0] != "ok"
                    else f"fc {stock[1]['fc_inputs']}"
                )
            )
            ok = (
                patched[0] == "ok" and patched[1]["fc_inputs"] == want and patched[1]["layers_to_capture"] == CONFIGURED
            )
            fixed_all &= ok
            texts.append(
                f"{name}: "
                + (
                    f"fc received {patched[1]['fc_inputs']} from layers {patched[1]['layers_to_capture']}"
                    if patched[0] == "ok"
                    else describe_error(patched)
                )
            )
            state = patched.patch(patch)
        return Finding(fixed_all, "; ".join(texts), all(bugs), "; ".join(stock_text), *state)

    return check
