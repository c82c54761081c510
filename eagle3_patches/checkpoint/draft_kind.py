"""Is a draft checkpoint an EAGLE-3 draft?  Read from config.json and the safetensors header only."""

from __future__ import annotations

import json
from pathlib import Path


def _fc_in_width(path: Path) -> int | None:
    """``fc.weight``'s in-width from the safetensors header (no tensor data is read)."""
    from safetensors import safe_open

    index = path / "model.safetensors.index.json"
    files = [path / "model.safetensors"]
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = [path / weight_map[k] for k in ("fc.weight", "model.fc.weight") if k in weight_map]
    for f in files:
        if not f.is_file():
            continue
        with safe_open(str(f), "pt") as st:
            for key in ("fc.weight", "model.fc.weight"):
                if key in st.keys():
                    return int(st.get_slice(key).get_shape()[-1])
    return None


def eagle3_draft_evidence(path: str | Path) -> str | None:
    """Why the checkpoint at ``path`` is an EAGLE-3 draft, or None if it is not (or cannot be read).

    Evidence, in order: ``architectures`` naming an Eagle3 class; ``eagle_config.use_aux_hidden_state``;
    speculators' ``speculators_model_type: eagle3``; an ``fc`` whose in-width is a multiple (>1) of hidden.
    """
    path = Path(path)
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    archs = config.get("architectures") or []
    for arch in archs if isinstance(archs, list) else []:
        if isinstance(arch, str) and "eagle3" in arch.lower():
            return f"config.json architectures = {archs}"
    eagle_config = config.get("eagle_config")
    if isinstance(eagle_config, dict) and eagle_config.get("use_aux_hidden_state"):
        return "config.json eagle_config.use_aux_hidden_state = true"
    if config.get("speculators_model_type") == "eagle3":
        return "config.json speculators_model_type = eagle3"
    hidden = config.get("hidden_size") or (config.get("transformer_layer_config") or {}).get("hidden_size")
    try:
        width = _fc_in_width(path)
    except Exception:  # noqa: BLE001 - an unreadable header is the doctor's business, not the guard's
        width = None
    if width and isinstance(hidden, int) and hidden > 0 and width % hidden == 0 and width // hidden > 1:
        return f"fc.weight takes {width} = {width // hidden} x hidden ({hidden}) inputs"
    return None
