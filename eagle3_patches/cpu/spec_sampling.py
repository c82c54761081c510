"""Pure-torch CPU versions of the sgl_kernel ops sglang's EAGLE verify calls at temperature > 0, and the CPU-profile
patch that puts them where each release looks for them.

At temperature > 0 sglang verifies a draft tree by "target-only" speculative sampling: the target's distribution
``q`` at each node (softmax of the logits at the request's temperature, then top-k and top-p renormalisation), the
draft treated as proposing its tokens with certainty.  Three sgl_kernel ops do it; none has a CPU build:

* :func:`top_k_renorm_prob` / :func:`top_p_renorm_prob`: flashinfer's ``top_k_renorm_probs`` /
  ``top_p_renorm_probs`` (``flashinfer/sampling.py``; sgl-kernel's ``python/sgl_kernel/sampling.py`` wraps them
  under these names; sglang 0.5.21+ calls flashinfer's directly on CUDA);
* :func:`tree_speculative_sampling_target_only`: sgl-kernel's ``TreeSpeculativeSamplingTargetOnly``
  (``sgl-kernel/csrc/speculative/speculative_sampling.cuh``).  Per request, from the root: walk the children of the
  last accepted node in sibling order; child ``x`` is accepted when the request's coin for that node is at most the
  target mass of the children tried so far (``q(x1) + ... + q(x)``), so each child is accepted with probability
  ``q(x)``; a rejected child's ``q(x)`` is written to ``draft_probs`` at that node.  The token after the last
  accepted node (the bonus token, or the first rejected position's replacement) is drawn from
  ``relu(q - draft_probs)`` there, by the final coin (inverse CDF: the first index whose inclusive cumulative sum
  exceeds ``coin * total``).  The output is distributed exactly as sampling from ``q`` one token at a time.

Differences from the CUDA kernels, all on inputs where the kernel's answer is an accident of floating point:

* a child whose target probability is 0 is never accepted by the coin (the kernel accepts it when the coin is exactly
  0.0, which ``torch.rand`` can draw);
* NaN follows the kernel: a NaN probability never passes a comparison (the child is rejected) and counts as 0 in the
  residual (``max(NaN, 0)`` is 0 on the GPU); when the residual is all zero the kernel's fallback is kept (the last
  index with positive mass, else ``d - 1``);
* top-k keeps every probability equal to the k-th largest (the kernel's pivot search leaves ties unspecified).

Where each release reaches them (read from the wheels; :meth:`CpuSpecSampling.plan` finds the layout):

* 0.5.9 - 0.5.13: ``eagle_info`` (the v1 worker) and ``eagle_info_v2`` bind the three names at module level only on
  CUDA (``if is_cuda(): from sgl_kernel import ...``).  The v1 verify falls back to greedy verification, with a
  warning, unless ``TREE_SPEC_KERNEL_AVAILABLE`` (``_is_cuda``): on CPU every request was verified greedily.  The v2
  verify (the only worker from 0.5.13) has no such gate: a sampled request fails with ``NameError``.
* 0.5.14 - 0.5.22: ``eagle_utils.eagle_sample`` imports them inside the function (``from sgl_kernel import ...``):
  the CPU profile's stand-in raised NotImplementedError (0.5.14, 0.5.15); from 0.5.16 the function's greedy test
  includes ``_is_cpu``, so sglang on CPU verifies every request greedily whatever its temperature, silently (the
  first token of a request is sampled, every later one is the target's argmax).
* 0.5.23 on: ``eagle_utils`` binds them at module level from ``sglang.kernels.ops`` (None on CPU); the greedy test
  is ``_verify_uses_greedy(is_cpu=_is_cpu, ...)``, read at call time.

The patch binds the ops where the release reads them (module globals, or the stand-in ``sgl_kernel``'s attributes
for a function-level import; never a real ``sgl_kernel``), sets ``eagle_info.TREE_SPEC_KERNEL_AVAILABLE`` where it
gates the v1 verify, and where ``eagle_sample`` sends CPU to greedy verification it runs a batch that is not all
greedy with ``eagle_utils._is_cpu`` false for the length of the call (the flag is read there only to pick greedy
verification; the scheduler calls verify from one thread).  A batch that is all greedy is untouched.  These loops
are per request over the few draft tokens, plus vectorised torch over the vocabulary: the tiny models of the tests.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
from packaging.specifiers import SpecifierSet

from ..registry import NotApplicable, Patch, Saver, expect_attr, source_of
from .spec_kernels import eagle_utils_on_cpu
from .stubs import is_stub

_EAGLE_INFO = "sglang.srt.speculative.eagle_info"
_EAGLE_INFO_V2 = "sglang.srt.speculative.eagle_info_v2"


def _per_row(value: Any, rows: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A scalar or a per-row tensor as a ``[rows]`` tensor on ``device`` (the kernels take either)."""
    if isinstance(value, torch.Tensor):
        out = value.reshape(-1).to(device=device, dtype=dtype)
        if out.numel() == 1:
            return out.expand(rows)
        if out.numel() != rows:
            raise ValueError(f"{out.numel()} per-row values for {rows} rows")
        return out
    return torch.full((rows,), value, dtype=dtype, device=device)


