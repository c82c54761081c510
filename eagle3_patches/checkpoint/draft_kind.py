"""Is a draft checkpoint an EAGLE-3 draft?  The algorithm guard's question and the doctor's, answered by one
rule (:func:`evidence`); the guard reads config.json and the safetensors header only."""

from __future__ import annotations

from pathlib import Path

from ..errors import Eagle3ConfigError
from .formats import (
    SGLANG_EAGLE3,
    SPECULATORS,
    detect_format,
    list_weight_files,
    read_config,
)
from .safetensors_header import read_header

_FC = ("fc.weight", "model.fc.weight")
#: an EAGLE-3 draft's fc takes one hidden state per aux layer (3 in sglang: ``hidden_size_in * 3``); an EAGLE-1/2
#: draft's takes 2 x hidden (the token's embedding and the hidden state), and is no evidence
MIN_AUX_STATES = 3


def evidence(fmt: str, architectures, hidden, fc_width: int | None) -> str | None:
    """Why a draft of format ``fmt`` whose ``fc`` takes ``fc_width`` inputs is an EAGLE-3 draft, or None: the one
    rule of the algorithm guard (from the files, :func:`eagle3_draft_evidence`) and the doctor (from what it read).

    Evidence: the config is in SGLang's or speculators' EAGLE-3 format (``formats.detect_format``: an Eagle3
    architecture, ``eagle_config.use_aux_hidden_state``, ``speculators_model_type``), else an ``fc`` whose
    in-width is a multiple of hidden, at least :data:`MIN_AUX_STATES` of them.
    """
    if fmt in (SGLANG_EAGLE3, SPECULATORS):
        return f"config.json: {fmt} format, architectures {architectures}"
    if (
        fc_width
        and isinstance(hidden, int)
        and hidden > 0
        and fc_width % hidden == 0
        and fc_width // hidden >= MIN_AUX_STATES
    ):
        return f"fc.weight takes {fc_width} = {fc_width // hidden} x hidden ({hidden}) inputs"
    return None


def _fc_in_width(path: Path) -> int | None:
    """``fc.weight``'s in-width from the safetensors header (no tensor data is read)."""
    wf = list_weight_files(path)
    files = [path / wf.weight_map[k] for k in _FC if k in wf.weight_map] if wf.weight_map else wf.files
    for f in files:
        tensors = read_header(f, root=path).tensors
        for key in _FC:
            if key in tensors and len(tensors[key].shape) == 2:  # [hidden, k x hidden], as the doctor reads it
                return int(tensors[key].shape[1])
    return None


def eagle3_draft_evidence(path: str | Path) -> str | None:
    """Why the checkpoint at ``path`` is an EAGLE-3 draft (:func:`evidence`), or None if it is not (or cannot
    be read)."""
    path = Path(path)
    try:
        config = read_config(path, "draft")  # through the safe open: no link out of the checkpoint
    except (OSError, Eagle3ConfigError):
        return None
    fmt = detect_format(config)
    width = None
    if fmt not in (SGLANG_EAGLE3, SPECULATORS):
        try:
            width = _fc_in_width(path)
        except Exception:  # noqa: BLE001 - an unreadable header is the doctor's business, not the guard's
            width = None
    return evidence(fmt, config.get("architectures"), config.get("hidden_size"), width)
