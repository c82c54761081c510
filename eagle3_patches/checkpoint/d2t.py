"""``d2t``: the draft-to-target vocabulary map of an EAGLE-3 draft.

It stores *offsets*: draft token ``i`` is target token ``i + d2t[i]`` (sglang
0.5.9 ``llama_eagle3.py``: ``hot_token_id = d2t + arange``).  Two corruptions are
common and silent: saving absolute target ids instead of offsets, and
subtracting an ``arange`` from offsets that already had it subtracted.  This
module says which, so the loader patch and the doctor can name the fix.
Works on anything ``numpy.asarray`` accepts (a CPU torch tensor, a numpy array),
so the doctor never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class D2tProblem:
    kind: str  # shape | dtype | length | absolute | arange-twice | out-of-range | duplicate
    what: str  # one sentence: what is wrong
    fix: str  # one sentence: how to fix it

    def __str__(self) -> str:
        return f"{self.what} {self.fix}"


def _valid_ids(ids: np.ndarray, target_vocab: int) -> bool:
    if ids.size == 0:
        return True
    return bool(ids.min() >= 0 and ids.max() < target_vocab and np.unique(ids).size == ids.size)


def check_d2t(d2t, *, target_vocab: int, draft_vocab: int | None = None) -> D2tProblem | None:
    """Return the first problem with ``d2t`` (1-D integer offsets), or None when it is valid."""
    values = np.asarray(d2t)
    if values.ndim != 1:
        return D2tProblem(
            "shape", f"d2t has shape {tuple(values.shape)}, expected a 1-D tensor.", "Save d2t as a 1-D int64 tensor."
        )
    if values.dtype.kind not in "iu":
        return D2tProblem(
            "dtype", f"d2t has dtype {values.dtype}, expected an integer dtype.", "Save d2t as int64 offsets."
        )
    n = values.shape[0]
    if draft_vocab is not None and n != draft_vocab:
        return D2tProblem(
            "length",
            f"d2t has {n} entries but the draft config says draft_vocab_size={draft_vocab}.",
            "d2t needs one entry per draft token: re-export the draft, or fix draft_vocab_size in config.json.",
        )
    offsets = values.astype(np.int64)
    arange = np.arange(n, dtype=np.int64)
    if _valid_ids(offsets + arange, target_vocab):
        return None
    if _valid_ids(offsets, target_vocab):
        return D2tProblem(
            "absolute",
            "d2t holds absolute target ids, not offsets (i + d2t[i] is not a distinct in-range target id, "
            "but d2t[i] itself is).",
            "Store offsets: d2t[i] = target_id[i] - i (eagle3-patches convert does this).",
        )
    if _valid_ids(offsets + 2 * arange, target_vocab):
        return D2tProblem(
            "arange-twice",
            "d2t looks like offsets with an arange subtracted twice (i + d2t[i] is invalid, 2*i + d2t[i] is valid).",
            "Add arange back once: d2t = d2t + arange(len(d2t)).",
        )
    ids = offsets + arange
    bad = np.flatnonzero((ids < 0) | (ids >= target_vocab))
    fix = "Re-export d2t from the draft vocabulary mapping used in training (offsets, distinct targets)."
    if bad.size:
        i = int(bad[0])
        return D2tProblem(
            "out-of-range",
            f"d2t maps draft token {i} to target id {int(ids[i])}, outside the target vocabulary [0, {target_vocab}).",
            fix,
        )
    return D2tProblem(
        "duplicate",
        f"d2t maps {n - np.unique(ids).size} draft tokens onto target ids already used by another draft token.",
        fix,
    )