def _renormalised(probs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    kept = torch.where(keep, probs, torch.zeros((), dtype=probs.dtype, device=probs.device))
    return kept / kept.sum(dim=-1, keepdim=True)


def top_k_renorm_prob(probs: torch.Tensor, top_k: torch.Tensor | int) -> torch.Tensor:
    """flashinfer's ``top_k_renorm_probs``: per row, the probabilities below the k-th largest set to 0 and the row
    renormalised; a row whose k is <= 0 or >= the vocabulary is returned as it is (sglang's "no top-k" is 2^30).
    ``measure-accept --temperature`` renormalises with it too (:mod:`eagle3_patches.acceptance.sampling`)."""
    rows, d = probs.reshape(-1, probs.shape[-1]).shape
    flat = probs.reshape(rows, d)
    k = _per_row(top_k, rows, torch.long, probs.device)
    active = (k > 0) & (k < d)
    if not bool(active.any()):
        return probs.clone()
    ordered = torch.sort(flat, dim=-1, descending=True).values
    kth = ordered.gather(1, (k.clamp(1, d) - 1).unsqueeze(1))
    out = torch.where(active.unsqueeze(1), _renormalised(flat, flat >= kth), flat)
    return out.reshape(probs.shape)


def top_p_renorm_prob(probs: torch.Tensor, top_p: torch.Tensor | float) -> torch.Tensor:
    """flashinfer's ``top_p_renorm_probs``: per row, the smallest set of the largest probabilities whose sum reaches
    ``top_p`` kept (with every probability equal to the smallest kept one), the rest set to 0, the row renormalised;
    a row whose ``top_p`` is >= 1 is returned as it is."""
    rows, d = probs.reshape(-1, probs.shape[-1]).shape
    flat = probs.reshape(rows, d)
    p = _per_row(top_p, rows, flat.dtype, probs.device)
    active = p < 1.0
    if not bool(active.any()):
        return probs.clone()
    ordered = torch.sort(flat, dim=-1, descending=True).values
    mass_before = torch.cumsum(ordered, dim=-1) - ordered  # the mass of the larger probabilities
    kept_in_order = mass_before < p.unsqueeze(1)
    kept_in_order[:, 0] = True  # the largest probability is always kept
    last = kept_in_order.sum(dim=-1, keepdim=True) - 1
    threshold = ordered.gather(1, last)
    out = torch.where(active.unsqueeze(1), _renormalised(flat, flat >= threshold), flat)
    return out.reshape(probs.shape)


def _sample_residual(q: torch.Tensor, p: torch.Tensor | None, coin: float) -> int:
    """The kernel's final draw: inverse CDF over ``relu(q - p)`` (NaN as 0) at ``coin * total``."""
    residual = q.double() if p is None else q.double() - p.double()
    residual = torch.nan_to_num(residual, nan=0.0).clamp(min=0.0)
    valid = residual > 0
    if not bool(valid.any()):
        return q.numel() - 1
    u = coin * float(residual.sum())
    above = torch.nonzero(valid & (torch.cumsum(residual, 0) > u))
    if above.numel():
        return int(above[0])
    return int(torch.nonzero(valid)[-1])  # u at the very top of the mass: the last index with mass


def tree_speculative_sampling_target_only(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,
) -> None:
    """CPU version of ``sgl_kernel.tree_speculative_sampling_target_only``: fills ``predicts``, ``accept_index``,
    ``accept_token_num`` and the rejected children's entries of ``draft_probs`` in place (the module docstring
    gives the algorithm).  ``candidates`` and the ``retrive_*`` trees are ``[bs, n]``; ``uniform_samples``
    ``[bs, n]`` (the coin of each node, used when it is the last accepted node);
    ``uniform_samples_for_final_sampling`` ``[bs]``; ``target_probs`` / ``draft_probs`` ``[bs, n, vocab]``;
    ``accept_index`` ``[bs, steps + 1]``.  ``deterministic`` is the kernel's choice of summation order; a
    sequential sum here either way."""
    del deterministic
    bs, n = candidates.shape
    num_spec = accept_index.shape[1]
    threshold_acc = max(float(threshold_acc), 1e-9)  # as the kernel's launcher caps it
    threshold_single = float(threshold_single)
    q = target_probs.reshape(bs, n, -1)
    written = draft_probs.reshape(bs, n, -1)
    if written.data_ptr() != draft_probs.data_ptr():
        raise ValueError("draft_probs must be contiguous (rejected candidates are written into it)")
    cand = candidates.tolist()
    r_index = retrive_index.tolist()
    r_next = retrive_next_token.tolist()
    r_sib = retrive_next_sibling.tolist()
    coins = uniform_samples.reshape(bs, n).tolist()
    final_coins = uniform_samples_for_final_sampling.reshape(bs).tolist()
    q_rows = q.tolist() if q.numel() <= 1 << 16 else None  # tiny: a list lookup per candidate beats a tensor read
    pred_flat = predicts.view(-1)

    for b in range(bs):
        node = 0  # the last accepted draft position: q[b, node] is the distribution drawn from
        coin = coins[b][0]
        last = int(r_index[b][0])
        accept_index[b, 0] = last
        accepted = 0
        prob_acc = 0.0
        cur = 0
        for _ in range(1, num_spec):
            cur = int(r_next[b][cur])
            visited = 0
            while cur != -1:
                visited += 1
                if visited > n:
                    raise ValueError(f"malformed retrive_next_sibling for request {b}: the sibling chain loops")
                token = int(cand[b][cur])
                single = q_rows[b][node][token] if q_rows is not None else float(q[b, node, token])
                prob_acc += single
                if (single > 0 and coin <= prob_acc / threshold_acc) or single >= threshold_single:
                    prob_acc = 0.0
                    node = cur
                    coin = coins[b][cur]
                    pred_flat[last] = token
                    accepted += 1
                    last = int(r_index[b][cur])
                    accept_index[b, accepted] = last
                    break
                written[b, node, token] = q[b, node, token]
                cur = int(r_sib[b][cur])
            if cur == -1:
                break
        accept_token_num[b] = accepted
        # no draft mass is taken off where every step was accepted: the bonus token is drawn from q itself
        residual_of = None if accepted == num_spec - 1 else written[b, node]
        pred_flat[last] = _sample_residual(q[b, node], residual_of, float(final_coins[b]))


#: the ops by the names sglang calls them
OPS: dict[str, Callable[..., Any]] = {
    "top_k_renorm_prob": top_k_renorm_prob,
    "top_p_renorm_prob": top_p_renorm_prob,
    "tree_speculative_sampling_target_only": tree_speculative_sampling_target_only,
}


def sampling_on_cpu(original: Callable[..., Any], utils: ModuleType) -> Callable[..., Any]:
    """``eagle_sample`` running a batch that is not all greedy with ``utils._is_cpu`` false, so that sglang takes
    its sampling branch on CPU; an all-greedy batch goes through untouched."""

    @functools.wraps(original)
    def eagle_sample(*args: Any, **kwargs: Any) -> Any:
        batch = kwargs["batch"] if "batch" in kwargs else args[1]
        if batch.sampling_info.is_all_greedy:
            return original(*args, **kwargs)
        setattr(utils, "_is_cpu", False)  # noqa: B010 - a module global of sglang's
        try:
            return original(*args, **kwargs)
        finally:
            setattr(utils, "_is_cpu", True)  # noqa: B010

    return eagle_sample


#: one replacement: (owner, attribute, new value)
Replacement = tuple[Any, str, object]


class CpuSpecSampling(Patch):
    """The sampling verify path of sglang's EAGLE workers on CPU: the ops bound where each release reads them, and
    the gates that send CPU to greedy verification opened (the module docstring lists both per release)."""

    name = "cpu_spec_sampling"
    summary = "temperature > 0 verify on CPU: pure-torch tree speculative sampling, top-k / top-p renormalisation"
    # as cpu_spec_kernels: when eagle_info's import ends, eagle_utils and (up to 0.5.13) eagle_info_v2 are complete
    module = _EAGLE_INFO
    applies_to = SpecifierSet(">=0.5.9")

    def plan(self, info: ModuleType) -> list[Replacement]:
        utils = eagle_utils_on_cpu()
        if hasattr(utils, "eagle_sample"):  # 0.5.14 on: one sampling function
            return self._plan_eagle_sample(utils)
        return self._plan_verify_inputs(info)

    @staticmethod
    def _plan_verify_inputs(info: ModuleType) -> list[Replacement]:
        """0.5.9 - 0.5.13: the names are module globals of ``eagle_info`` / ``eagle_info_v2``, bound on CUDA only."""
        plan: list[Replacement] = []
        for mod in (info, sys.modules.get(_EAGLE_INFO_V2)):
            if mod is None:
                continue
            source = source_of(mod)
            for op_name, op in OPS.items():
                if f"{op_name}(" not in source:
                    continue
                if mod.__dict__.get(op_name) is not None:
                    raise NotApplicable(f"{mod.__name__}.{op_name} is bound already: a kernel of its own serves it")
                plan.append((mod, op_name, op))
        if getattr(info, "TREE_SPEC_KERNEL_AVAILABLE", True) is False:
            plan.append((info, "TREE_SPEC_KERNEL_AVAILABLE", True))
        if not plan:
            raise NotApplicable("eagle_info / eagle_info_v2 call none of the sampling ops by name")
        return plan

    @staticmethod
    def _plan_eagle_sample(utils: ModuleType) -> list[Replacement]:
        """0.5.14 on: ``eagle_utils.eagle_sample`` imports the ops inside the function (up to 0.5.22) or reads
        module globals (0.5.23 on); from 0.5.16 it sends CPU to greedy verification through ``_is_cpu``."""
        original = expect_attr(utils, "eagle_sample")
        source = source_of(original)
        plan: list[Replacement] = []
        if "from sgl_kernel import" in source:
            stand_in = sys.modules.get("sgl_kernel")
            if not is_stub(stand_in):
                raise NotApplicable("a real sgl_kernel is installed: its own ops serve eagle_sample")
            plan += [(stand_in, op_name, op) for op_name, op in OPS.items() if op_name in source]
        else:
            for op_name, op in OPS.items():
                if op_name not in source:
                    continue
                if utils.__dict__.get(op_name, None) is not None:
                    raise NotApplicable(f"eagle_utils.{op_name} is bound already: a kernel of its own serves it")
                plan.append((utils, op_name, op))
        if not plan:
            raise NotApplicable("eagle_sample calls none of the sampling ops by name")
        if "_is_cpu" in source:
            if source.count("_is_cpu") != 1 or not getattr(utils, "_is_cpu", False):
                raise NotApplicable("eagle_sample reads _is_cpu other than to choose greedy verification")
            wrapper = sampling_on_cpu(original, utils)
            plan += [
                (mod, "eagle_sample", wrapper)
                for name, mod in list(sys.modules.items())
                if name.startswith("sglang.") and mod is not None and mod.__dict__.get("eagle_sample") is original
            ]
        return plan

    def check(self, module: ModuleType) -> None:
        self.plan(module)

    def patch(self, module: ModuleType, saver: Saver) -> None:
        for owner, attr, value in self.plan(module):
            imported_by = "sglang." if attr == "eagle_sample" else None
            saver.set(owner, attr, value, imported_by=imported_by)


__all__ = [
    "CpuSpecSampling",
    "OPS",
    "top_k_renorm_prob",
    "top_p_renorm_prob",
    "tree_speculative_sampling_target_only",
]
