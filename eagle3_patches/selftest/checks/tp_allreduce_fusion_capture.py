"""tp_allreduce_fusion_capture: flashinfer all-reduce fusion is off under EAGLE3 at TP > 1; on two GPUs, the aux
states of TP 2 equal TP 1's."""

from __future__ import annotations

from .. import device_scenarios as ds
from .. import scenarios as sc
from ..base import Check, Context, Finding, describe_error


def fusion(ctx: Context) -> Finding:
    seen = ctx.observe(
        sc.fusion_decisions,
        ctx.path("kimi_k25"),
        ctx.path("deepseek_v3"),
        ctx.path("draft"),
        not ctx.on_gpu,
        ctx.overrides(),
    )
    if seen[0] != "ok":
        return Finding(False, describe_error(seen), None)
    out = seen[1]
    where = "an H200 (sm90) stood in for this machine's GPU" if out["stand_in_gpu"] else "this GPU's own hardware facts"
    stock_on = [n for n, d in out["stock"].items() if d["fusion"]]
    if stock_on:
        bug, stock_text = True, f"EAGLE3 at TP 2 ({where}): all-reduce fusion on for {', '.join(stock_on)}"
    else:
        bug, stock_text = None, f"sglang did not enable the fusion ({where}): the bug cannot show here"
    p = out["patched"]
    off = [c for c in p if "eagle3_tp2" in c]
    silent = ["kimi_none_tp2", "kimi_eagle_tp2", "kimi_eagle_tp2_explicit"]
    fixed = (
        all(not p[c]["fusion"] for c in off)
        and all(
            len(p[c]["logs"]) == 1 and "all-reduce fusion turned off" in p[c]["logs"][0][1] for c in off if stock_on
        )
        and all(p[c]["logs"] == [] for c in silent)
        and out["revert_identity"]
    )
    patched_text = (
        f"fusion off with one warning for {', '.join(off)}; left alone (no log) for TP 2 without EAGLE-3 and for EAGLE"
    )
    if not fixed:
        patched_text = f"decisions: { {c: (p[c]['fusion'], len(p[c]['logs'])) for c in p} }"
    return Finding(fixed, patched_text, bug, stock_text, out["state"], out["reason"], observations=out)


def _tolerance(dtype: str) -> float:
    """Relative difference allowed between two TP layouts of the same computation (summation order)."""
    return 1e-3 if "32" in dtype else 2e-2


def tp2_nccl(ctx: Context) -> Finding:
    target = ctx.path("deepseek_v3")
    ov = ctx.overrides(disable_cuda_graph=True)
    reference = ctx.observe(ds.tp_capture, 0, 1, 0, target, ov, patches="all")
    if reference[0] != "ok":
        return Finding(False, f"the TP 1 reference did not run: {describe_error(reference)}", None)
    ref = reference[1]["aux"].float()
    tol = _tolerance(ctx.dtype or "bfloat16")

    def compare(ranks: list) -> tuple[bool, str]:
        diffs = [float((r["aux"].float() - ref).abs().max() / ref.abs().max()) for r in ranks]
        same = all(r["aux"].shape == ref.shape for r in ranks) and max(diffs) <= tol
        return same, (
            f"TP 2 over {ranks[0]['backend'] or 'NCCL'} (fusion {'on' if ranks[0]['fusion'] else 'off'}): aux "
            f"states vs TP 1, largest relative difference {max(diffs):.3g} (tolerance {tol:g})"
        )

    stock = ctx.observe_ranks(ds.tp_capture, 2, target, ov, patches=[None, None], env=[{}, {}])
    patched = ctx.observe_ranks(ds.tp_capture, 2, target, ov, patches=["all", "all"], env=[{}, {}])
    stock_same, stock_text = compare(stock)
    fixed, patched_text = compare(patched)
    bug = (not stock_same) if stock[0]["fusion"] else None
    if bug is None:
        stock_text += ": sglang did not enable the fusion on this GPU, the bug cannot show here"
    return Finding(
        fixed,
        patched_text,
        bug,
        stock_text,
        patched[0]["states"].get("tp_allreduce_fusion_capture"),
        observations={"reference": reference, "stock": stock, "patched": patched},
    )


CHECKS: tuple[Check, ...] = (
    Check(
        "tp_allreduce_fusion_capture",
        "TP > 1 + EAGLE3: flashinfer all-reduce fusion is turned off",
        fusion,
        patch="tp_allreduce_fusion_capture",
        runs_on="<0.5.14",
        outside="from 0.5.14 sglang captures after the all-reduce, so the fusion flag no longer matters (on two GPUs "
        "`tp2_nccl` compares the states themselves)",
    ),
    Check(
        "tp2_nccl",
        "TP 2 over NCCL: aux states equal TP 1",
        tp2_nccl,
        patch="tp_allreduce_fusion_capture",
        needs=("cuda", "2gpu"),
    ),
)
