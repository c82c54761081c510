"""Pure-torch CPU fallbacks for the sgl_kernel ops of sglang's EAGLE speculative decode loop.

On a machine without CUDA, sglang 0.5.9's EAGLE decode step stops at two CUDA-only ops
(``sglang/srt/speculative/eagle_utils.py``):

* ``build_tree_kernel_efficient`` calls the module global ``sgl_build_tree_kernel_efficient``,
  imported from ``sgl_kernel`` only on CUDA/HIP, so the first decode step fails with NameError;
* ``verify_tree_greedy_func`` has CUDA/HIP and NPU branches only: on CPU it returns its
  empty buffers untouched and the run crashes one step later, far away
  (IndexError in ``Req.update_spec_acceptance_histogram``).

The same holds through 0.5.15.  sglang 0.5.16 moved both into
``sglang.kernels.ops.speculative.spec_tree``, whose CPU branch calls sgl_kernel's CPU build
(``build_tree_kernel_efficient_cpu``, ``verify_tree_greedy_cpu``); without that build those names are
the CPU profile's stand-ins.  :meth:`CpuSpecKernels.plan` finds the release's layout.

:func:`build_tree_kernel_efficient` and :func:`verify_tree_greedy` below are CPU versions of
the sgl_kernel ops with the kernels' signatures and in-place semantics
(``sgl-kernel/csrc/speculative/eagle_utils.cu``); :class:`CpuSpecKernels` installs them.
They are loops over plain Python lists: the tensors are tiny (batch x draft tokens).

Differences from the CUDA kernels, all on inputs the kernels do not define:

* a parent list whose ancestor walk comes back to a node it has visited (a cycle, on which the
  CUDA kernel spins forever) or points outside ``parent_list`` raises :class:`ValueError`;
* a token whose parent is not among the selected tokens (the kernel prints "invalid eagle
  tree" and leaves it out of the retrieve lists) is left out the same way with a logged
  warning; its mask row and position stop at the missing parent (the kernel's walk reads out
  of bounds there);
* in QLEN_ONLY_BITPACKING mode every byte of a row is written (the kernel sets the first byte
  and ORs bits into the others, relying on sglang's ``fill_(0)``).

The temperature > 0 verify path (``tree_speculative_sampling_target_only``, ``top_k_renorm_prob``,
``top_p_renorm_prob``) is :mod:`.spec_sampling`'s.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import sys
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

logger = logging.getLogger("eagle3_patches")

#: values of ``sglang.srt.speculative.eagle_utils.TreeMaskMode`` (and of the kernel's enum)
FULL_MASK = 0
QLEN_ONLY = 1
QLEN_ONLY_BITPACKING = 2

_EAGLE_UTILS = "sglang.srt.speculative.eagle_utils"
_EAGLE_INFO_V2 = "sglang.srt.speculative.eagle_info_v2"
_EAGLE_INFO = "sglang.srt.speculative.eagle_info"


def packed_mask_bytes(draft_token_num: int) -> int:
    """Bytes a QLEN_ONLY_BITPACKING row takes (the kernel's ``num_bytes_per_item``)."""
    if draft_token_num > 32:
        raise ValueError(f"QLEN_ONLY_BITPACKING holds at most 32 draft tokens a row, got {draft_token_num}")
    return 4 if draft_token_num > 16 else 2 if draft_token_num > 8 else 1


def _flat(t: torch.Tensor, name: str) -> torch.Tensor:
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (it is written in place through a flat view)")
    return t.view(-1)


def _tree_of_request(
    b: int, parents: list, sel: list, topk: int, n: int
) -> tuple[list[int], list[list[int]], list[int]]:
    """For request ``b``: parent draft position of each position (-1: none), ancestor lists, depths.

    Position 0 is the verified token (the root); position i >= 1 is the draft token
    ``sel[i - 1]`` (an index into the flattened score list), whose parent is found through
    ``parents[sel[i - 1] // topk]`` exactly as the CUDA kernel finds it.
    """

    def parent_position(i: int) -> int:
        """Draft position of the parent of position ``i`` (0: the root; -1: not selected)."""
        parent_tb_idx = int(sel[i - 1]) // topk
        if parent_tb_idx == 0:
            return 0
        if parent_tb_idx < 0 or parent_tb_idx >= len(parents):
            raise ValueError(
                f"malformed EAGLE tree (request {b}): draft token {i} (score index {int(sel[i - 1])}) "
                f"names parent slot {parent_tb_idx}, outside parent_list's {len(parents)} entries"
            )
        parent_token_idx = int(parents[parent_tb_idx])
        for p in range(n - 1):
            if int(sel[p]) == parent_token_idx:
                return p + 1
        return -1

    parent_of = [-1] + [parent_position(i) for i in range(1, n)]
    ancestors: list[list[int]] = [[0]]  # the positions each row attends to, besides the prefix
    depths = [0]
    for i in range(1, n):
        row = [0]
        seen = set()
        cur = i
        while cur > 0:
            if cur in seen:
                path = " -> ".join(str(x) for x in [*row[1:], cur])
                raise ValueError(
                    f"malformed EAGLE tree (request {b}): the parent chain of draft token {i} loops "
                    f"({path}); parent_list={[int(x) for x in parents]}, top_scores_index={[int(x) for x in sel]}, "
                    f"topk={topk}. The CUDA kernel would spin forever on this input."
                )
            seen.add(cur)
            row.append(cur)
            cur = parent_of[cur]
        # cur == 0: reached the root; cur == -1: a parent that was not selected (left out)
        ancestors.append(row)
        depths.append(len(row) - 1)
    return parent_of, ancestors, depths


def build_tree_kernel_efficient(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int = FULL_MASK,
) -> None:
    """CPU version of ``sgl_kernel.build_tree_kernel_efficient``: fills the output tensors in place.

    ``parent_list`` [bs, topk * (depth - 1) + 1], ``selected_index`` [bs, draft_token_num - 1]
    (sorted indices into the flattened draft score list), ``verified_seq_len`` [bs].
    Outputs: ``positions`` [bs * n] = seq_len + depth; ``retrive_index`` [bs, n] = b * n + i;
    ``retrive_next_token`` / ``retrive_next_sibling`` [bs, n] (pre-filled with -1, as sglang
    does): first child / next sibling, children in ascending order; ``tree_mask``, each row
    True at the root, the row's ancestors and itself:

    * FULL_MASK: per request n rows of seq_len + n bools starting at
      ``sum(seq_lens[:b]) * n + b * n * n``; the seq_len prefix columns are left as they are;
    * QLEN_ONLY: bs * n * n bools;
    * QLEN_ONLY_BITPACKING: bs * n rows of 1, 2 or 4 little-endian bytes (n <= 8, 16, 32),
      bit j = column j; the buffer may be uint8, uint16 or uint32.

    ``depth`` only gives the kernel its parent_list row stride; here the stride is the
    tensor's own width. A cyclic or out-of-range parent list raises ValueError before
    anything is written.
    """
    mode = int(tree_mask_mode)
    if mode not in (FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING):
        raise ValueError(f"unknown tree_mask_mode {tree_mask_mode!r}")
    n = int(draft_token_num)
    topk = int(topk)
    if topk < 1 or n < 1:
        raise ValueError(f"topk ({topk}) and draft_token_num ({n}) must be >= 1")
    seq_lens = [int(x) for x in verified_seq_len.reshape(-1).tolist()]
    bs = len(seq_lens)
    sel_rows = selected_index.reshape(bs, -1).tolist() if bs else []
    if sel_rows and len(sel_rows[0]) != n - 1:
        raise ValueError(
            f"selected_index has {len(sel_rows[0])} entries a request, expected draft_token_num - 1 = {n - 1}"
        )
    parent_rows = parent_list.reshape(bs, -1).tolist() if parent_list.numel() else [[] for _ in range(bs)]

    # Work out every request first (raises on a malformed tree before anything is written).
    trees = [_tree_of_request(b, parent_rows[b], sel_rows[b], topk, n) for b in range(bs)]

    pos_flat = _flat(positions, "positions")
    ri_flat = _flat(retrive_index, "retrive_index")
    rnt_flat = _flat(retrive_next_token, "retrive_next_token")
    rns_flat = _flat(retrive_next_sibling, "retrive_next_sibling")
    next_token = rnt_flat[: bs * n].tolist()
    next_sibling = rns_flat[: bs * n].tolist()
    all_positions: list[int] = []
    for b, (parent_of, _, depths) in enumerate(trees):
        base = b * n
        # The kernel links children from the last draft token to the first, pushing the
        # previous first child to the sibling slot: children end up in ascending order.
        for i in range(n - 1, 0, -1):
            p = parent_of[i]
            if p < 0:
                logger.warning(
                    "eagle3-patches CPU build_tree: invalid EAGLE tree (request %d): draft token %d has no selected "
                    "parent (check the draft logprobs for NaN); it is left out, as the CUDA kernel does",
                    b,
                    i,
                )
                continue
            if next_token[base + p] != -1:
                next_sibling[base + i] = next_token[base + p]
            next_token[base + p] = i
        all_positions.extend(seq_lens[b] + d for d in depths)

    pos_flat[: bs * n].copy_(torch.tensor(all_positions, dtype=pos_flat.dtype))
    ri_flat[: bs * n].copy_(torch.arange(bs * n, dtype=ri_flat.dtype))
    rnt_flat[: bs * n].copy_(torch.tensor(next_token, dtype=rnt_flat.dtype))
    rns_flat[: bs * n].copy_(torch.tensor(next_sibling, dtype=rns_flat.dtype))

    mask_flat = _flat(tree_mask, "tree_mask")
    if mode == QLEN_ONLY_BITPACKING:
        nbytes = packed_mask_bytes(n)
        mask_bytes = mask_flat.view(torch.uint8)
        if mask_bytes.numel() < bs * n * nbytes:
            raise ValueError(f"tree_mask holds {mask_bytes.numel()} bytes, {bs * n * nbytes} needed")
        rows = []
        for _, ancestors, _ in trees:
            for row in ancestors:
                rows.append(list(sum(1 << j for j in row).to_bytes(nbytes, "little")))
        mask_bytes[: bs * n * nbytes].copy_(torch.tensor(rows, dtype=torch.uint8).view(-1))
        return

    needed = sum(seq_lens) * n + bs * n * n if mode == FULL_MASK else bs * n * n
    if mask_flat.numel() < needed:
        raise ValueError(f"tree_mask holds {mask_flat.numel()} entries, {needed} needed for tree_mask_mode {mode}")
    offset = 0
    for b, (_, ancestors, _) in enumerate(trees):
        prefix = seq_lens[b] if mode == FULL_MASK else 0
        width = prefix + n
        tree = torch.zeros(n, n, dtype=torch.bool)
        for i, row in enumerate(ancestors):
            tree[i, row] = True
        block = mask_flat[offset : offset + n * width].view(n, width)
        block[:, prefix:] = tree.to(mask_flat.dtype)
        offset += n * width


def verify_tree_greedy(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """CPU version of ``sgl_kernel.verify_tree_greedy``: fills ``predicts``, ``accept_index``,
    ``accept_token_num`` in place.

    Per request, from the root and at most ``accept_index.shape[1] - 1`` times: walk the children
    of the last accepted node (first child, then siblings) and accept the first whose candidate
    token equals the target's prediction at that node; ``predicts[node] = target token`` for
    each accepted step and ``accept_index[b, k]`` = the accepted node's ``retrive_index``.
    Then ``accept_token_num[b]`` = the number accepted and ``predicts[last accepted]`` = the
    target's prediction there (the bonus token). Entries not visited are left as they are.
    """
    bs, n = candidates.shape
    num_spec_step = accept_index.shape[1]
    cand = candidates.tolist()
    r_index = retrive_index.tolist()
    r_next = retrive_next_token.tolist()
    r_sib = retrive_next_sibling.tolist()
    target = target_predict.reshape(-1).tolist()

    pred_at: dict[int, int] = {}
    acc_rows = []
    acc_nums = []
    for b in range(bs):
        last = int(r_index[b][0])
        accepted = [last]
        cur = 0
        for _ in range(1, num_spec_step):
            cur = int(r_next[b][cur])
            visited = 0
            while cur != -1:
                visited += 1
                if visited > n:
                    raise ValueError(f"malformed retrive_next_sibling for request {b}: the sibling chain loops")
                if int(cand[b][cur]) == int(target[last]):
                    pred_at[last] = int(target[last])
                    last = int(r_index[b][cur])
                    accepted.append(last)
                    break
                cur = int(r_sib[b][cur])
            if cur == -1:
                break
        acc_nums.append(len(accepted) - 1)
        acc_rows.append(accepted)
        pred_at[last] = int(target[last])

    pred_flat = _flat(predicts, "predicts")
    if pred_at:
        idx = torch.tensor(list(pred_at.keys()), dtype=torch.long)
        pred_flat[idx] = torch.tensor(list(pred_at.values()), dtype=pred_flat.dtype)
    for b, row in enumerate(acc_rows):
        accept_index[b, : len(row)] = torch.tensor(row, dtype=accept_index.dtype)
    accept_token_num[:bs] = torch.tensor(acc_nums, dtype=accept_token_num.dtype)


def verify_tree_greedy_like(original):
    """A CPU stand-in for sglang's ``verify_tree_greedy_func`` ``original``, with its signature.

    The keyword names changed between releases (``retrive_index`` up to 0.5.10, ``retrieve_index``
    from 0.5.12) and sglang calls the function by keyword, so the stand-in binds its arguments with
    the original's own signature, runs :func:`verify_tree_greedy` and returns what sglang's returns
    (``predicts, accept_index, accept_token_num``)."""
    signature = inspect.signature(original)

    def verify_tree_greedy_func(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        tensors = list(bound.arguments.values())[:8]  # predicts ... target_predict, in the kernel's order
        verify_tree_greedy(*tensors)
        return tensors[0], tensors[1], tensors[2]

    verify_tree_greedy_func.__signature__ = signature  # type: ignore[attr-defined]  # inspect reads it
    verify_tree_greedy_func.__doc__ = f"CPU stand-in for {original.__module__}.verify_tree_greedy_func."
    return verify_tree_greedy_func


def eagle_utils_on_cpu() -> ModuleType:
    """sglang's ``eagle_utils`` where no accelerator serves the decode loop; NotApplicable (sglang untouched)
    otherwise.  The CPU profile's speculative patches start here."""
    utils = importlib.import_module(_EAGLE_UTILS)
    why = accelerator_in_use(utils)
    if why:
        raise NotApplicable(why)
    return utils


def accelerator_in_use(eagle_utils: ModuleType) -> str | None:
    if torch.cuda.is_available():
        return "CUDA is available: the real sgl_kernel ops serve the decode loop"
    for flag in ("_is_cuda", "_is_hip", "_is_npu", "_is_musa", "_is_xpu"):
        if getattr(eagle_utils, flag, False):
            return f"sglang's eagle_utils.{flag} is true: its own kernels serve the decode loop"
    return None


#: one replacement: (module, attribute, new value)
Replacement = tuple[ModuleType, str, object]


class CpuSpecKernels(Patch):
    """Where the CUDA-only tree ops sit moved twice; :meth:`plan` finds them:

    * sglang 0.5.9 - 0.5.15: ``eagle_utils.build_tree_kernel_efficient`` calls the module global
      ``sgl_build_tree_kernel_efficient`` (imported from sgl_kernel on CUDA/HIP only) and
      ``eagle_utils.verify_tree_greedy_func`` has no CPU branch; up to 0.5.13 ``eagle_info`` and
      ``eagle_info_v2`` hold the same function under the same name (``from eagle_utils import``);
    * sglang 0.5.16 - 0.5.22: ``eagle_utils.build_tree_kernel_efficient`` and ``verify_tree_greedy_func`` have a
      CPU branch (``SGLANG_USE_CPU_ENGINE=1``, set by the CPU profile) that calls ``sgl_kernel``'s CPU build
      (module globals ``sgl_build_tree_kernel_efficient_cpu``, ``sgl_verify_tree_greedy_cpu``); without that
      build the names are the CPU profile's stand-ins, and the patch puts the pure-torch ops there;
    * sglang 0.5.23 and later: the same CPU branch, in ``sglang.kernels.ops.speculative.spec_tree``
      (``build_tree_kernel_efficient_func``, ``verify_tree_greedy_func``).
    """

    name = "cpu_spec_kernels"
    summary = "pure-torch build_tree_kernel_efficient / verify_tree_greedy for the EAGLE decode loop on CPU"
    # Every EAGLE worker imports eagle_info.  Up to 0.5.13 eagle_info imports eagle_info_v2, which
    # imports eagle_utils: when eagle_info's import ends, all three are complete (eagle_utils alone
    # lands while the other two are half-initialised, before they bind ``verify_tree_greedy_func``).
    module = _EAGLE_INFO
    applies_to = SpecifierSet(">=0.5.9")

    def plan(self, info: ModuleType) -> list[Replacement]:
        """What to replace on this release; NotApplicable (sglang untouched) when the layout is unknown."""
        utils = eagle_utils_on_cpu()
        if hasattr(utils, "build_tree_kernel_efficient_func"):  # sglang 0.5.23 and later: the spec_tree ops module
            return self._plan_cpu_branch(
                sys.modules[utils.build_tree_kernel_efficient_func.__module__], "build_tree_kernel_efficient_func"
            )
        if (
            "sgl_build_tree_kernel_efficient_cpu" in utils.__dict__
        ):  # sglang 0.5.16 - 0.5.22: eagle_utils' own CPU branch
            return self._plan_cpu_branch(utils, "build_tree_kernel_efficient")
        expect_source(expect_attr(utils, "build_tree_kernel_efficient"), "sgl_build_tree_kernel_efficient(")
        original = expect_attr(utils, "verify_tree_greedy_func")
        expect_source(original, "if _is_cuda or _is_hip", "elif _is_npu:")
        if "_is_cpu" in source_of(original):
            raise NotApplicable("eagle_utils.verify_tree_greedy_func has a CPU branch of its own")
        replacements: list[Replacement] = []
        if "sgl_build_tree_kernel_efficient" not in utils.__dict__:
            replacements.append((utils, "sgl_build_tree_kernel_efficient", build_tree_kernel_efficient))
        else:
            logger.info("eagle3-patches: eagle_utils.sgl_build_tree_kernel_efficient exists; kept")
        verify = verify_tree_greedy_like(original)
        for mod in (utils, sys.modules.get(_EAGLE_INFO_V2), info):
            held = getattr(mod, "verify_tree_greedy_func", None) if mod is not None else None
            if mod is None or held is None:
                continue
            if held is not original:
                raise NotApplicable(f"{mod.__name__}.verify_tree_greedy_func is no longer eagle_utils' function")
            replacements.append((mod, "verify_tree_greedy_func", verify))
        return replacements

    @staticmethod
    def _plan_cpu_branch(owner: ModuleType, build_caller: str) -> list[Replacement]:
        """The module whose ``build_caller`` and ``verify_tree_greedy_func`` call sgl_kernel's CPU-build ops."""
        expect_source(expect_attr(owner, build_caller), "elif _is_cpu:", "sgl_build_tree_kernel_efficient_cpu(")
        expect_source(expect_attr(owner, "verify_tree_greedy_func"), "elif _is_cpu:", "sgl_verify_tree_greedy_cpu(")
        if not getattr(owner, "_is_cpu", False):
            raise NotApplicable(f"{owner.__name__} does not take its CPU branch (SGLANG_USE_CPU_ENGINE is not 1)")
        ops = {
            "sgl_build_tree_kernel_efficient_cpu": build_tree_kernel_efficient,
            "sgl_verify_tree_greedy_cpu": verify_tree_greedy,
        }
        real = [n for n in ops if not is_stub(expect_attr(owner, n))]
        if real:
            raise NotApplicable(
                f"sgl_kernel's CPU build is installed ({', '.join(real)}): its own ops serve the decode loop"
            )
        return [(owner, n, op) for n, op in ops.items()]

    def check(self, module: ModuleType) -> None:
        self.plan(module)

    def patch(self, module: ModuleType, saver: Saver) -> None:
        for owner, attr, value in self.plan(module):
            saver.set(owner, attr, value)


__all__ = [
    "CpuSpecKernels",
    "build_tree_kernel_efficient",
    "verify_tree_greedy",
    "verify_tree_greedy_like",
    "packed_mask_bytes",
    "FULL_MASK",
    "QLEN_ONLY",
    "QLEN_ONLY_BITPACKING",
]
