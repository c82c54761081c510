"""The acceptance of one draft token at temperature, as sglang's verify step accepts it (``measure-accept
--temperature``).

**What sglang does.**  The EAGLE draft proposes its top-k tokens by its own logits, whatever the request's
temperature: ``softmax(next_token_logits)`` then ``fast_topk`` (sglang 0.5.9 ``speculative/eagle_worker.py``,
``draft_forward`` and ``capture_for_decode``; ``select_top_k_tokens`` in ``spec_utils.py`` only arranges the tree),
so with topk 1 it proposes its argmax.  At a temperature above 0 the verify step (``EagleVerifyInput.verify`` in
``eagle_info.py``) turns the target's logits into ``q = softmax(logits / T)``, renormalised to the request's top-k
(``top_k_renorm_prob``), then to its top-p (``top_p_renorm_prob``, where a top-p is below 1), and runs sgl_kernel's
``tree_speculative_sampling_target_only`` with the draft treated as one-hot: the draft token x is accepted when a
uniform coin is at most ``q(x)`` (with the default ``--speculative-accept-threshold-single`` and ``-acc`` of 1.0),
so with probability ``q(x)``; a rejected x is taken out of ``q`` before the replacement token is drawn.  Per
position of a chain that is :func:`target_only`: ``q(argmax of the draft)``.

From 0.5.14, ``--speculative-use-rejection-sampling`` (the spec v2 worker) makes the draft sample its token from
``p = softmax(draft logits / T)`` (``renorm_draft_probs``; temperature only, no top-k or top-p on the draft's side)
and the verify step accept it with probability ``min(1, q(x) / p(x))``: the expected acceptance of a position is
then :func:`rejection_sampling`'s ``sum_x min(p(x), q(x))``, the figure of exact speculative sampling.

A greedy request (temperature 0) is ``top_k 1`` to sglang: ``q`` is one-hot at the target's argmax, and both figures
are the greedy one.  top-k keeps every probability equal to the k-th largest and top-p keeps the smallest set of the
largest probabilities whose sum reaches p (with every probability equal to the smallest kept one): flashinfer's
``top_k_renorm_probs`` / ``top_p_renorm_probs``, up to ties, which the kernels leave unspecified.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: sglang's verify step at temperature: the draft token accepted with the target's probability of it
TARGET_ONLY = "target-only"
#: ``--speculative-use-rejection-sampling``: the draft samples from ``softmax(logits / T)``, accepted with
#: ``min(1, q / p)``
REJECTION_SAMPLING = "rejection-sampling"
GREEDY = "greedy"
#: the highest temperature measured (sglang takes any; above this the target's distribution is nearly uniform)
MAX_TEMPERATURE = 100.0


@dataclass(frozen=True)
class Sampling:
    """The request sampling a figure holds at: ``temperature`` 0 is greedy; ``top_k`` None is the whole vocabulary,
    ``top_p`` 1.0 no top-p."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float = 1.0

    def __post_init__(self) -> None:
        t, k, p = self.temperature, self.top_k, self.top_p
        if not (isinstance(t, (int, float)) and math.isfinite(t) and 0.0 <= t <= MAX_TEMPERATURE):
            raise ValueError(f"temperature {t!r}: expected 0 (greedy) .. {MAX_TEMPERATURE:g}")
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"top-k {k!r}: expected a whole number >= 1")
        if not (isinstance(p, (int, float)) and 0.0 < p <= 1.0):
            raise ValueError(f"top-p {p!r}: expected 0 < top-p <= 1")
        if t == 0.0 and (k is not None or p != 1.0):
            raise ValueError("top-k and top-p apply at a temperature above 0 (temperature 0 is greedy)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def describe(self) -> str:
        """``greedy (temperature 0)``, or ``temperature 0.6`` with its top-k and top-p where given."""
        if self.greedy:
            return "greedy (temperature 0)"
        return (
            f"temperature {self.temperature:g}"
            + (f", top-k {self.top_k}" if self.top_k is not None else "")
            + (f", top-p {self.top_p:g}" if self.top_p != 1.0 else "")
        )

    def fields(self) -> dict[str, Any]:
        """The keys of the draft config's ``expected_accept_length`` field that state it (top-k / top-p only
        where given)."""
        out: dict[str, Any] = {"temperature": 0 if self.greedy else self.temperature}
        if self.top_k is not None:
            out["top_k"] = self.top_k
        if self.top_p != 1.0:
            out["top_p"] = self.top_p
        return out


def target_probs(logits, sampling: Sampling):
    """The target's distribution the verify step accepts with: ``softmax(logits / T)`` in float32, then top-k,
    then top-p renormalisation (sglang's order), by the same functions the CPU profile's verify runs."""
    from ..cpu.spec_sampling import top_k_renorm_prob, top_p_renorm_prob

    q = (logits.float() / sampling.temperature).softmax(-1)
    if sampling.top_k is not None:
        q = top_k_renorm_prob(q, sampling.top_k)
    return q if sampling.top_p >= 1.0 else top_p_renorm_prob(q, sampling.top_p)


def draft_probs(logits, sampling: Sampling):
    """The draft's distribution under ``--speculative-use-rejection-sampling``: ``softmax(logits / T)`` in float32
    (no top-k or top-p: sglang's ``renorm_draft_probs``)."""
    return (logits.float() / sampling.temperature).softmax(-1)


def target_only(q, draft_ids):
    """Per row, the probability sglang's default verify accepts the draft's token with: ``q[draft_ids]`` (``q``
    [rows, target vocab], ``draft_ids`` [rows]: the draft's argmax, as target ids)."""
    return q.gather(-1, draft_ids.view(-1, 1)).squeeze(-1)


def rejection_sampling(q, p, hot):
    """Per row, ``sum_x min(p(x), q(x))``: the acceptance of exact speculative sampling with the draft sampling from
    ``p`` [rows, draft vocab] (draft id i is target id ``hot[i]``; a target token outside the draft vocabulary has
    ``p`` 0, so adds nothing)."""
    import torch

    return torch.minimum(p, q[:, hot]).sum(-1)
