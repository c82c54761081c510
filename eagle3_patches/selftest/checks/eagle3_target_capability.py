"""eagle3_target_capability: EAGLE3 with a target that cannot capture is refused in the launcher."""

from __future__ import annotations

from .. import scenarios as sc
from ..base import Check, Context, Finding, describe_error


def capability_outcomes(cases: dict, overrides: dict) -> dict:
    """Child side of :func:`target_capability`: the launcher outcomes, and which capture hooks each target's
    sglang class lacks."""
    return {
        "outcomes": sc.launcher_outcomes(cases, overrides),
        "missing": {name: missing_capture_hooks(target) for name, (target, _, _) in cases.items()},
    }


def target_capability(ctx: Context) -> Finding:
    draft = ctx.path("draft")
    cases = {
        "no_capture": (ctx.path("no_capture_target"), draft, "EAGLE3"),
        "kimi": (ctx.path("kimi_k25"), draft, "EAGLE3"),
        "deepseek": (ctx.path("deepseek_v3"), draft, "EAGLE3"),
    }
    seen = ctx.observe(sc.stock_then_patched, capability_outcomes, cases, ctx.overrides())
    if seen[0] != "ok":
        return Finding(False, describe_error(seen), None)
    stock, patched = seen[1]["stock"], seen[1]["patched"]
    missing = stock["missing"]["no_capture"]
    if not missing:
        bug, stock_text = (
            None,
            "GPT2LMHeadModel has the EAGLE-3 capture hooks on this release: no tiny target lacks them",
        )
    else:
        bug = stock["outcomes"]["no_capture"][0] == "ok"
        stock_text = (
            f"the launcher accepted EAGLE3 with a GPT2LMHeadModel target (no {', '.join(missing)}): every rank "
            "would fail later"
            if bug
            else f"refused: {describe_error(stock['outcomes']['no_capture'])}"
        )
    refused = patched["outcomes"]["no_capture"]
    # Eagle3TargetError; the fork-path diff (sglang's own source, no eagle3_patches import) names its class
    # Eagle3ConfigError
    ours = refused[0] in ("Eagle3TargetError", "Eagle3ConfigError") and str(refused[1]).startswith("eagle3-patches:")
    fixed = ((ours and all(m in refused[1] for m in missing)) if missing else True) and all(
        patched["outcomes"][n] == ("ok", "EAGLE3") for n in ("kimi", "deepseek")
    )
    patched_text = (f"no-capture target refused in the launcher ({describe_error(refused)}); " if missing else "") + (
        f"Kimi-K2.5 and DeepSeek-V3 targets: {patched['outcomes']['kimi'][0]}, {patched['outcomes']['deepseek'][0]}"
    )
    return Finding(fixed, patched_text, bug, stock_text, *seen.patch("eagle3_target_capability"), observations=seen[1])


CHECKS: tuple[Check, ...] = (
    Check(
        "eagle3_target_capability",
        "EAGLE3 with a target that cannot capture is refused in the launcher",
        target_capability,
        patch="eagle3_target_capability",
    ),
)


# the scenario, run in an isolated process (``ctx.observe``)
def missing_capture_hooks(model_path: str) -> list[str]:
    """What sglang's EAGLE-3 path calls on a target that the target's sglang class (from its config's
    ``architectures``) does not have."""
    import json
    from pathlib import Path

    from sglang.srt.models.registry import ModelRegistry

    from eagle3_patches.patches.eagle3_target_capability import REQUIRED

    archs = json.loads((Path(model_path) / "config.json").read_text())["architectures"]
    cls, _ = ModelRegistry.resolve_model_cls(archs)
    return [m for m in REQUIRED if not callable(getattr(cls, m, None))]
