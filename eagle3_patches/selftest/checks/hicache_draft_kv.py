"""hicache_draft_kv: HiCache beside a draft model is refused in the launcher where HiCache restores only the target's
KV: the host tier before 0.5.11, a storage backend that does not carry the draft's pages from then on."""

from __future__ import annotations

from ...checkpoint.releases import HICACHE_DRAFT_L3_FROM
from ...sglang_version import base_release, installed_sglang_version
from .. import scenarios as sc
from ..base import Check, Context, Finding, describe_error

HICACHE = {"enable_hierarchical_cache": True}
#: the storage tier on the one backend whose draft path every release from 0.5.11 has (silent), and the same beside
#: the tiny Kimi-K2.5 (MLA) with its per-head draft at TP 2, where only rank 0 writes the draft's pages (refused)
FILE = {**HICACHE, "hicache_storage_backend": "file"}
FILE_TP2 = {**FILE, "tp_size": 2}


def hicache_refused(ctx: Context) -> Finding:
    kimi, draft = ctx.path("kimi_k25"), ctx.path("draft")
    cases: dict[str, tuple] = {"hicache": (kimi, draft, "EAGLE3", HICACHE), "no_hicache": (kimi, draft, "EAGLE3")}
    version = installed_sglang_version()
    storage = version is not None and base_release(version) >= HICACHE_DRAFT_L3_FROM
    if storage:
        cases.update(file=(kimi, draft, "EAGLE3", FILE), file_tp2=(kimi, draft, "EAGLE3", FILE_TP2))
    seen = ctx.observe(sc.stock_then_patched, sc.launcher_outcomes, cases, ctx.overrides())
    if seen[0] != "ok":
        return Finding(False, describe_error(seen), None)
    stock, patched = seen[1]["stock"], seen[1]["patched"]
    state, state_reason = seen.patch("hicache_draft_kv")
    if storage and state == "applied":
        return _storage(stock, patched, state, state_reason, seen[1])
    if state in ("upstream", "not-applicable"):
        # the release's HiCache moves the draft's KV (the patch's upstream probe): nothing to refuse, and a launch
        # the launcher resolves is the right one; the launcher alone cannot see which KV HiCache restores
        resolved = patched["hicache"] == ("ok", "EAGLE3")
        text = f"HiCache with EAGLE3 {'resolves' if resolved else describe_error(patched['hicache'])}"
        return Finding(resolved, text, False, text, state, state_reason, observations=seen[1])
    bug = stock["hicache"] == ("ok", "EAGLE3")
    stock_text = (
        "HiCache with EAGLE3 resolved: the draft's KV is not restored with the target's"
        if bug
        else f"HiCache with EAGLE3: {describe_error(stock['hicache'])}"
    )
    refused = patched["hicache"]
    fixed = (
        refused[0] == "Eagle3ConfigError"
        and "--enable-hierarchical-cache" in refused[1]
        and patched["no_hicache"] == ("ok", "EAGLE3")
    )
    patched_text = f"HiCache with EAGLE3 refused ({describe_error(refused)}); without HiCache it resolves"
    return Finding(fixed, patched_text, bug, stock_text, state, state_reason, observations=seen[1])


def _storage(stock: dict, patched: dict, state: str, state_reason: str, observations: dict) -> Finding:
    """A release whose HiCache moves the draft's KV to the host: the storage tier is what is judged."""
    ok = ("ok", "EAGLE3")
    bug = stock["file_tp2"] == ok
    stock_text = (
        "HiCache's storage tier with a per-head draft beside an MLA target at TP 2 resolved: ranks 1-N would read "
        "rank 0's draft pages"
        if bug
        else f"the storage tier at TP 2: {describe_error(stock['file_tp2'])}"
    )
    refused = patched["file_tp2"]
    fixed = (
        refused[0] == "Eagle3ConfigError"
        and "--hicache-storage-backend" in refused[1]
        and all(patched[name] == ok for name in ("hicache", "no_hicache", "file"))
    )
    patched_text = (
        f"the per-head draft at TP 2 refused ({describe_error(refused)}); HiCache alone and its file storage at TP 1 "
        f"{'resolve' if all(patched[n] == ok for n in ('hicache', 'file')) else 'do not resolve'}"
    )
    return Finding(fixed, patched_text, bug, stock_text, state, state_reason, observations=observations)


CHECKS: tuple[Check, ...] = (
    Check(
        "hicache_draft_kv",
        "HiCache with an EAGLE-3 draft is refused at start where a prefix would come back with the target's KV only",
        hicache_refused,
        patch="hicache_draft_kv",
    ),
)
