"""What sglang does with an EAGLE-3.1 MLA draft (``Eagle3DeepseekV2ForCausalLM`` with ``fc_norm`` / ``norm_output``):
the tiny one (:func:`build_eagle31_mla_draft`), the launcher's verdict and the real draft ``ModelRunner``'s model,
observed in one process on the installed release (:func:`served_norms`, run with
:func:`~eagle3_patches.testing.isolation.run_isolated`, stock or with the patch set)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from eagle3_patches.testing import tiny_models as tm

#: the value of every ``fc_norm.<i>.weight`` of the tiny EAGLE-3.1 MLA draft: not RMSNorm's initial 1.0, so a
#: weight that never loaded shows
FC_NORM_WEIGHT = 1.5
#: the EAGLE-3.1 fields the published Kimi-K2.x MLA drafts set (``lightseekorg/kimi-k2.6-eagle3.1-mla``)
EAGLE31_FIELDS = {"fc_norm": True, "norm_output": True}


def build_eagle31_mla_draft(path: os.PathLike, fields: dict | None = None, weights: bool = True) -> Path:
    """The tiny MLA draft with ``fields`` (default :data:`EAGLE31_FIELDS`) in its config and, with ``weights``, one
    ``fc_norm.<i>.weight`` per aux state at :data:`FC_NORM_WEIGHT`."""
    import torch

    config = tm.mla_draft_config() | (EAGLE31_FIELDS if fields is None else fields)
    tensors = tm.mla_draft_tensors()
    if weights:
        k = len(config["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
        width = config["target_hidden_size"]
        tensors |= {f"fc_norm.{i}.weight": torch.full((width,), FC_NORM_WEIGHT, dtype=torch.bfloat16) for i in range(k)}
    return tm.build_mla_draft(path, tensors, config)


def served_norms(target: str, drafts: dict[str, str], **overrides: Any) -> dict[str, dict[str, Any]]:
    """Per draft: ``launch``, the launcher's verdict (``("ok", algorithm)`` or ``(exception type, message)``) on the
    server arguments resolved as ``launch_server`` resolves them; ``load``, what the real draft ``ModelRunner`` built
    beside the tiny target (``ok``; ``fc_norm``: each norm's weight as a list, None without the module;
    ``norm_output``: the model's flag, None without it; ``skipped``: sglang's "skipping unexpected weight" lines),
    or the load's exception (``type``, ``message``).  ``overrides``: server arguments of the launch (the tiny
    Kimi-K2.5 carries no image processor: ``enable_multimodal=False`` serves its language model alone)."""
    from eagle3_patches.testing import sglang_harness as h

    def launch(draft: str) -> tuple[str, Any]:
        try:
            return "ok", h.launcher_server_args(h.eagle3_server_args, target, draft, **overrides).speculative_algorithm
        except Exception as exc:  # noqa: BLE001 - the observation
            return type(exc).__name__, str(exc)

    out: dict[str, dict[str, Any]] = {name: {"launch": launch(d)} for name, d in drafts.items()}
    skipped: list[str] = []

    class Skips(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "skipping unexpected weight" in record.getMessage():
                skipped.append(record.getMessage())

    handler = Skips(level=logging.WARNING)
    sglang_log = logging.getLogger("sglang")
    sglang_log.addHandler(handler)
    try:
        # the runner's arguments are built with a draft the launcher lets through (on releases that check at
        # construction a refused draft allows none); each draft is then set on them, as the loader reads it
        through = [d for name, d in drafts.items() if out[name]["launch"][0] == "ok"] or list(drafts.values())
        sa = h.eagle3_server_args(target, through[0], **overrides)
        tr = h.model_runner(sa)
        for name, draft in drafts.items():
            skipped.clear()
            h.set_server_arg(sa, "speculative_draft_model_path", str(draft))
            try:
                dr = h.draft_runner(sa, tr, model_path=str(draft))
            except Exception as exc:  # noqa: BLE001 - returned to the test
                out[name]["load"] = {"ok": False, "type": type(exc).__name__, "message": str(exc)}
                continue
            model = dr.model.model
            norms = getattr(model, "fc_norm", None)
            out[name]["load"] = {
                "ok": True,
                "fc_norm": None if norms is None else [n.weight.detach().float().tolist() for n in norms],
                "norm_output": getattr(model, "norm_output", None),
                "skipped": list(skipped),
            }
    finally:
        sglang_log.removeHandler(handler)
    return out
