"""What several patches' checks share: the layers the tiny targets capture; the check of a patch for multimodal
wrapper targets."""

from __future__ import annotations

from typing import Any

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


def drafts_loaded(ctx: Context, target: str, names: tuple[str, ...]) -> tuple[dict[str, Any], dict, dict] | Finding:
    """Every draft of ``names`` loaded into a real draft ``ModelRunner`` beside ``target``, stock and then with the
    patch set: ``(observations, stock by name, patched by name)``, or the failing :class:`Finding` when a runner
    could not be built."""
    paths = {n: ctx.path(n) for n in names}
    stock = ctx.observe(sc.load_drafts_to_host, ctx.path(target), list(paths.values()), ctx.overrides())
    patched = ctx.observe(
        sc.load_drafts_to_host, ctx.path(target), list(paths.values()), ctx.overrides(), patches="all"
    )
    obs: dict[str, Any] = {"stock": stock, "patched": patched, "paths": paths}
    if stock[0] != "ok" or patched[0] != "ok":
        failed = stock if stock[0] != "ok" else patched
        return Finding(False, f"the draft runner could not be built: {describe_error(failed)}", None, observations=obs)
    s, p = dict(zip(names, stock[1])), dict(zip(names, patched[1]))
    obs.update(stock_by_name=s, patched_by_name=p)
    return obs, s, p
