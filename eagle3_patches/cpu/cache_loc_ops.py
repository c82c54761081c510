"""Pure-torch versions of the sgl_kernel CPU-build ops sglang's EAGLE decode loop calls from 0.5.16.

From sglang 0.5.16 ("Intel AMX CPU speculative decoding") the KV-slot
bookkeeping of the speculative loop has a CPU branch: with ``SGLANG_USE_CPU_ENGINE=1`` (set by the
CPU profile) ``is_cpu()`` is true and these modules import ops of sgl_kernel's *CPU build* at
import time and call them instead of their Triton kernels:

* ``sglang.srt.mem_cache.allocation``: ``assign_req_to_token_pool_cpu``
  (``assign_req_to_token_pool_func``; every decode step's ``alloc_for_spec_decode``);
* ``sglang.kernels.ops.speculative.cache_locs``: ``assign_extend_cache_locs_cpu`` (verify slots,
  accepted-token moves) and, from 0.5.23, ``assign_draft_cache_locs_contiguous_cpu`` (draft slots);
* ``sglang.kernels.ops.speculative.eagle``: ``fill_bonus_tokens_cpu``,
  ``fill_accept_out_cache_loc_cpu`` (after verify).
* ``sglang.srt.speculative.eagle_worker_common`` (0.5.16 - 0.5.22): ``assign_draft_cache_locs_contiguous_cpu``
  (draft slots; ``prepare_for_draft``);
* ``sglang.srt.speculative.spec_utils`` (0.5.16 - 0.5.22): ``assign_extend_cache_locs_cpu``
  (``move_accept_tokens_to_target_kvcache``, the accepted tokens' slots after a topk > 1 verify).

Without that build the names are the CPU profile's stand-ins (``stubs.py``), which raise
``NotImplementedError``; the first decode step stops in ``assign_req_to_token_pool_cpu``.  The
non-CPU path of these functions is gated on ``_is_cuda or _is_hip ...`` (not on ``not _is_cpu``),
so there is no torch path to fall back to: this module provides the ops.  Semantics are those of
``sgl-kernel/csrc/cpu/speculative`` (and of the Triton kernels beside the Python callers): index
copies between ``req_to_token`` rows and flat int64 slot vectors.

:class:`CpuCacheLocOps` puts them in place only where sglang's module-level name *is* a stand-in,
never over a real CPU build, and keeps the originals in the ``Saver``; an op name the release does not
import is left out (the draft-slot op is in ``cache_locs`` only from 0.5.23, where ``eagle_worker_common`` and
``spec_utils`` import none).  Releases before 0.5.16 have no such names: the patches report ``not-applicable`` there.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import torch
from packaging.specifiers import SpecifierSet

from ..registry import (
    NotApplicable,
    Patch,
    Saver,
    expect_attr,
    expect_source,
    source_of,
)
from .stubs import is_stub


def _segments(start_offset: torch.Tensor, end_offset: torch.Tensor) -> list[tuple[int, int, int]]:
    """``(start, end, out_offset)`` per request; out_offset is the running sum of the lengths."""
    out, acc = [], 0
    for s, e in zip(start_offset.tolist(), end_offset.tolist()):
        out.append((int(s), int(e), acc))
        acc += int(e) - int(s)
    return out


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len):
    """``req_to_token[req_pool_indices[i], start[i]:end[i]] = out_cache_loc[prefix_i : prefix_i + len_i]``."""
    assert req_to_token.shape[1] == pool_len
    for req, (s, e, o) in zip(req_pool_indices.tolist(), _segments(start_offset, end_offset)):
        req_to_token[int(req), s:e] = out_cache_loc[o : o + e - s].to(req_to_token.dtype)


def assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len):
    """The gather the other way: ``out_cache_loc[prefix_i : prefix_i + len_i] = req_to_token[req_i, start_i:end_i]``."""
    assert req_to_token.shape[1] == pool_len
    segments = _segments(start_offset, end_offset)
    if segments and segments[-1][2] + segments[-1][1] - segments[-1][0] > out_cache_loc.numel():
        raise ValueError("assign_extend_cache_locs: out_cache_loc is shorter than the offsets require")
    for req, (s, e, o) in zip(req_pool_indices.tolist(), segments):
        out_cache_loc[o : o + e - s] = req_to_token[int(req), s:e].to(out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len, topk, num_steps
):
    """Per request, the ``topk * num_steps`` slots from ``seq_lens[i]`` on, read back into ``out_cache_loc``."""
    assert req_to_token.shape[1] == pool_len
    n = topk * num_steps
    for i, (req, sl) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        out_cache_loc[i * n : (i + 1) * n] = req_to_token[int(req), int(sl) : int(sl) + n].to(out_cache_loc.dtype)


def fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus_tokens, accept_stride):
    """``bonus_tokens[i] = accept_tokens.flat[accept_stride * i + accept_lens[i] - 1]`` (the last accepted token)."""
    flat = accept_tokens.reshape(-1)
    for i, n in enumerate(accept_lens.tolist()):
        bonus_tokens[i] = flat[accept_stride * i + int(n) - 1]


def fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accept_out_cache_loc, *size):
    """Compact ``out_cache_loc`` at the accepted indices (``-1`` = rejected, skipped), in order.
    (The fourth ``size`` argument of some sgl-kernel builds is the flat length of ``accept_index``.)"""
    idx = accept_index.reshape(-1)
    idx = idx[idx > -1].to(torch.int64)
    if idx.numel() and int(idx.max()) >= out_cache_loc.numel():
        raise ValueError("fill_accept_out_cache_loc: accept_index out of range")
    accept_out_cache_loc[: idx.numel()] = out_cache_loc[idx]


#: sglang module -> (function whose CPU branch calls the op, the op's module-level name, CPU version)
_OPS: dict[str, list[tuple[str, str, Callable]]] = {
    "sglang.srt.mem_cache.allocation": [
        ("assign_req_to_token_pool_func", "assign_req_to_token_pool_cpu", assign_req_to_token_pool_cpu),
    ],
    "sglang.kernels.ops.speculative.cache_locs": [
        (
            "assign_draft_cache_locs_contiguous_func",
            "assign_draft_cache_locs_contiguous_cpu",
            assign_draft_cache_locs_contiguous_cpu,
        ),
        ("assign_extend_cache_locs_func", "assign_extend_cache_locs_cpu", assign_extend_cache_locs_cpu),
    ],
    "sglang.kernels.ops.speculative.eagle": [
        ("fill_bonus_tokens_func", "fill_bonus_tokens_cpu", fill_bonus_tokens_cpu),
        ("fill_accept_out_cache_loc_func", "fill_accept_out_cache_loc_cpu", fill_accept_out_cache_loc_cpu),
    ],
    # 0.5.16 - 0.5.22: the draft slots are read back here (0.5.23 moved the op to cache_locs above)
    "sglang.srt.speculative.eagle_worker_common": [
        ("prepare_for_draft", "assign_draft_cache_locs_contiguous_cpu", assign_draft_cache_locs_contiguous_cpu),
    ],
    # 0.5.16 - 0.5.22: the accepted tokens' slots after a tree verify (topk > 1)
    "sglang.srt.speculative.spec_utils": [
        ("move_accept_tokens_to_target_kvcache", "assign_extend_cache_locs_cpu", assign_extend_cache_locs_cpu),
    ],
}


class CpuCacheLocOps(Patch):
    """One instance per sglang module of :data:`_OPS` (each is triggered by its own import)."""

    applies_to = SpecifierSet(">=0.5.16")

    def __init__(self, module: str):
        self.module = module
        self.name = "cpu_cache_loc_ops_" + module.rsplit(".", 1)[-1]
        names = ", ".join(op for _, op, _ in _OPS[module])
        self.summary = f"pure-torch {names} (sgl_kernel CPU-build ops of the EAGLE decode loop, sglang 0.5.16+)"

    def plan(self, module: ModuleType) -> list[tuple[str, Callable]]:
        held = [(caller, op, replacement) for caller, op, replacement in _OPS[module.__name__] if hasattr(module, op)]
        if not held:  # not imported by this release's CPU branch (0.5.16 - 0.5.22: no draft-slot op in cache_locs)
            raise NotApplicable(
                f"{module.__name__} imports none of {', '.join(op for _, op, _ in _OPS[module.__name__])}"
            )
        if not getattr(module, "_is_cpu", False):
            raise NotApplicable(f"{module.__name__} does not take its CPU branch (SGLANG_USE_CPU_ENGINE is not 1)")
        out = []
        for caller, op, replacement in held:
            expect_source(expect_attr(module, caller), f"{op}(")
            if not is_stub(expect_attr(module, op)):
                raise NotApplicable(f"{module.__name__}.{op} is sgl_kernel's real CPU build: it serves the loop")
            out.append((op, replacement))
        return out

    def check(self, module: ModuleType) -> None:
        self.plan(module)

    def patch(self, module: ModuleType, saver: Saver) -> None:
        for op, replacement in self.plan(module):
            saver.set(module, op, replacement)


def assign_extend_cache_locs_func(
    req_pool_indices, req_to_token, start_offset, end_offset, batch_size, draft_token_num, device
):
    """``triton_ops.cache_locs.assign_extend_cache_locs_func`` (sglang 0.5.13 - 0.5.15) for CPU: the
    slots ``[start_offset[i], end_offset[i])`` of each request, ``batch_size * draft_token_num`` int64."""
    out_cache_loc = torch.empty((batch_size * draft_token_num,), dtype=torch.int64, device=device)
    assign_extend_cache_locs_cpu(
        req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, req_to_token.shape[1]
    )
    return out_cache_loc


class CpuAssignExtendCacheLocs(Patch):
    """sglang 0.5.13 - 0.5.15: ``sglang.srt.speculative.triton_ops.cache_locs.assign_extend_cache_locs_func``
    has CUDA/HIP/MUSA/XPU and NPU branches only.  On CPU it falls off its end and returns None, so the
    target-verify batch gets ``out_cache_loc = None`` (``eagle_prepare_for_verify`` / 0.5.13's
    ``prepare_for_v2_verify``), and the first verify forward fails far away, in the KV pool's
    ``set_kv_buffer`` (``kv_buffer[layer][None] = cache_k``: "The expanded size of the tensor (1025)
    must match the existing size (16)").  0.5.16 added the CPU branch (``CpuCacheLocOps`` above).

    The module-level name is replaced; 0.5.13's ``eagle_info_v2`` (and 0.5.15's ngram / dflash workers)
    bind it by name when they import the module, after this patch has landed, so they hold the CPU
    version too, and ``revert()`` puts the original back there as well (``imported_by``)."""

    name = "cpu_assign_extend_cache_locs"
    summary = "assign_extend_cache_locs_func on CPU (0.5.13 - 0.5.15 have no CPU branch and return None)"
    module = "sglang.srt.speculative.triton_ops.cache_locs"
    applies_to = SpecifierSet(">=0.5.13")

    def check(self, module: ModuleType) -> None:
        func = expect_attr(module, "assign_extend_cache_locs_func")
        expect_source(func, "elif _is_npu:")
        if "_is_cpu" in source_of(func):
            raise NotApplicable("assign_extend_cache_locs_func has a CPU branch of its own")
        busy = [
            flag for flag in ("_is_cuda", "_is_hip", "_is_musa", "_is_xpu", "_is_npu") if getattr(module, flag, False)
        ]
        if busy:
            raise NotApplicable(f"an accelerator branch serves it here ({', '.join(busy)})")

    def patch(self, module: ModuleType, saver: Saver) -> None:
        saver.set(module, "assign_extend_cache_locs_func", assign_extend_cache_locs_func, imported_by="sglang.")


def build_patches() -> list[Patch]:
    return [CpuCacheLocOps(m) for m in _OPS] + [CpuAssignExtendCacheLocs()]


__all__ = [
    "CpuCacheLocOps",
    "CpuAssignExtendCacheLocs",
    "assign_extend_cache_locs_func",
    "build_patches",
    "assign_req_to_token_pool_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "fill_bonus_tokens_cpu",
    "fill_accept_out_cache_loc_cpu",
]
