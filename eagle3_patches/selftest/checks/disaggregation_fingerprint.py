"""disaggregation_fingerprint: the decode server of a prefill/decode pair refuses a request whose prefill server
speculates otherwise (sglang's real metadata buffers and transfer commit, the row copied as the transfer engine
copies it)."""

from __future__ import annotations

from ..base import Check, Context, Finding, describe_error
from ..scenarios import apply_patch_set, outcome

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
    seen = ctx.observe(pd_metadata_commits, *args)
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


# the scenario, run in an isolated process (``ctx.observe``)
def pd_metadata_commits(target: str, draft: str, other_draft: str, then_patched: bool = True) -> dict:
    """One request's metadata row through sglang's real disaggregation code, per prefill setup: the prefill side's
    ``MetadataBuffers.set_buf`` writes it (its ``ServerArgs`` this process's, as in a prefill scheduler), the row's
    bytes are copied into the decode side's buffers (what the transfer engine does), and the decode side's
    ``DecodeTransferQueue._commit_transfer_to_req`` commits it.  Per case: ``pd_commit``'s (committed first token,
    abort message or None, the row's ``output_ids`` as sent).  Cases: ``same`` (the decode server's own flags),
    ``unpatched`` (the same flags, the prefill process without eagle3-patches), ``no_spec`` (the prefill without
    speculation), ``other_draft``, ``topk`` (another ``--speculative-eagle-topk``), ``attention_tp`` (the prefill
    at TP 2: the MLA target's Llama-class draft KV split otherwise), ``fake`` (the fake backend on the decode side, the
    prefill without speculation), ``health_check`` (sglang's own health-check request, nothing transferred),
    ``decode_no_spec`` (neither side speculates).  ``then_patched``: again after the patch set was applied in this
    process, ``{"stock": ..., "patched": ...}``."""
    from eagle3_patches.testing import sglang_harness as h

    p, d, fake = {"disaggregation_mode": "prefill"}, {"disaggregation_mode": "decode"}, "fake"
    decode = h.eagle3_server_args(target, draft, **d)
    prefills = {
        "same": h.eagle3_server_args(target, draft, **p),
        "no_spec": h.server_args(target, **p),
        "other_draft": h.eagle3_server_args(target, other_draft, **p),
        "topk": h.eagle3_server_args(target, draft, speculative_eagle_topk=2, speculative_num_draft_tokens=4, **p),
        "attention_tp": h.eagle3_server_args(target, draft, tp_size=2, **p),
    }
    # the fake case's prefill keeps the default backend: some releases (0.5.10) refuse a fake prefill server, and
    # only the decode side's backend decides what is transferred
    fake_prefill = prefills["no_spec"]
    fake_decode = h.eagle3_server_args(target, draft, disaggregation_transfer_backend=fake, **d)

    def run() -> dict:
        out = {name: outcome(h.pd_commit, prefill, decode) for name, prefill in prefills.items()}
        out["unpatched"] = outcome(h.pd_commit, prefills["same"], decode, stamped=False)
        out["health_check"] = outcome(h.pd_commit, prefills["no_spec"], decode, stamped=False, health_check=True)
        out["fake"] = outcome(h.pd_commit, fake_prefill, fake_decode)
        out["decode_no_spec"] = outcome(h.pd_commit, prefills["no_spec"], h.server_args(target, **d))
        return out

    stock = run()
    if not then_patched:
        return {"stock": stock}
    apply_patch_set()
    return {"stock": stock, "patched": run()}
