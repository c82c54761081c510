"""disaggregation_fingerprint: the decode server of a prefill/decode pair refuses a request whose prefill server
speculates otherwise (sglang's real metadata buffers and transfer commit, the row copied as the transfer engine
copies it)."""

from __future__ import annotations

from .. import scenarios as sc
from ..base import Check, Context, Finding, describe_error

#: the prefill setups the decode server must refuse, with what its message names
REFUSED = {
    "no_spec": "sent no draft state",
    "unpatched": "no eagle3-patches fingerprint",
    "other_draft": "the draft: its digest differs",
    "topk": "--speculative-eagle-topk: prefill 2, decode 1",
    "attention_tp": "attention-TP size: prefill 2, decode 1",
}
#: the setups it must commit as stock sglang does
COMMITTED = ("same", "fake", "health_check", "decode_no_spec")


def refused(case) -> str | None:
    """The abort message of a case that ran, else None."""
    return case[1][1] if case[0] == "ok" else None


def fingerprint_checked(ctx: Context) -> Finding:
    args = (ctx.path("kimi_k25"), ctx.path("draft"), ctx.path("layer_ids_unmarked_draft"))
    seen = ctx.observe(sc.pd_metadata_commits, *args)
    if seen[0] != "ok":
        return Finding(False, describe_error(seen), None)
    stock, patched = seen[1]["stock"], seen[1]["patched"]
    bug = all(stock[c][0] == "ok" and refused(stock[c]) is None for c in REFUSED)
    stock_text = (
        "every prefill setup committed: a zero row, another draft's row and another top-k's, silently"
        if bug
        else "stock refused a mismatched row: " + ", ".join(c for c in REFUSED if refused(stock[c]))
    )
    misses = [c for c, needle in REFUSED.items() if needle not in (refused(patched[c]) or "")]
    wrongly = [c for c in COMMITTED if patched[c][0] != "ok" or refused(patched[c]) is not None]
    fixed = not misses and not wrongly
    patched_text = (
        f"refused {', '.join(REFUSED)}; committed {', '.join(COMMITTED)}"
        if fixed
        else f"not refused: {misses or 'none'}; refused or failed where it must commit: {wrongly or 'none'}"
    )
    return Finding(
        fixed, patched_text, bug, stock_text, *seen.patch("disaggregation_fingerprint"), observations=seen[1]
    )


CHECKS: tuple[Check, ...] = (
    Check(
        "disaggregation_fingerprint",
        "a decode server refuses a request whose prefill server speculates otherwise or runs without eagle3-patches",
        fingerprint_checked,
        patch="disaggregation_fingerprint",
    ),
)
