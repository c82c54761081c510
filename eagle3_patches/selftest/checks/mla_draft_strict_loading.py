"""mla_draft_strict_loading: the MLA draft's loader loads a good draft and refuses a missing, an unknown and an
unpaired tensor."""

from __future__ import annotations

from ..base import Check, Context, Finding, describe_error
from ..checkpoints import MLA_REFUSED_FOR
from ._shared import drafts_loaded

MLA_DRAFTS = ("mla_draft", *MLA_REFUSED_FOR)


def strict_loading(ctx: Context) -> Finding:
    """Every draft of :data:`MLA_DRAFTS` into a real draft ``ModelRunner`` beside the tiny Kimi-K2.5, stock and
    patched."""
    loaded = drafts_loaded(ctx, "kimi_k25", MLA_DRAFTS)
    if isinstance(loaded, Finding):
        return loaded
    obs, s, p = loaded
    silent = [n for n in MLA_REFUSED_FOR if s[n]["ok"]]
    stock_text = (
        f"{len(silent)} of {len(MLA_REFUSED_FOR)} bad MLA drafts (a tensor missing, one unknown, a down projection "
        "without its partner) loaded without an error"
        if silent
        else "every bad MLA draft was refused"
    )
    not_refused = [
        n
        for n, needle in MLA_REFUSED_FOR.items()
        if p[n]["ok"] or p[n]["type"] != "Eagle3ConfigError" or needle not in p[n]["message"]
    ]
    good = p["mla_draft"]["ok"]
    refusal = "" if good else describe_error((p["mla_draft"]["type"], p["mla_draft"]["message"]))
    patched_text = (
        f"the MLA draft {'loads' if good else 'does NOT load: ' + refusal}"
        f"; bad drafts {'refused, naming the tensor' if not not_refused else 'NOT refused: ' + ', '.join(not_refused)}"
    )
    state, reason = obs["patched"].patch("mla_draft_strict_loading")
    return Finding(
        good and not not_refused,
        patched_text,
        bool(silent),
        stock_text,
        state,
        reason,
        observations=obs,
    )


CHECKS: tuple[Check, ...] = (
    Check(
        "mla_draft_strict_loading",
        "the MLA draft's loader refuses missing, unknown and unpaired tensors and loads a good draft",
        strict_loading,
        patch="mla_draft_strict_loading",
        runs_on=">=0.5.12",
        outside="sglang's MLA draft class (models/kimi_k25_eagle3.py) arrived in 0.5.12",
    ),
)
