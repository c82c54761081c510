"""eagle3_draft_strict_loading: the draft's loader loads good drafts bit-exactly (fp8 ones as stock sglang does)
and refuses bad ones."""

from __future__ import annotations

from .. import scenarios as sc
from ..base import Check, Context, Finding, describe_error
from ._shared import drafts_loaded

#: the drafts the strict-loading check loads, and what a bad one must be refused for (a needle of the message)
STRICT_DRAFTS = (
    "layers0_draft",
    "midlayer_draft",
    "full_vocab_draft",
    "unknown_key_draft",
    "missing_tensor_draft",
    "d2t_absolute_draft",
    "d2t_twice_draft",
)
REFUSED_FOR = {
    "unknown_key_draft": "input_norm.weight",
    "missing_tensor_draft": "mlp.down_proj.weight",
    "d2t_absolute_draft": "absolute target ids",
    "d2t_twice_draft": "arange subtracted twice",
}


def strict_loading(ctx: Context) -> Finding:
    """Every draft of :data:`STRICT_DRAFTS` into a real draft ``ModelRunner``, stock and patched."""
    loaded = drafts_loaded(ctx, "deepseek_v3", STRICT_DRAFTS)
    if isinstance(loaded, Finding):
        return loaded
    obs, s, p = loaded
    paths = obs["paths"]

    def exact(result: dict, name: str) -> bool:
        return result["ok"] and sc.bit_exact_mismatches(result["params"], paths[name]) == []

    bugs = []
    if s["layers0_draft"]["ok"] and not exact(s["layers0_draft"], "layers0_draft"):
        left = len(sc.bit_exact_mismatches(s["layers0_draft"]["params"], paths["layers0_draft"]))
        bugs.append(f"a layers.0.* draft loaded with {left} parameters left at their initial values")
    silent = [n for n in REFUSED_FOR if s[n]["ok"]]
    if silent:
        bugs.append(
            f"{len(silent)} of {len(REFUSED_FOR)} bad drafts (unknown tensor, missing tensor, d2t holding target "
            "ids, d2t offset twice) loaded without a word"
        )
    stock_text = "; ".join(bugs) or "layers.0.* loaded bit-exactly and every bad draft was refused"
    not_refused = [
        n
        for n, needle in REFUSED_FOR.items()
        if p[n]["ok"] or p[n]["type"] != "Eagle3ConfigError" or needle not in p[n]["message"]
    ]
    inexact = [n for n in ("layers0_draft", "midlayer_draft") if not exact(p[n], n)]
    full_vocab = p["full_vocab_draft"]["ok"] and p["full_vocab_draft"]["hot_token_id"] is None
    fixed = not not_refused and not inexact and full_vocab
    patched_text = (
        f"layers.0.* and midlayer.* drafts {'bit-exact' if not inexact else 'NOT bit-exact: ' + ', '.join(inexact)}"
        f"; full-vocabulary draft {'loads' if full_vocab else 'does NOT load'}; bad drafts "
        f"{'refused, naming the tensor' if not not_refused else 'NOT refused: ' + ', '.join(not_refused)}"
    )
    state, reason = obs["patched"].patch("eagle3_draft_strict_loading")
    return Finding(
        fixed,
        patched_text,
        bool(bugs),
        stock_text,
        state,
        reason,
        observations=obs,
    )


def quantized_loading(ctx: Context) -> Finding:
    target = ctx.path("deepseek_v3")
    drafts = [(ctx.path("midlayer_draft"), {"speculative_draft_model_quantization": "fp8"}), ctx.path("fp8_draft")]
    labels = ["online fp8 (--quantization fp8)", "fp8 checkpoint"]
    stock = ctx.observe(sc.load_drafts_to_host, target, drafts, ctx.overrides())
    patched = ctx.observe(sc.load_drafts_to_host, target, drafts, ctx.overrides(), patches="all")
    obs = {"stock": stock, "patched": patched}
    if stock[0] != "ok" or patched[0] != "ok":
        return Finding(False, describe_error(stock if stock[0] != "ok" else patched), None, observations=obs)

    parts, fixed = [], True
    for label, s, p in zip(labels, stock[1], patched[1]):
        ok = (
            (p["ok"] == s["ok"])
            and not sc.differing_tensors(s.get("loaded"), p.get("loaded"))
            and (not s["ok"] or not sc.differing_tensors(s["params"], p["params"]))
        )
        fixed &= ok
        parts.append(
            f"{label}: stock {'loaded' if s['ok'] else s.get('type')}, patched "
            f"{'loaded, identical' if ok else (p.get('type') or 'loaded, DIFFERENT')}"
        )
    return Finding(
        fixed,
        "; ".join(parts),
        None,
        "stock sglang serves these drafts; the patch set must load them the same",
        *patched.patch("eagle3_draft_strict_loading"),
        observations=obs,
    )


CHECKS: tuple[Check, ...] = (
    Check(
        "eagle3_draft_strict_loading",
        "a layers.0.* draft loads bit-exactly; unknown / missing tensors and bad d2t are refused",
        strict_loading,
        patch="eagle3_draft_strict_loading",
    ),
    Check(
        "quantized_draft_loading",
        "fp8 drafts load as stock sglang loads them, real kernels",
        quantized_loading,
        patch="eagle3_draft_strict_loading",
        needs=("cuda",),
    ),
)
