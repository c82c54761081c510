"""Is a draft checkpoint an EAGLE-3 draft?  The algorithm guard's question and the doctor's, answered by one
rule (:func:`evidence`, which is :func:`.draft_layouts.classify`'s kind); the guard reads config.json and the
safetensors header only."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from ..errors import Eagle3ConfigError
from .draft_layouts import FC_NAMES, MIN_AUX_STATES, classify
from .formats import list_weight_files, read_config
from .safetensors_header import read_header

__all__ = ["MIN_AUX_STATES", "eagle3_draft_evidence", "evidence"]


def evidence(config: Mapping, tensors: Mapping[str, Sequence[int]] | None = None) -> str | None:
    """Why the draft whose config is ``config`` (tensor name -> shape: ``tensors``) is an EAGLE-3 draft, or None:
    the one rule of the algorithm guard (from the files, :func:`eagle3_draft_evidence`) and the doctor (from what
    it read).  An EAGLE-3 kind of :func:`.draft_layouts.classify`: SGLang's or speculators' EAGLE-3 format (an
    Eagle3 architecture, ``eagle_config.use_aux_hidden_state``, ``speculators_model_type: eagle3``), an Eagle3
    class of another exporter, or an ``fc`` whose in-width is at least :data:`MIN_AUX_STATES` x hidden.
    """
    found = classify(config, tensors)
    return found.evidence if found is not None and found.is_eagle3 else None


def _fc_tensors(path: Path) -> dict[str, tuple[int, ...]]:
    """``fc.weight``'s shape from the safetensors header (no tensor data is read)."""
    wf = list_weight_files(path)
    files = [path / wf.weight_map[k] for k in FC_NAMES if k in wf.weight_map] if wf.weight_map else wf.files
    for f in files:
        tensors = read_header(f, root=path).tensors
        for key in FC_NAMES:
            if key in tensors:
                return {key: tuple(tensors[key].shape)}
    return {}


def eagle3_draft_evidence(path: str | Path) -> str | None:
    """Why the checkpoint at ``path`` is an EAGLE-3 draft (:func:`evidence`), or None if it is not (or cannot
    be read)."""
    path = Path(path)
    try:
        config = read_config(path, "draft")  # through the safe open: no link out of the checkpoint
    except (OSError, Eagle3ConfigError):
        return None
    try:
        tensors = _fc_tensors(path)
    except Exception:  # noqa: BLE001 - an unreadable header is the doctor's business, not the guard's
        tensors = {}
    return evidence(config, tensors)
