"""Is a draft checkpoint an EAGLE-3 draft?  Read from config.json and the safetensors header only
(the algorithm guard's question, answered with the same format detection the doctor uses)."""

from __future__ import annotations

from pathlib import Path

from ..errors import Eagle3ConfigError
from .formats import SGLANG_EAGLE3, SPECULATORS, detect_format, list_weight_files, read_config
from .safetensors_header import read_header

_FC = ("fc.weight", "model.fc.weight")


def _fc_in_width(path: Path) -> int | None:
    """``fc.weight``'s in-width from the safetensors header (no tensor data is read)."""
    wf = list_weight_files(path)
    files = [path / wf.weight_map[k] for k in _FC if k in wf.weight_map] if wf.weight_map else wf.files
    for f in files:
        tensors = read_header(f, root=path).tensors
        for key in _FC:
            if key in tensors and tensors[key].shape:
                return int(tensors[key].shape[-1])
    return None


def eagle3_draft_evidence(path: str | Path) -> str | None:
    """Why the checkpoint at ``path`` is an EAGLE-3 draft, or None if it is not (or cannot be read).

    Evidence: the config is in SGLang's or speculators' EAGLE-3 format (``formats.detect_format``:
    an Eagle3 architecture, ``eagle_config.use_aux_hidden_state``, ``speculators_model_type``), else
    an ``fc`` whose in-width is a multiple (> 1) of hidden.
    """
    path = Path(path)
    try:
        config = read_config(path, "draft")  # through the safe open: no link out of the checkpoint
    except (OSError, Eagle3ConfigError):
        return None
    fmt = detect_format(config)
    if fmt in (SGLANG_EAGLE3, SPECULATORS):
        return f"config.json: {fmt} format, architectures {config.get('architectures')}"
    hidden = config.get("hidden_size")
    try:
        width = _fc_in_width(path)
    except Exception:  # noqa: BLE001 - an unreadable header is the doctor's business, not the guard's
        width = None
    if width and isinstance(hidden, int) and hidden > 0 and width % hidden == 0 and width // hidden > 1:
        return f"fc.weight takes {width} = {width // hidden} x hidden ({hidden}) inputs"
    return None
