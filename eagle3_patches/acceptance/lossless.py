"""Is a speculating server's sampling lossless?  Two samples of generated token sequences, one from the server with
speculation and one from the same target without it, compared by an exact-level permutation test.

Lossless speculative sampling means the generated sequences have the target's distribution, whatever the draft.  The
test asks whether two samples (the same prompt, the same sampling parameters, ``n`` requests each) could come from
one distribution of sequences:

* the statistic: for each prefix length ``m`` = ``from_length`` .. ``length``, Pearson's chi-square for homogeneity
  of the two samples over the distinct ``m``-token prefixes (prefixes seen fewer than :data:`MIN_CELL` times in both
  samples together pooled into one cell), divided by its degrees of freedom; summed over ``m``.  A speculating
  server's first token is its prefill's sample, drawn by the sampler the server without speculation uses: a test of
  what speculation changes starts at ``from_length`` 2 (the joint distribution of the first two tokens on), where
  the first token's noise does not dilute what a wrong verify changes;
* the p-value: the share of ``permutations`` random relabellings of the pooled sequences whose statistic is at least
  the observed one, ``(1 + count) / (1 + permutations)``.  Under the hypothesis that both samples are drawn from one
  distribution the labels are exchangeable, so ``P(p <= alpha) <= alpha`` for every sample size: the false-alarm
  rate is at most ``alpha`` by construction, not by an asymptotic approximation.  The relabellings are drawn from a
  fixed seed: the same samples always get the same verdict.

The samples come from servers; everything here is arithmetic on token ids (NumPy), so a GPU selftest, the CPU server
tests and the unit tests read one implementation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: a prefix seen fewer times than this in both samples together goes to the pooled cell (Cochran's rule of thumb
#: for the chi-square's cells; the permutation test is exact whatever the cells)
MIN_CELL = 5
#: the default false-alarm rate: one run in a thousand on a correct server
ALPHA = 1e-3
#: the default number of relabellings: p-values down to 1 / 5000, well under ALPHA
PERMUTATIONS = 4999


@dataclass(frozen=True)
class Comparison:
    """The verdict on two samples of sequences."""

    n_speculative: int
    n_plain: int
    length: int
    from_length: int
    statistic: float
    p_value: float
    alpha: float
    #: cells compared at each prefix length (after pooling)
    cells: tuple[int, ...]

    @property
    def same_distribution(self) -> bool:
        return self.p_value > self.alpha

    def describe(self) -> str:
        verdict = "the same distribution" if self.same_distribution else "DIFFERENT distributions"
        return (
            f"{verdict}: permutation p = {self.p_value:.4f} (false-alarm rate {self.alpha:g}), statistic "
            f"{self.statistic:.2f}, {self.n_speculative} speculative and {self.n_plain} plain sequences, prefixes of "
            f"{self.from_length} to {self.length} tokens, cells per prefix length {list(self.cells)}"
        )


def _codes(sequences: Sequence[Sequence[int]], lengths: range) -> tuple[np.ndarray, list[int]]:
    """``[len(lengths), n]`` cell codes: the ``m``-token prefix of each sequence for each ``m`` of ``lengths``, rare
    prefixes pooled."""
    rows, cells = [], []
    for m in lengths:
        prefixes = [tuple(s[:m]) for s in sequences]
        counts: dict[tuple, int] = {}
        for p in prefixes:
            counts[p] = counts.get(p, 0) + 1
        kept = sorted(p for p, c in counts.items() if c >= MIN_CELL)
        index = {p: i for i, p in enumerate(kept)}
        pooled = len(kept)
        rows.append([index.get(p, pooled) for p in prefixes])
        cells.append(len(kept) + (1 if any(p not in index for p in prefixes) else 0))
    return np.asarray(rows, dtype=np.int64), cells


def _statistic(codes: np.ndarray, cells: list[int], first: np.ndarray) -> np.ndarray:
    """The statistic for each labelling in ``first`` (``[k, n]`` booleans: in the first sample)."""
    total = np.zeros(first.shape[0])
    n_first = first.sum(axis=1, keepdims=True).astype(float)
    n = codes.shape[1]
    for row, k in zip(codes, cells):
        if k < 2:
            continue
        onehot = np.zeros((n, k))
        onehot[np.arange(n), row] = 1.0
        in_cell = onehot.sum(axis=0)  # [k]
        a = first.astype(float) @ onehot  # [labellings, k]: counts of the first sample in each cell
        expected_a = n_first * in_cell / n
        expected_b = (n - n_first) * in_cell / n
        b = in_cell - a
        chi2 = ((a - expected_a) ** 2 / expected_a + (b - expected_b) ** 2 / expected_b).sum(axis=1)
        total += chi2 / (k - 1)
    return total


def compare(
    speculative: Sequence[Sequence[int]],
    plain: Sequence[Sequence[int]],
    length: int,
    *,
    from_length: int = 1,
    alpha: float = ALPHA,
    permutations: int = PERMUTATIONS,
    seed: int = 0,
) -> Comparison:
    """The permutation test of the module docstring on the prefixes of ``from_length`` to ``length`` tokens of each
    sequence."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if not 1 <= from_length <= length:
        raise ValueError(f"expected 1 <= from_length <= length, got {from_length} and {length}")
    if permutations < 1:
        raise ValueError(f"permutations must be >= 1, got {permutations}")
    for name, sample in (("speculative", speculative), ("plain", plain)):
        if not sample:
            raise ValueError(f"the {name} sample is empty")
        short = [len(s) for s in sample if len(s) < length]
        if short:
            raise ValueError(f"{len(short)} {name} sequences are shorter than {length} tokens (e.g. {short[0]})")
    pooled = [list(s[:length]) for s in speculative] + [list(s[:length]) for s in plain]
    codes, cells = _codes(pooled, range(from_length, length + 1))
    n, n_spec = len(pooled), len(speculative)
    observed_labels = np.zeros((1, n), dtype=bool)
    observed_labels[0, :n_spec] = True
    observed = float(_statistic(codes, cells, observed_labels)[0])
    rng = np.random.default_rng(seed)
    exceed = 0
    for start in range(0, permutations, 1000):  # in blocks: [block, n] labellings at a time
        block = min(1000, permutations - start)
        order = rng.permuted(np.tile(np.arange(n), (block, 1)), axis=1)
        labels = order < n_spec
        exceed += int((_statistic(codes, cells, labels) >= observed - 1e-9).sum())
    return Comparison(
        n_speculative=n_spec,
        n_plain=len(plain),
        length=length,
        from_length=from_length,
        statistic=observed,
        p_value=(1 + exceed) / (1 + permutations),
        alpha=alpha,
        cells=tuple(cells),
    )


__all__ = ["ALPHA", "Comparison", "MIN_CELL", "PERMUTATIONS", "compare"]
