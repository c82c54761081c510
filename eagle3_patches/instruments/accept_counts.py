"""What the accept-length watchdog counts, per window of verify steps: the accept length (:class:`Window`), the
acceptance per draft position (:class:`Positions`) and the temperatures served (:class:`Served`).  Pure and
sglang-free (unit-tested); :mod:`.accept_watchdog` feeds them from sglang's hooks and judges the windows."""

from __future__ import annotations

import math
from typing import Any

from ..checkpoint import expected_accept

#: acceptance counted for draft positions 1..MAX_POSITIONS (a verify step accepts at most its steps)
MAX_POSITIONS = 64
#: distinct temperatures counted per window (more are counted together as "other")
MAX_TEMPERATURES = 16


class Positions:
    """How many verify steps accepted how many draft tokens, since the last :meth:`take` (sglang's per-request
    acceptance histogram, summed over requests).  The hot path: one bounds check and one increment."""

    __slots__ = ("counts", "longest")

    def __init__(self) -> None:
        self.counts = [0] * (MAX_POSITIONS + 1)
        self.longest = 0  # the most draft tokens any verify step accepted so far: the positions reported

    def add(self, accepted: int) -> None:
        self.counts[min(max(accepted, 0), MAX_POSITIONS)] += 1

    def take(self) -> list[float]:
        """Per position k = 1..:attr:`longest`, the fraction of verify steps since the last take that accepted
        draft token k (0.0 where none did); then start again."""
        counts, self.counts = self.counts, [0] * (MAX_POSITIONS + 1)
        total = sum(counts)
        if not total:
            return []
        self.longest = max(self.longest, max(k for k, c in enumerate(counts) if c))
        return [sum(counts[k:]) / total for k in range(1, self.longest + 1)]


def request_temperature(req: Any) -> float | None:
    """The temperature sglang samples ``req`` at: 0.0 for a greedy request (sglang rewrites temperature 0 as top_k 1,
    temperature 1.0), None where the request says nothing readable."""
    sp = getattr(req, "sampling_params", None)
    if getattr(sp, "top_k", None) == 1:
        return 0.0
    t = getattr(sp, "temperature", None)
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else None


class Served:
    """How many verify steps of the window were served at which temperature (per request and verify step, from
    the ``Req`` whose acceptance sglang counts): what an expected figure stated at one temperature is held to."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[float | None, int] = {}

    def add(self, temperature: float | None) -> None:
        counts = self.counts
        if temperature not in counts and len(counts) >= MAX_TEMPERATURES:
            temperature = None  # counted as a temperature other than any stated one
        counts[temperature] = counts.get(temperature, 0) + 1

    def take(self) -> dict[float | None, int]:
        counts, self.counts = self.counts, {}
        return counts


def _same_temperature(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def other_share(served: dict[float | None, int], temperature: float | None) -> float:
    """The share of ``served``'s verify steps at another temperature than ``temperature`` (0.0 when the figure
    states none, or nothing was counted)."""
    total = sum(served.values())
    if temperature is None or not total:
        return 0.0
    return sum(c for t, c in served.items() if not _same_temperature(t, temperature)) / total


def served_text(served: dict[float | None, int]) -> str:
    """``greedy (temperature 0) in 80%, temperature 1 in 20%`` of a window's verify steps, the most first."""
    total = sum(served.values())
    parts = sorted(served.items(), key=lambda kv: -kv[1])
    return ", ".join(
        f"{expected_accept.sampling_text(t) if t is not None else 'other temperatures'} in {c / total:.0%}"
        for t, c in parts
    )


def rates_text(rates: list[float]) -> str:
    return ", ".join(f"k={k}: {r:.0%}" for k, r in enumerate(rates, start=1))


# ---------------------------------------------------------------------- the window
class Window:
    """Tumbling windows of ``size`` verify steps after ``warmup`` steps; :meth:`add` returns a completed
    window's mean accept length, else None.  The hot path: a comparison and two additions."""

    __slots__ = ("size", "warmup", "seen", "steps", "tokens")

    def __init__(self, size: int, warmup: int = 0):
        if size < 1 or warmup < 0:
            raise ValueError(f"window size {size} must be >= 1 and warm-up {warmup} >= 0")
        self.size, self.warmup = size, warmup
        self.seen = 0  # verify steps counted towards the warm-up
        self.steps = 0
        self.tokens = 0

    def add(self, steps: int, tokens: int) -> float | None:
        """One decode batch: ``steps`` verify steps that yielded ``tokens`` tokens (accepted drafts + 1 each)."""
        if self.seen < self.warmup:
            self.seen += steps  # a batch that ends the warm-up is not counted either
            return None
        self.steps += steps
        self.tokens += tokens
        if self.steps < self.size:
            return None
        mean = self.tokens / self.steps
        self.steps = self.tokens = 0
        return mean
