"""layer_id_convention: the configured aux layer ids capture exactly those layers' outputs."""

from __future__ import annotations

from typing import Any

from ...testing.tiny_models import HIDDEN
from ..base import Check, Context, Finding, describe_error
from ..checkpoints import LAYER_CHECK_IDS
from ..scenarios import PROMPTS, layer_output_hooks


def layer_ids(ctx: Context) -> Finding:
    seen = ctx.observe(
        captured_layers,
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


# the scenario, run in an isolated process (``ctx.observe``)
def captured_layers(target: str, marked: str, unmarked: str, overrides: dict | None = None) -> dict:
    """Which target layers' outputs the aux tensor holds for the draft config ``marked`` (ids recording the
    library's convention): with the process's patches, then with ``layer_id_convention`` reverted (the same
    model, stock rule).  The aux tensor of a real prefill is compared chunk by chunk with every decoder
    layer's output (forward hooks on the same run).  Then ``unmarked`` (no convention recorded) with the
    patch on again: the layers it captures, set twice; the same ids in the convention the environment names
    (``input-of-layer``, first id 1); and the default no-argument call.  What eagle3-patches logged in each
    phase comes with it."""
    import logging
    import os

    import torch

    import eagle3_patches
    from eagle3_patches import settings
    from eagle3_patches.checkpoint.layer_ids import INPUT_OF_LAYER
    from eagle3_patches.sglang_runtime import current_server_args
    from eagle3_patches.testing import sglang_harness as h

    records: list[str] = []
    handler = h.LogSink(lambda rec: records.append(rec.getMessage()))
    logger = logging.getLogger("eagle3_patches")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(min(logger.getEffectiveLevel(), logging.INFO))

    def logs() -> list[str]:
        out, records[:] = list(records), []
        return out

    overrides = dict(overrides or {})
    overrides.setdefault(
        "attention_backend", "torch_native"
    )  # CPU: the target alone runs faster than interpreted triton
    sa = h.eagle3_server_args(target, marked, **overrides)
    runner = h.model_runner(sa)
    model = runner.model
    outputs = layer_output_hooks(model)

    def run() -> dict:
        outputs.clear()
        step = h.prefill(runner, PROMPTS, return_hidden_states=True)
        aux = step.logits_output.hidden_states
        found = []
        for chunk in aux.split(model.config.hidden_size, dim=-1):
            same = [
                i
                for i in sorted(outputs)
                if outputs[i].shape == chunk.shape
                and torch.allclose(chunk.float(), outputs[i].float(), rtol=1e-5, atol=1e-6)
            ]
            found.append(same[0] if len(same) == 1 else same)
        return {"layers_to_capture": list(model.model.layers_to_capture), "width": aux.shape[-1], "outputs_of": found}

    def capture(*ids) -> list[int]:
        model.set_eagle3_layers_to_capture(*ids)
        return list(model.model.layers_to_capture)

    status = eagle3_patches.status()["layer_id_convention"]
    result: dict[str, Any] = {"state": status.state.value, "reason": status.reason, "patched": run()}
    result["patched"]["logs"] = logs()

    first_id_1 = [1, *list(LAYER_CHECK_IDS)[1:]]  # sglang >= 0.5.13 adds 1 to such a list
    eagle3_patches.revert(["layer_id_convention"])
    result["stock"] = {"default": capture(), "first_id_1": capture(first_id_1)}
    model.set_eagle3_layers_to_capture(list(LAYER_CHECK_IDS))
    result["stock"].update(run())

    eagle3_patches.apply(["layer_id_convention"])
    logs()
    h.set_server_arg(current_server_args(), "speculative_draft_model_path", unmarked)
    capture(list(LAYER_CHECK_IDS))
    result["unmarked"] = {"layers_to_capture": capture(list(LAYER_CHECK_IDS)), "logs": logs()}  # set twice
    try:
        settings.reload({**os.environ, settings.LAYER_ID_CONVENTION: INPUT_OF_LAYER})
        result["unmarked_input_of_layer"] = {"layers_to_capture": capture(first_id_1), "logs": logs()}
    finally:
        settings.reload()
    result["default"] = {"layers_to_capture": capture(), "logs": logs()}
    logger.removeHandler(handler)
    logger.setLevel(level)
    return result
