"""layer_id_convention: the configured aux layer ids capture exactly those layers' outputs."""

from __future__ import annotations

from ...testing.tiny_models import HIDDEN
from .. import scenarios as sc
from ..base import Check, Context, Finding, describe_error
from ..checkpoints import LAYER_CHECK_IDS


def layer_ids(ctx: Context) -> Finding:
    seen = ctx.observe(
        sc.captured_layers,
        ctx.path("deepseek_v3"),
        ctx.path("layer_ids_marked_draft"),
        ctx.path("layer_ids_unmarked_draft"),
        ctx.overrides(),
        patches="all",
    )
    if seen[0] != "ok":
        return Finding(False, describe_error(seen), None)
    out = seen[1]
    ids = list(LAYER_CHECK_IDS)
    bug = out["stock"]["outputs_of"] != ids
    stock_text = f"draft ids {ids} (output of layer i) captured the outputs of layers {out['stock']['outputs_of']}"
    fixed = out["patched"]["outputs_of"] == ids and out["patched"]["width"] == len(ids) * HIDDEN
    patched_text = (
        f"captured exactly the outputs of layers {out['patched']['outputs_of']} "
        f"({out['patched']['width']} wide; compared with each decoder layer's output)"
    )
    return Finding(fixed, patched_text, bug, stock_text, out["state"], out["reason"], observations=out)


CHECKS: tuple[Check, ...] = (
    Check(
        "layer_id_convention",
        "the configured aux layer ids capture exactly those layers' outputs",
        layer_ids,
        patch="layer_id_convention",
    ),
)
