"""dp_attention_aux_gather: with DP attention and an all-to-all MoE backend, each captured aux state holds this
rank's tokens only."""

from __future__ import annotations

from ...testing.tiny_models import HIDDEN
from .. import scenarios as sc
from ..base import Check, Context, Finding, describe_error
from ..scenarios import PROMPTS, apply_patch_set, outcome


def gathered_rows(ctx: Context) -> Finding:
    """One process: a capturing prefill on stock sglang, then on the same model with the patch set applied, with TP 2
    and DP attention 2 emulated (scenario ``a2a_capture_rows``)."""
    seen = ctx.observe(a2a_capture_rows, ctx.path("deepseek_v3"), ctx.overrides(), True)
    if seen[0] != "ok":
        return Finding(False, describe_error(seen), None)
    s, p = seen[1]["stock"], seen[1]["patched"]
    tokens = len(sc.PROMPTS[0])
    bug = s == ("ok", (2 * tokens, 3 * HIDDEN))
    stock_text = (
        f"{tokens} tokens, {s[1][0]} rows of aux states stored for the draft: another rank's tokens mixed in, no error"
        if s[0] == "ok"
        else describe_error(s)
    )
    fixed = p == ("ok", (tokens, 3 * HIDDEN))
    patched_text = f"{tokens} tokens, {p[1][0]} rows of aux states" if p[0] == "ok" else describe_error(p)
    return Finding(fixed, patched_text, bug, stock_text, *seen.patch("dp_attention_aux_gather"), observations=seen[1])


CHECKS: tuple[Check, ...] = (
    Check(
        "dp_attention_aux_gather",
        "with DP attention and an all-to-all MoE backend, the captured aux states hold this rank's tokens only",
        gathered_rows,
        patch="dp_attention_aux_gather",
        runs_on="<0.5.10",
        outside="from 0.5.10 sglang gathers the captured aux states over the attention-TP group",
    ),
)


# the scenario, run in an isolated process (``ctx.observe``)
def a2a_capture_rows(target: str, overrides: dict | None = None, then_patched: bool = False) -> dict:
    """One capturing prefill of ``PROMPTS[0]`` with an all-to-all MoE backend on (``enable_a2a_moe``: sglang gathers
    each aux state past the dense layers) under DP attention at TP 2, emulated on one rank: the TP group's gather
    (``parallel_state._TP``, whichever name reaches it) returns this rank's rows and a second attention-DP rank's,
    which serves other tokens (zeros here); the attention-TP group is this rank alone.  ``("ok", shape of the
    stored hidden states)`` or ``(exception type, message)``; ``then_patched``: again after the patch set was applied
    in this process, ``{"stock": ..., "patched": ...}``."""
    import torch
    from sglang.srt.distributed import parallel_state

    from eagle3_patches.testing import sglang_harness as h

    runner = h.model_runner(h.server_args(target, **(overrides or {})))
    runner.model.set_eagle3_layers_to_capture([1, 2, 3])  # layers past the tiny target's one dense layer
    runner.model.model.enable_a2a_moe = True
    this_rank = parallel_state.get_tp_group()

    class TpGroupOfTwo:
        """This rank's TP group as a group of two whose other rank serves other tokens."""

        def all_gather(self, input_, dim: int = -1):
            return torch.cat([input_, torch.zeros_like(input_)], dim=dim)

        def __getattr__(self, name: str):
            return getattr(this_rank, name)

    # the group itself, not one module's name for it: a gather that reaches the TP group by any path (the module's
    # tensor_model_parallel_all_gather, get_tp_group() from parallel_state or from sglang.srt.distributed) gets both
    # ranks' rows, while the attention-TP group (parallel_state._ATTN_TP) stays this rank alone
    assert parallel_state.get_attn_tp_group() is not None
    parallel_state._TP = TpGroupOfTwo()

    def run() -> tuple:
        step = h.prefill(runner, PROMPTS[:1], return_hidden_states=True)
        return tuple(step.logits_output.hidden_states.shape)

    stock = outcome(run)
    if not then_patched:
        return {"stock": stock}
    apply_patch_set()
    return {"stock": stock, "patched": outcome(run)}
