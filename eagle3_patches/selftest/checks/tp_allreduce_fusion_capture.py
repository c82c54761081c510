"""tp_allreduce_fusion_capture: flashinfer all-reduce fusion is off under EAGLE3 at TP > 1; on two GPUs, the aux
states of TP 2 equal TP 1's."""

from __future__ import annotations

from .. import device_scenarios as ds
from ..base import Check, Context, Finding, describe_error


def fusion(ctx: Context) -> Finding:
    seen = ctx.observe(
        fusion_decisions,
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


# the scenario, run in an isolated process (``ctx.observe``)
def fusion_decisions(
    kimi: str, deepseek: str, draft: str, stand_in_gpu: bool = True, overrides: dict | None = None
) -> dict:
    """``enable_flashinfer_allreduce_fusion`` as the real ``ServerArgs`` decides it: stock, then with
    ``tp_allreduce_fusion_capture`` applied alone in this process (the other flag guards would refuse
    the EAGLE cases), then reverted.  ``stand_in_gpu``: the hardware facts ``ServerArgs`` reads are an
    H200's (sm90), then a B200's (sm100) - on a machine without that GPU; False: this machine's own."""
    import logging

    import sglang.srt.server_args as sa_mod

    from eagle3_patches.patches import tp_allreduce_fusion_capture as tafc
    from eagle3_patches.registry import Registry
    from eagle3_patches.testing import sglang_harness as h

    records: list[logging.LogRecord] = []
    logging.getLogger("eagle3_patches").addHandler(h.LogSink(records.append, logging.DEBUG))

    def fusion(path: str, algorithm: str | None, tp: int, **kw) -> dict:
        before = len(records)
        kw = {**(overrides or {}), **kw}
        if algorithm:
            sa = h.eagle3_server_args(path, draft, algorithm=algorithm, tp_size=tp, **kw)
        else:
            sa = h.server_args(path, tp_size=tp, **kw)
        logs = [(r.levelname, r.getMessage()) for r in records[before:]]
        return {"fusion": sa.enable_flashinfer_allreduce_fusion, "algorithm": sa.speculative_algorithm, "logs": logs}

    out: dict = {"stand_in_gpu": stand_in_gpu, "machine_stock": fusion(kimi, "EAGLE3", 2)}
    if stand_in_gpu:  # an H200, as the hardware-detection functions in server_args would report it
        sa_mod.is_sm90_supported = lambda *a, **k: True
        sa_mod.get_device_name = lambda *a, **k: "NVIDIA H200"
    out["stock"] = {name: fusion(path, "EAGLE3", 2) for name, path in (("kimi", kimi), ("deepseek", deepseek))}

    reg = Registry("selftest", [tafc.PATCH])
    original = sa_mod.ServerArgs.__dict__["_handle_model_specific_adjustments"]
    reg.apply()  # sglang.srt.server_args is imported: lands now
    out["state"] = reg.status()[tafc.NAME].state.value
    out["reason"] = reg.status()[tafc.NAME].reason
    out["upstream"] = tafc.PATCH.upstream(sa_mod)
    out["patched"] = {
        "kimi_eagle3_tp2": fusion(kimi, "EAGLE3", 2),
        "deepseek_eagle3_tp2": fusion(deepseek, "EAGLE3", 2),
        "kimi_eagle3_tp2_explicit": fusion(kimi, "EAGLE3", 2, enable_flashinfer_allreduce_fusion=True),
        "kimi_eagle3_tp1": fusion(kimi, "EAGLE3", 1),
        "kimi_none_tp2": fusion(kimi, None, 2),
        "kimi_eagle_tp2": fusion(kimi, "EAGLE", 2),
        "kimi_eagle_tp2_explicit": fusion(kimi, "EAGLE", 2, enable_flashinfer_allreduce_fusion=True),
    }
    if stand_in_gpu:  # sm100 (B200) instead of sm90
        sa_mod.is_sm90_supported = lambda *a, **k: False
        sa_mod.is_sm100_supported = lambda *a, **k: True
        sa_mod.get_device_name = lambda *a, **k: "NVIDIA B200"
        out["patched"]["kimi_eagle3_tp2_sm100"] = fusion(kimi, "EAGLE3", 2)

    reg.revert([tafc.NAME])
    out["revert_identity"] = sa_mod.ServerArgs.__dict__["_handle_model_specific_adjustments"] is original
    out["reverted"] = fusion(kimi, "EAGLE3", 2)
    return out
