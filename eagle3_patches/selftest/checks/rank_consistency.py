"""rank_consistency: TP ranks with different patch sets refuse to start instead of serving."""

from __future__ import annotations

from .. import scenarios as sc
from ..base import Check, Context, Finding


def load_rank(rank: int, world_size: int, port: int, target: str, overrides: dict) -> dict:
    """One TP rank building the target's model runner: did it start, and its rank_consistency state."""
    from eagle3_patches.testing import sglang_harness as h

    sc.to_log()
    overrides = dict(overrides)
    overrides.setdefault("dtype", "float32")
    sa = h.server_args(target, tp_size=world_size, **overrides)
    try:
        h.model_runner(sa, tp_rank=rank, nccl_port=port)
    except Exception as exc:  # noqa: BLE001 - the observation
        return {"rank": rank, "error": type(exc).__name__, "message": str(exc), "states": sc.patch_states()}
    return {"rank": rank, "error": None, "message": "", "states": sc.patch_states()}


def rank_consistency(ctx: Context) -> Finding:
    target = ctx.path("deepseek_v3")
    other = "eagle3_fc_guard"
    stock = ctx.observe_ranks(
        load_rank,
        2,
        target,
        ctx.overrides(),
        patches=["all", "all"],
        env=[{"EAGLE3_PATCHES_DISABLE": "rank_consistency"}, {"EAGLE3_PATCHES_DISABLE": f"rank_consistency,{other}"}],
    )
    patched = ctx.observe_ranks(
        load_rank, 2, target, ctx.overrides(), patches=["all", "all"], env=[{}, {"EAGLE3_PATCHES_DISABLE": other}]
    )
    bug = all(r["error"] is None for r in stock)
    stock_text = (
        f"rank 1 without {other}, rank 0 with it: both ranks started"
        if bug
        else "; ".join(f"rank {r['rank']}: {r['error']}" for r in stock)
    )
    fixed = all(r["error"] == "Eagle3ConfigError" and other in r["message"] for r in patched)
    patched_text = (
        "every rank refused to start, naming the patch that differs"
        if fixed
        else "; ".join(f"rank {r['rank']}: {r['error'] or 'started'}" for r in patched)
    )
    return Finding(
        fixed,
        patched_text,
        bug,
        stock_text,
        patched[0]["states"].get("rank_consistency"),
        observations={"stock": stock, "patched": patched},
    )


CHECKS: tuple[Check, ...] = (
    Check(
        "rank_consistency",
        "TP 2: ranks with different patch sets refuse to start instead of serving",
        rank_consistency,
        patch="rank_consistency",
        needs=("tp2",),
    ),
)
