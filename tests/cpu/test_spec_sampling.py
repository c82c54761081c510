"""CPU versions of sgl_kernel's temperature > 0 verify ops (eagle3_patches.cpu.spec_sampling), against brute force.

* top-k / top-p renormalisation against a row-by-row reference;
* ``tree_speculative_sampling_target_only`` by hand at the coin boundaries, and exactly in distribution: the kernel is
  a function of its coins, so integrating it over a grid that puts every coin boundary of the case on a grid line
  gives its output distribution exactly; that must equal sampling from the target one token at a time, stopping at
  the first token the tree did not propose (the meaning of lossless verification).  Broken variants of the kernel
  (the coin ignored; a NaN row accepted; the rejected candidates not taken off the residual; the last step's bonus
  drawn from the residual) give another distribution, and the same comparison says so;
* the patch in the installed sglang (a spawned process, CPU profile on): what it binds, the verify sglang calls at
  temperature > 0 reaching it, the stock release failing or verifying greedily, revert.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest
import torch

from eagle3_patches.cpu import spec_sampling
from eagle3_patches.cpu.spec_sampling import top_k_renorm_prob, top_p_renorm_prob, tree_speculative_sampling_target_only


# --------------------------------------------------------------------------------------------- renormalisation
def _top_k_reference(row: list[float], k: int) -> list[float]:
    if k <= 0 or k >= len(row):
        return list(row)
    kth = sorted(row, reverse=True)[k - 1]
    kept = [x if x >= kth else 0.0 for x in row]
    return [x / sum(kept) for x in kept]


def _top_p_reference(row: list[float], p: float) -> list[float]:
    if p >= 1.0:
        return list(row)
    mass, threshold = 0.0, None
    for x in sorted(row, reverse=True):
        if threshold is not None and mass >= p:
            break
        mass, threshold = mass + x, x
    kept = [x if x >= threshold else 0.0 for x in row]
    return [x / sum(kept) for x in kept]


def _random_rows(rows: int, d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(rows, d, generator=g, dtype=torch.float64) * 2, dim=-1)


@pytest.mark.parametrize("k", [1, 2, 5, 7, 8, 0, 1 << 30])
def test_top_k_renorm_matches_the_reference_row_by_row(k):
    probs = _random_rows(6, 8, seed=k % 97)
    got = top_k_renorm_prob(probs, torch.full((6,), k, dtype=torch.int32))
    want = torch.tensor([_top_k_reference(r, k) for r in probs.tolist()], dtype=torch.float64)
    assert torch.allclose(got, want, atol=1e-12)


def test_top_k_renorm_per_row_values_and_a_scalar():
    probs = torch.tensor([[0.1, 0.6, 0.3], [0.2, 0.3, 0.5]], dtype=torch.float64)
    got = top_k_renorm_prob(probs, torch.tensor([1, 2]))
    assert torch.allclose(got, torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.375, 0.625]], dtype=torch.float64))
    assert torch.equal(top_k_renorm_prob(probs, 2), top_k_renorm_prob(probs, torch.tensor([2, 2])))
    assert torch.equal(probs, torch.tensor([[0.1, 0.6, 0.3], [0.2, 0.3, 0.5]], dtype=torch.float64))  # not in place


def test_top_k_renorm_keeps_ties_with_the_kth_value():
    probs = torch.tensor([[0.4, 0.3, 0.15, 0.15]], dtype=torch.float64)
    assert torch.allclose(top_k_renorm_prob(probs, 3), probs)  # the 3rd largest is tied with the 4th: both kept
    assert torch.allclose(top_k_renorm_prob(probs, 2), torch.tensor([[4 / 7, 3 / 7, 0, 0]], dtype=torch.float64))


@pytest.mark.parametrize("p", [0.05, 0.3, 0.5, 0.8, 0.95, 0.999, 1.0])
def test_top_p_renorm_matches_the_reference_row_by_row(p):
    probs = _random_rows(6, 8, seed=int(p * 1000))
    got = top_p_renorm_prob(probs, torch.full((6,), p, dtype=torch.float64))
    want = torch.tensor([_top_p_reference(r, p) for r in probs.tolist()], dtype=torch.float64)
    assert torch.allclose(got, want, atol=1e-12)


def test_top_p_renorm_by_hand():
    probs = torch.tensor([[0.2, 0.5, 0.3]] * 4, dtype=torch.float64)
    got = top_p_renorm_prob(probs, torch.tensor([0.5, 0.6, 0.8, 0.81], dtype=torch.float64))
    assert torch.allclose(
        got,
        torch.tensor(
            [[0, 1, 0], [0, 0.625, 0.375], [0, 0.625, 0.375], [0.2, 0.5, 0.3]],
            dtype=torch.float64,
        ),
    )


# --------------------------------------------------------------------------------------------- tree sampling
# A tree as sglang's build_tree hands it to verify: position 0 the root (the last verified token), each other
# position a draft token; links are first child / next sibling, -1 for none.
class Tree:
    def __init__(self, candidates: list[int], parent: list[int], steps: int, q: list[list[float]]):
        self.candidates, self.parent, self.steps, self.q = candidates, parent, steps, q
        self.n, self.d = len(candidates), len(q[0])
        self.children = [[c for c in range(1, self.n) if parent[c] == v] for v in range(self.n)]
        self.next_token = [ch[0] if ch else -1 for ch in self.children]
        self.next_sibling = [-1] * self.n
        for ch in self.children:
            for a, b in zip(ch, ch[1:]):
                self.next_sibling[a] = b

    def run(self, coins: list[list[float]], final: list[float], kernel=tree_speculative_sampling_target_only):
        """The kernel on one row per coin vector; returns ``(accepted positions, emitted tokens)`` per row."""
        bs = len(coins)
        rep = lambda xs: torch.tensor([xs] * bs)  # noqa: E731
        predicts = torch.full((bs * self.n,), -1, dtype=torch.int32)
        accept_index = torch.full((bs, self.steps + 1), -1, dtype=torch.int32)
        accept_num = torch.zeros(bs, dtype=torch.int32)
        kernel(
            predicts,
            accept_index,
            accept_num,
            rep(self.candidates),
            torch.arange(bs * self.n).reshape(bs, self.n),
            rep(self.next_token),
            rep(self.next_sibling),
            torch.tensor(coins, dtype=torch.float32),
            torch.tensor(final, dtype=torch.float32),
            torch.tensor([self.q] * bs, dtype=torch.float32),
            torch.zeros(bs, self.n, self.d, dtype=torch.float32),
        )
        out = []
        for b in range(bs):
            path = [int(i) - b * self.n for i in accept_index[b, : int(accept_num[b]) + 1]]
            out.append((tuple(path[1:]), tuple(int(predicts[b * self.n + p]) for p in path)))
        return out

    def lossless(self) -> dict[tuple, Fraction]:
        """Brute force: sample the target one token at a time from the root; go on while the token is a child of the
        current node and steps remain.  ``{(accepted positions, emitted tokens): probability}``."""
        out: dict[tuple, Fraction] = {}

        def walk(node, path, tokens, prob):
            for x, qx in enumerate(self.q[node]):
                if qx == 0:
                    continue
                p = prob * Fraction(qx).limit_denominator(1 << 20)
                child = next((c for c in self.children[node] if self.candidates[c] == x), None)
                if child is not None and len(path) < self.steps:
                    walk(child, path + (child,), tokens + (x,), p)
                else:
                    out[(path, tokens + (x,))] = out.get((path, tokens + (x,)), 0) + p

        walk(0, (), (), Fraction(1))
        return out

    def exact(self, kernel=tree_speculative_sampling_target_only) -> dict[tuple, Fraction]:
        """The kernel's output distribution, exactly: every boundary where a coin changes the outcome (the cumulative
        target mass of a node's children; the cumulative residual of any node and any rejected set, over its total)
        is a grid line, so the midpoint of each cell stands for the whole cell."""
        node_cuts = []
        for v in range(self.n):
            cuts, acc = {0.0, 1.0}, 0.0
            for c in self.children[v]:
                acc += self.q[v][self.candidates[c]]
                cuts.add(min(acc, 1.0))
            node_cuts.append(sorted(cuts))
        final_cuts = {0.0, 1.0}
        for v in range(self.n):
            tried = [self.candidates[c] for c in self.children[v]]
            for r in range(len(tried) + 1):
                residual = [0.0 if x in tried[:r] else qx for x, qx in enumerate(self.q[v])]
                total, acc = sum(residual), 0.0
                for x in residual:
                    acc += x
                    if total > 0:
                        final_cuts.add(min(acc / total, 1.0))
        final_cuts = sorted(final_cuts)
        cells = [[((a + b) / 2, Fraction(b - a)) for a, b in zip(cuts, cuts[1:]) if b > a] for cuts in node_cuts]
        finals = [((a + b) / 2, Fraction(b - a)) for a, b in zip(final_cuts, final_cuts[1:]) if b > a]
        rows, weights = [], []
        for combo in itertools.product(*cells, finals):
            rows.append([c for c, _ in combo])
            w = Fraction(1)
            for _, length in combo:
                w *= length
            weights.append(w)
        out: dict[tuple, Fraction] = {}
        for (path, tokens), w in zip(self.run([r[:-1] for r in rows], [r[-1] for r in rows], kernel), weights):
            out[(path, tokens)] = out.get((path, tokens), 0) + w
        return out


def _close(a: dict, b: dict, tol: float = 1e-5) -> bool:
    return all(abs(float(a.get(k, 0)) - float(b.get(k, 0))) <= tol for k in set(a) | set(b))


# root -> 1 (token 2) -> 2 (token 0) -> 3 (token 3): a chain of 3 draft tokens, 3 steps
CHAIN = Tree(
    candidates=[9, 2, 0, 3],
    parent=[-1, 0, 1, 2],
    steps=3,
    q=[[0.1, 0.2, 0.5, 0.2], [0.6, 0.1, 0.2, 0.1], [0.3, 0.3, 0.3, 0.1], [0.25, 0.25, 0.25, 0.25]],
)
# root -> {1 (token 1), 2 (token 3)}; 1 -> {3 (token 0), 4 (token 2)}; 2 -> {5 (token 1)}: topk 2, 2 steps
TREE = Tree(
    candidates=[7, 1, 3, 0, 2, 1],
    parent=[-1, 0, 0, 1, 1, 2],
    steps=2,
    q=[
        [0.1, 0.4, 0.2, 0.3],
        [0.5, 0.1, 0.3, 0.1],
        [0.2, 0.2, 0.2, 0.4],
        [0.25, 0.25, 0.25, 0.25],
        [0.7, 0.1, 0.1, 0.1],
        [0.1, 0.1, 0.1, 0.7],
    ],
)


def test_chain_at_the_coin_boundaries():
    # root's coin 0.49 <= q(2) = 0.5: accept; node 1's coin 0.61 > q(0) = 0.6: reject, residual q without token 0
    # = [0, .1, .2, .1] / .4; final coin 0.5 -> u = 0.2 of 0.4: cumsum .1, .3 -> token 2
    (got,) = CHAIN.run([[0.49, 0.61, 0.0, 0.0]], [0.5])
    assert got == ((1,), (2, 2))
    # root's coin 0.51 > 0.5: reject; residual [.1, .2, 0, .2] / .5; final coin 0.1 -> u = .05 -> token 0
    (got,) = CHAIN.run([[0.51, 0.0, 0.0, 0.0]], [0.1])
    assert got == ((), (0,))
    # every step accepted (coins at 0): the bonus token drawn from node 3's q itself, final coin .99 -> token 3
    (got,) = CHAIN.run([[0.0, 0.0, 0.0, 0.0]], [0.99])
    assert got == ((1, 2, 3), (2, 0, 3, 3))


def test_siblings_are_tried_in_order_with_the_mass_so_far():
    # root's children tokens 1 (q .4) then 3 (q .3): coin .65 rejects token 1 (.65 > .4) and accepts token 3
    # (.65 <= .4 + .3); node 2's coin .5 rejects token 1 (.5 > .2): residual of node 2 without token 1,
    # [.2, 0, .2, .4] / .8, final coin .3 -> u = .24 -> token 2
    (got,) = TREE.run([[0.65, 0.0, 0.5, 0.0, 0.0, 0.0]], [0.3])
    assert got == ((2,), (3, 2))
    # coin .75 > .7: both rejected; the residual [.1, 0, .2, 0] / .3 only has tokens 0 and 2
    (got,) = TREE.run([[0.75, 0, 0, 0, 0, 0]], [0.5])
    assert got == ((), (2,))


@pytest.mark.parametrize("case", [CHAIN, TREE], ids=["chain", "tree"])
def test_output_is_distributed_as_sampling_the_target_token_by_token(case):
    exact, want = case.exact(), case.lossless()
    assert abs(float(sum(exact.values())) - 1) < 1e-9
    assert _close(exact, want), sorted(
        (k, float(exact.get(k, 0)), float(want.get(k, 0))) for k in set(exact) | set(want)
    )


def test_draft_probs_hold_the_rejected_candidates_target_mass():
    bs, n, d = 1, TREE.n, TREE.d
    draft_probs = torch.zeros(bs, n, d)
    tree_speculative_sampling_target_only(
        torch.full((n,), -1, dtype=torch.int32),
        torch.full((1, 3), -1, dtype=torch.int32),
        torch.zeros(1, dtype=torch.int32),
        torch.tensor([TREE.candidates]),
        torch.arange(n).reshape(1, n),
        torch.tensor([TREE.next_token]),
        torch.tensor([TREE.next_sibling]),
        torch.tensor([[0.65, 0, 0.5, 0, 0, 0]]),
        torch.tensor([0.3]),
        torch.tensor([TREE.q]),
        draft_probs,
    )
    expected = torch.zeros(bs, n, d)
    expected[0, 0, 1] = 0.4  # root: token 1 rejected
    expected[0, 2, 1] = 0.2  # node 2: token 1 rejected
    assert torch.allclose(draft_probs, expected)


def test_a_nan_row_accepts_nothing_and_draws_from_what_is_finite():
    q = [list(r) for r in CHAIN.q]
    q[0] = [float("nan"), 0.5, float("nan"), 0.5]  # token 2 (the root's child) has a NaN probability
    nan_chain = Tree(CHAIN.candidates, CHAIN.parent, CHAIN.steps, q)
    for coin in (0.0, 0.3, 0.99):
        ((path, tokens),) = nan_chain.run([[coin, 0, 0, 0]], [coin])
        assert path == () and tokens[0] in (1, 3), (coin, tokens)


def test_a_zero_probability_candidate_is_never_accepted():
    q = [list(r) for r in CHAIN.q]
    q[0] = [0.5, 0.5, 0.0, 0.0]  # token 2 cannot be sampled at the root
    zero = Tree(CHAIN.candidates, CHAIN.parent, CHAIN.steps, q)
    ((path, tokens),) = zero.run([[0.0, 0, 0, 0]], [0.7])
    assert path == () and tokens == (1,)


def test_no_residual_mass_falls_back_as_the_kernel_does():
    q = [list(r) for r in CHAIN.q]
    q[0] = [float("nan")] * 4  # nothing at the root has a probability: the kernel's fallback is the last index
    ((path, tokens),) = Tree(CHAIN.candidates, CHAIN.parent, CHAIN.steps, q).run([[0.0, 0, 0, 0]], [0.4])
    assert path == () and tokens == (3,)


# Broken variants, each a mistake a port of the kernel could make: the exact comparison must reject every one.
def _variant(accept, takes_off_rejected=True) -> object:
    """A transcription of the kernel with its acceptance test ``accept(single, coin, prob_acc)``, and rejected
    candidates taken off the residual or not (the right kernel: ``single > 0 and coin <= prob_acc``, taken off)."""

    def kernel(predicts, accept_index, accept_num, candidates, r_index, r_next, r_sib, coins, final, q, dp):
        bs, steps = candidates.shape[0], accept_index.shape[1]
        for b in range(bs):
            node, coin, last, accepted, prob_acc, cur = 0, float(coins[b, 0]), int(r_index[b, 0]), 0, 0.0, 0
            accept_index[b, 0] = last
            for _ in range(1, steps):
                cur = int(r_next[b, cur])
                while cur != -1:
                    token = int(candidates[b, cur])
                    single = float(q[b, node, token])
                    prob_acc += single
                    if accept(single, coin, prob_acc):
                        prob_acc, node, coin = 0.0, cur, float(coins[b, cur])
                        predicts[last] = token
                        accepted += 1
                        last = int(r_index[b, cur])
                        accept_index[b, accepted] = last
                        break
                    if takes_off_rejected:
                        dp[b, node, token] = q[b, node, token]
                    cur = int(r_sib[b, cur])
                if cur == -1:
                    break
            accept_num[b] = accepted
            residual = None if accepted == steps - 1 else dp[b, node]
            predicts[last] = spec_sampling._sample_residual(q[b, node], residual, float(final[b]))

    return kernel


RIGHT = _variant(lambda single, coin, acc: single > 0 and coin <= acc)
BROKEN = {
    "accepts-whenever-the-target-probability-is-positive": _variant(lambda single, coin, acc: single > 0),
    "accepts-a-nan-row": _variant(lambda single, coin, acc: not (coin > acc)),
    "residual-keeps-the-rejected-candidates": _variant(
        lambda single, coin, acc: single > 0 and coin <= acc, takes_off_rejected=False
    ),
}


def test_the_transcription_the_broken_variants_start_from_is_right():
    for case in (CHAIN, TREE):
        assert _close(case.exact(RIGHT), case.lossless())


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_kernels_are_not_lossless(name):
    if name == "accepts-a-nan-row":
        q = [list(r) for r in CHAIN.q]
        q[1] = [float("nan")] * 2 + [0.5, 0.5]  # node 1's row is NaN at its child's token 0
        case = Tree(CHAIN.candidates, CHAIN.parent, CHAIN.steps, q)
        (right,) = case.run([[0.0, 0.5, 0.0, 0.0]], [0.5])
        (wrong,) = case.run([[0.0, 0.5, 0.0, 0.0]], [0.5], kernel=BROKEN[name])
        assert right[0] == (1,) and wrong[0][:2] == (1, 2), (right, wrong)  # the NaN candidate (token 0) accepted
        return
    for case in (CHAIN, TREE):
        if not _close(case.exact(BROKEN[name]), case.lossless()):
            return
    pytest.fail(f"{name}: the broken kernel passed as lossless")


# --------------------------------------------------------------------------------------------- in sglang
def _patch_in_sglang():
    """Runs in the isolated child (CPU profile on): what the patch bound, and what revert left."""
    import sys

    import sglang.srt.speculative.eagle_info  # noqa: F401 - the patch lands when this import ends

    from eagle3_patches import cpu
    from eagle3_patches.cpu.spec_sampling import OPS, CpuSpecSampling

    def bound():
        out = {}
        for name, mod in list(sys.modules.items()):
            if not name.startswith(("sglang.", "sgl_kernel")) or mod is None:
                continue
            for attr, value in mod.__dict__.items():
                if value in OPS.values() or getattr(value, "__wrapped__", None) is not None and attr == "eagle_sample":
                    out[f"{name}.{attr}"] = getattr(value, "__module__", "")
                elif attr == "TREE_SPEC_KERNEL_AVAILABLE" and name.endswith("eagle_info"):
                    out[f"{name}.{attr}"] = repr(value)
        return out

    reg = cpu.get_registry()
    status = reg.status()["cpu_spec_sampling"]
    facts = {"state": status.state.value, "reason": status.reason, "patched": bound()}
    reg.revert(["cpu_spec_sampling"])
    facts["reverted"] = bound()
    # the plan on the release as it is: what the patch changes
    plan = CpuSpecSampling().plan(sys.modules["sglang.srt.speculative.eagle_info"])
    facts["plan"] = sorted(f"{o.__name__}.{a}" for o, a, _ in plan)
    reg.apply(["cpu_spec_sampling"])
    facts["reapplied"] = bound() == facts["patched"]
    return facts


@pytest.fixture(scope="module")
def sglang_facts():
    from eagle3_patches.testing.isolation import run_isolated

    return run_isolated(_patch_in_sglang, cpu_profile=True, timeout=300)


@pytest.mark.sglang
def test_patch_binds_the_ops_where_the_release_reads_them(sglang_facts):
    assert sglang_facts["state"] == "applied", sglang_facts["reason"]
    ops = {k for k, v in sglang_facts["patched"].items() if v == spec_sampling.__name__ and "eagle_sample" not in k}
    # every release calls the three ops from its sampling verify; which module holds them is the release's
    assert {k.rsplit(".", 1)[1] for k in ops} == set(spec_sampling.OPS), sglang_facts["patched"]
    assert set(sglang_facts["patched"]) == set(sglang_facts["plan"]) | {
        k for k in sglang_facts["patched"] if k.endswith(".eagle_sample") and "eagle_utils" not in k
    }, (sglang_facts["patched"], sglang_facts["plan"])


@pytest.mark.sglang
def test_revert_restores_the_release_as_it_was(sglang_facts):
    assert all(v != spec_sampling.__name__ for v in sglang_facts["reverted"].values()), sglang_facts["reverted"]
    assert "True" not in sglang_facts["reverted"].values()  # TREE_SPEC_KERNEL_AVAILABLE back to False where it was
    assert sglang_facts["reapplied"]
