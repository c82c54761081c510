"""The draft's own top-k tree, run offline on target states: which depth of the target's token path each verify step
would accept, at every ``--speculative-num-steps`` / ``--speculative-eagle-topk`` / ``--speculative-num-draft-tokens``
of a grid, greedy verification (``eagle3-patches tune``).

The tree is built as sglang's EAGLE worker builds it (``select_top_k_tokens`` and ``organize_draft_results``, the
rules :mod:`eagle3_patches.doctor.flag_rules` cites): level 1 holds the ``topk`` most likely tokens of the first draft
step (each scored by its probability); each later level expands the ``topk`` best-scored nodes of the level above,
each into its ``topk`` most likely tokens, scored by the product of probabilities along the path (``topk**2``
candidates); of all the candidates the verifier keeps the ``num_draft_tokens - 1`` best-scored.  Each node runs the
draft with its own ancestors as context (the tree attention mask), at the position the serving worker gives it
(:data:`~.draft_reference.CHAIN_OFFSET`).  Greedy verification accepts the longest path from the root whose tokens
are the target's: the data's tokens, as for ``measure-accept``.

Levels 1..s of a tree of ``s`` steps are those of any longer tree (a level depends only on the ones above it), so one
run of ``max_steps`` levels per topk serves every ``steps`` and ``num_draft_tokens``: per base position it keeps, for
each level, whether the target's token is a candidate and how many candidates of each level score above it
(:class:`TreeRun`); :meth:`TreeRun.depths` turns that into the accepted depth at each setting.  Ties between equal
scores are counted in the target's token's favour (``torch.topk`` breaks them by index).  topk 1 is the chain
``measure-accept`` replays, and gives its figures.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .draft_reference import CHAIN_OFFSET, SPEC_V1, DraftForward, attend
from .target_states import TargetStates


@dataclass
class TreeRun:
    """One sequence's tree, ``max_steps`` levels at ``topk``.  Rows are base positions t = 0 .. L - 2 (the verify
    step after token t + 1); level j's candidate on the target's path is its token t + j + 1."""

    topk: int
    max_steps: int
    #: [rows, max_steps] bool: the target's token at level j is a candidate (its parent on the path was expanded)
    candidate: Any
    #: [rows, max_steps (j), max_steps (l)] int: candidates of level l scoring above the target's token at level j
    above: Any

    def depths(self, steps: int, draft_tokens: Sequence[int]) -> Any:
        """[rows, len(draft_tokens)] int: per number of draft tokens, the levels of the target's path that a tree of
        ``steps`` levels keeping ``draft_tokens - 1`` candidates holds from the root (the draft tokens a greedy verify
        step at that base accepts, before the request's end and the prompt bound it: :func:`walk_depths`)."""
        import torch

        s = min(steps, self.max_steps)
        ranked = self.above[:, :s, :s].sum(-1)  # candidates of levels 1..s above the target's token at level j
        # the path holds level j when it holds every level above it: the most candidates above any of them decides
        ranked = torch.where(self.candidate[:, :s], ranked, torch.iinfo(torch.int64).max).cummax(-1).values
        kept = torch.tensor([n - 1 for n in draft_tokens], dtype=torch.int64)
        return (ranked[:, None, :] < kept[None, :, None]).sum(-1)


def walk_depths(depth: Sequence[int], labelled: Sequence[bool], steps: int, histogram: list) -> None:
    """Adds one sequence's greedy verify steps to ``histogram`` (verify steps that accepted 0..steps draft tokens):
    the walk :func:`.measure.walk` makes with 0/1 acceptances, for a verify step at base t that accepts at most
    ``depth[t]`` draft tokens, stopped by the data's end and by a token the target did not produce.  One verify step
    after the other, in time linear in the verify steps (the grid of ``tune`` runs it for every setting)."""
    L = len(labelled)
    t = 0
    while t < L - 2:
        if not labelled[t + 1]:  # a prompt token: the next verify step starts after the next target token
            t += 1
            continue
        accepted = 0
        # pragma: no mutate core/NumberReplacer `range(0,`: k = 0 looks at token t + 1, a target token (checked above)
        # within the data, and accepts 0 as before
        for k in range(1, min(steps, int(depth[t])) + 1):
            if t + k + 1 > L - 1 or not labelled[t + k + 1]:
                break
            accepted = k
        histogram[accepted] += 1
        t += accepted + 1


def run_tree(forward: DraftForward, hot, tokens, aux, topk: int, max_steps: int, worker: str = SPEC_V1) -> TreeRun:
    """The draft's ``topk`` tree of ``max_steps`` levels at every base position of one sequence (module docstring):
    ``tokens`` [L] target ids, ``aux`` [L, k x H] the target's aux states; ``hot[i]`` the target id of draft id i."""
    import torch

    fc = forward.params["fc.weight"]
    dev = fc.device
    tokens, aux, hot = tokens.to(dev), aux.to(device=dev, dtype=fc.dtype), hot.to(dev)
    L = int(aux.shape[0])
    n = L - 1
    rows = torch.arange(n, device=dev)
    base = rows
    scale = forward.hd**-0.5
    K, S = topk, max_steps
    # the target's token at level j of base t: t + j + 1 (-1 past the data's end: never a draft token)
    # pragma: no mutate core/NumberReplacer `-2,`: any negative id is no draft token
    truth = torch.full((n, S), -1, dtype=torch.int64, device=dev)
    for j in range(1, S + 1):
        m = max(0, L - j - 1)
        # pragma: no mutate core/NumberReplacer `j + 2 + m`: the slice ends at the data's end (L) either way
        truth[:m, j - 1] = tokens[j + 1 : j + 1 + m]

    def top(logits):
        p, i = logits.float().softmax(-1).topk(K, dim=-1)
        return p, hot[i]

    with torch.no_grad():
        h = aux[:-1] @ fc.T
        q1, k1, v1 = forward.qkv(tokens[1:L], h, base)
        logits, out = forward.finish(attend(q1, k1, v1, [], [], scale), h)
        scores, ids = top(logits)  # level 1: [n, K]
        levels = [scores]
        candidate = torch.zeros(n, S, dtype=torch.bool, device=dev)
        true_score = torch.zeros(n, S, dtype=torch.float32, device=dev)
        hit = ids == truth[:, :1]
        candidate[:, 0] = hit.any(-1)
        true_score[:, 0] = (scores * hit).sum(-1)
        # pragma: no mutate core/NumberReplacer `rows, -2)`, `rows, -0)`: a row whose level 1 is not a candidate holds
        # no level in depths() (cummax), whatever the levels below it say
        slot = torch.where(candidate[:, 0], hit.float().argmax(-1), torch.full_like(rows, -1))  # the path's slot
        hid = out[:, None, :].expand(n, K, out.shape[-1])
        anc_k: list = []
        anc_v: list = []
        # pragma: no mutate core/NumberReplacer `S + 2`: the pass at j == S breaks out
        for j in range(2, S + 1):
            pos = base + j + CHAIN_OFFSET[worker]
            outs, ks, vs, probs, kids = [], [], [], [], []
            for b in range(K):
                q, k, v = forward.qkv(ids[:, b], hid[:, b].contiguous(), pos)
                chain_k = [a[:, b] for a in anc_k] + [k]
                chain_v = [a[:, b] for a in anc_v] + [v]
                lg, o = forward.finish(attend(q, k1, v1, chain_k, chain_v, scale), hid[:, b])
                p, i = top(lg)
                outs.append(o)
                ks.append(k)
                vs.append(v)
                probs.append(p)
                kids.append(i)
            child_p, child_id = torch.stack(probs, 1), torch.stack(kids, 1)  # [n, K parents, K children]
            expand = (scores[:, :, None] * child_p).flatten(1)  # [n, K*K]: level j's candidates
            flat_ids = child_id.flatten(1)
            levels.append(expand)
            # the target's token at level j: a child of the path's node at level j - 1, where that one was expanded
            # pragma: no mutate core/NumberReplacer `slot >= -1`: a row whose path broke above has level j - 1 not a
            # candidate, and depths() holds no level below one that is not, whatever this level says
            on = slot >= 0
            # pragma: no mutate core/NumberReplacer `min=-1`: a parent of -1 is read only where `on` is false, and
            # masked there
            parent = slot.clamp(min=0)
            kid_hit = (child_id[rows, parent] == truth[:, j - 1 : j]) & on[:, None]  # [n, K]
            candidate[:, j - 1] = kid_hit.any(-1)
            kid = kid_hit.float().argmax(-1)
            # pragma: no mutate core/NumberReplacer `candidate[:, j - 2]`: level j is a candidate only under a
            # candidate at j - 1, and where it is not, depths() reads no score of it
            # pragma: no mutate core/NumberReplacer `kid], 1.0)`, `kid], -1.0)`: where level j is no candidate depths()
            # reads no score of it
            true_score[:, j - 1] = torch.where(candidate[:, j - 1], expand[rows, parent * K + kid], 0.0)
            # pragma: no mutate eagle3/DropGuard: j == S is the last pass; going on builds a frontier no pass reads
            if j == S:
                # pragma: no mutate core/ReplaceBreakWithContinue: the last pass, as above
                break
            scores, sel = expand.topk(K, dim=-1)  # the nodes expanded at the next step
            picked = sel // K
            ids = flat_ids.gather(1, sel)
            hid = torch.stack(outs, 1)[rows[:, None], picked]
            anc_k = [a[rows[:, None], picked] for a in [*anc_k, torch.stack(ks, 1)]]
            anc_v = [a[rows[:, None], picked] for a in [*anc_v, torch.stack(vs, 1)]]
            path = (sel == (parent * K + kid)[:, None]) & candidate[:, j - 1 : j]
            # pragma: no mutate core/NumberReplacer `rows, -2)`: any negative slot is off the expanded nodes
            slot = torch.where(path.any(-1), path.float().argmax(-1), torch.full_like(rows, -1))
        above = torch.zeros(n, S, S, dtype=torch.int64, device=dev)
        for lvl, sc in enumerate(levels):
            above[:, :, lvl] = (sc[:, None, :] > true_score[:, :, None]).sum(-1)
    return TreeRun(K, S, candidate.cpu(), above.cpu())


def measure_grid(
    forward: DraftForward,
    hot,
    sequences: Iterable[TargetStates],
    settings: Sequence[tuple[int, int, int]],
    worker: str = SPEC_V1,
    *,
    progress: bool = False,
) -> tuple[dict[tuple[int, int, int], list[int]], int]:
    """Per setting ``(steps, topk, draft_tokens)``, the histogram of greedy verify steps that accepted 0..steps draft
    tokens over ``sequences`` (one tree run per topk per sequence, at the most steps asked of that topk), and the
    sequences measured.  The states are checked as ``measure-accept`` checks them."""
    from ..terminal import progress_bar
    from .measure import _check

    widest: dict[int, int] = {}
    for s, k, _ in settings:
        # pragma: no mutate core/NumberReplacer: every setting's steps is at least 1, so a start of -1 or 1 gives the
        # same most
        widest[k] = max(widest.get(k, 0), s)
    hist = {st: [0] * (st[0] + 1) for st in settings}
    bar = progress_bar(unit="tok", unit_scale=True, desc="tune: the draft's trees") if progress else None
    measured = 0
    try:
        for st in sequences:
            _check(st, forward, None)
            # pragma: no mutate core/NumberReplacer `shape[-1]`: the tokens are one-dimensional ([L])
            L = int(st.tokens.shape[0])
            if L < 3:
                continue
            measured += 1
            labelled = [bool(x) for x in st.labelled.tolist()]
            for k, S in widest.items():
                run = run_tree(forward, hot, st.tokens, st.aux, k, S, worker)
                # pragma: no mutate core/NumberReplacer `range(0,`, `S + 2`: no setting of topk k asks 0 steps or
                # more than S (the most any asks), so a range one wider at either end adds steps that name no setting
                for steps in range(1, S + 1):
                    mine = [setting for setting in settings if setting[:2] == (steps, k)]
                    # pragma: no mutate eagle3/DropGuard: depths() of no sizes has no column, and no walk follows
                    if not mine:
                        continue
                    depths = run.depths(steps, [setting[2] for setting in mine]).T.tolist()
                    for setting, depth in zip(mine, depths):
                        walk_depths(depth, labelled, steps, hist[setting])
            if bar is not None:
                bar.update(L)
    finally:
        if bar is not None:
            bar.close()
    return hist, measured
