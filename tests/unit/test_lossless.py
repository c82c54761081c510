"""The two-sample permutation test of sampling losslessness (eagle3_patches.acceptance.lossless).

Its false-alarm rate is at most alpha by construction: checked on simulated pairs drawn from one distribution.  Its
power, on the kind of difference a wrong verify makes: the CPU tree-sampling kernel's outputs against sampling the
target token by token pass; the broken kernels of tests/cpu/test_spec_sampling.py, and a sample whose later tokens
are the argmax (greedy verification of a sampled request), fail.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from eagle3_patches.acceptance.lossless import ALPHA, compare


def _markov(n: int, length: int, seed: int, sharpen: float = 1.0) -> list[list[int]]:
    """``n`` sequences from a small fixed Markov chain over 4 tokens; ``sharpen`` > 1 makes every step after the
    first peakier (as a verify that ignores the request's temperature would: the first token is the sampler's)."""
    rng = np.random.default_rng(seed)
    start = np.array([0.4, 0.3, 0.2, 0.1])
    step = np.array([[0.5, 0.3, 0.1, 0.1], [0.2, 0.5, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25], [0.1, 0.1, 0.2, 0.6]])
    out = []
    for _ in range(n):
        seq = [int(rng.choice(4, p=start))]
        for _ in range(length - 1):
            p = step[seq[-1]] ** sharpen
            seq.append(int(rng.choice(4, p=p / p.sum())))
        out.append(seq)
    return out


def test_samples_of_one_distribution_pass():
    result = compare(_markov(150, 4, seed=1), _markov(150, 4, seed=2), 4)
    assert result.same_distribution, result.describe()
    assert 0 < result.p_value <= 1 and result.alpha == ALPHA


def test_false_alarm_rate_is_at_most_alpha():
    """200 pairs drawn from one distribution, alpha 0.05: the rejections stay within the binomial's 99.9% bound of
    200 x 0.05 = 10 (at most 21); a test that rejected too often (an asymptotic chi-square p-value on these sparse
    cells does) goes past it."""
    rejections = sum(
        not compare(
            _markov(40, 3, seed=2 * i), _markov(40, 3, seed=2 * i + 1), 3, alpha=0.05, permutations=199, seed=i
        ).same_distribution
        for i in range(200)
    )
    assert rejections <= 21, rejections


def test_a_sharper_verify_is_caught():
    """Every token after the first drawn at a lower temperature than asked (the verify ignoring temperature)."""
    result = compare(_markov(200, 4, seed=3, sharpen=2.0), _markov(200, 4, seed=4), 4)
    assert not result.same_distribution, result.describe()


def test_greedy_verification_of_sampled_requests_is_caught():
    """The bug of stock sglang on CPU: the first token sampled, every later one the argmax."""
    step_argmax = {0: 0, 1: 1, 2: 0, 3: 3}
    sampled = _markov(100, 4, seed=5)
    greedy = [[s[0], step_argmax[s[0]]] for s in sampled]
    for s in greedy:
        while len(s) < 4:
            s.append(step_argmax[s[-1]])
    result = compare(greedy, _markov(100, 4, seed=6), 4)
    assert not result.same_distribution, result.describe()


def test_the_verdict_is_the_same_every_time():
    a, b = _markov(60, 3, seed=7), _markov(60, 3, seed=8)
    assert compare(a, b, 3) == compare(a, b, 3)


def test_rare_prefixes_are_pooled_into_one_cell():
    result = compare([[1, 2]] * 10 + [[7, 8]], [[1, 2]] * 10 + [[9, 9]], 2)
    assert result.cells == (2, 2)  # {1} and the pooled {7, 9}; {1, 2} and the pooled rest


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"alpha": 0}, "alpha"),
        ({"alpha": 1.5}, "alpha"),
        ({"permutations": 0}, "permutations"),
    ],
)
def test_bad_parameters_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        compare([[1, 2]], [[1, 2]], 2, **kwargs)


def test_short_or_empty_samples_are_refused():
    with pytest.raises(ValueError, match="shorter than 3 tokens"):
        compare([[1, 2, 3], [1, 2]], [[1, 2, 3]], 3)
    with pytest.raises(ValueError, match="plain sample is empty"):
        compare([[1]], [], 1)
    with pytest.raises(ValueError, match="from_length"):
        compare([[1]], [[1]], 0)
    with pytest.raises(ValueError, match="from_length"):
        compare([[1, 2]], [[1, 2]], 2, from_length=3)


def test_from_length_leaves_the_shorter_prefixes_out():
    """Two samples whose first tokens differ but whose pairs agree once the first token is pooled with them: the
    single-token cells are compared only from length 1."""
    a = [[1, 5]] * 30 + [[2, 5]] * 10
    b = [[1, 5]] * 10 + [[2, 5]] * 30
    assert not compare(a, b, 2).same_distribution
    only_pairs = compare(a, b, 2, from_length=2)
    assert only_pairs.cells == (2,) and only_pairs.from_length == 2


# ------------------------------------------------------------------------------------ the CPU kernel's outputs
def _kernel_outcomes(case, n: int, seed: int, kernel=None) -> list[list[int]]:
    """``n`` verify outcomes of the tree ``case`` with random coins, each as one category (its emitted tokens)."""
    rng = random.Random(seed)
    coins = [[rng.random() for _ in range(case.n)] for _ in range(n)]
    final = [rng.random() for _ in range(n)]
    runs = case.run(coins, final) if kernel is None else case.run(coins, final, kernel)
    return [[hash(tokens) % (1 << 30)] for _, tokens in runs]


def _target_outcomes(case, n: int, seed: int) -> list[list[int]]:
    """``n`` samples of the target token by token (the lossless distribution of the same tree)."""
    dist = case.lossless()
    keys = list(dist)
    rng = random.Random(seed)
    picks = rng.choices(keys, weights=[float(dist[k]) for k in keys], k=n)
    return [[hash(tokens) % (1 << 30)] for _, tokens in picks]


@pytest.fixture(scope="module")
def trees():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu"))
    import test_spec_sampling as t

    return t


def test_the_cpu_kernel_passes_against_the_target(trees):
    for case in (trees.CHAIN, trees.TREE):
        result = compare(_kernel_outcomes(case, 400, seed=1), _target_outcomes(case, 400, seed=2), 1)
        assert result.same_distribution, result.describe()


@pytest.mark.parametrize(
    "name", ["accepts-whenever-the-target-probability-is-positive", "residual-keeps-the-rejected-candidates"]
)
def test_broken_kernels_fail_against_the_target(trees, name):
    caught = [
        not compare(
            _kernel_outcomes(case, 400, seed=3, kernel=trees.BROKEN[name]), _target_outcomes(case, 400, seed=4), 1
        ).same_distribution
        for case in (trees.CHAIN, trees.TREE)
    ]
    assert any(caught), name
