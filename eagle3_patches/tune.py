"""``eagle3-patches tune``: the speculative flags that give the most output tokens/s, from measured acceptance and
measured cost.

Three parts, each a plain function of its inputs (the CLI, ``cli/tune_cmd.py``, reads the files and runs them):

* **acceptance** at each setting of the grid (:func:`grid`): the accept length of greedy verification, from the
  draft's own top-k tree run on the data (:mod:`.acceptance.tree`; topk 1 is ``measure-accept``'s chain), or from a
  server's per-position figures at one topk-1 setting (:func:`chain_from_per_position`: steps up to the served ones);
* **cost** of a decode cycle at batch size B (:class:`CostModel`): ``c0 + c_step * steps + c_verify * B * n +
  c_draft * steps * B * topk`` seconds, ``n`` the draft tokens verified per request: a fixed part (scheduling, the
  draft's extend), one draft forward per step, the target's verify forward over ``B * n`` tokens, and the draft's
  forwards over ``B * topk`` tokens each step.  Its four parameters are fitted, non-negative, by least relative
  squares to cycles measured with sglang's serving benchmark at a few calibration settings (:func:`fit`, from
  ``eagle3-patches bench --json`` reports: a cycle at concurrency B and accept length a, served at T output tokens/s,
  took ``B * a / T`` seconds);
* **prediction**: output tokens/s = ``B * accept length / cycle(B)`` at every setting, the best per batch size
  (:func:`predict`, :func:`recommend`), a table, the flags to paste, an SVG plot (:func:`svg`).

What the model leaves out is listed in docs/tune.md (CUDA graphs, large batches, sampling at a temperature).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from .doctor.flag_rules import SpecFlags
from .errors import Eagle3ConfigError

#: the grid the issue asks for: steps 1..8, topk 1/2/4/8
STEPS = tuple(range(1, 9))
TOPKS = (1, 2, 4, 8)
#: the most draft tokens a setting of the grid verifies per request (a tree may hold more candidates)
MAX_DRAFT_TOKENS = 64
#: the cost model's parameters, in the order of :func:`features`
PARAMS = ("c0", "c_step", "c_verify", "c_draft")


class TuneError(Eagle3ConfigError):
    """What ``tune`` was given cannot give a recommendation."""

    default_code = "tune"


@dataclass(frozen=True, order=True)
class Setting:
    steps: int
    topk: int
    draft_tokens: int

    def flags(self) -> str:
        return (
            f"--speculative-num-steps {self.steps} --speculative-eagle-topk {self.topk} "
            f"--speculative-num-draft-tokens {self.draft_tokens}"
        )

    def label(self) -> str:
        return f"{self.steps}/{self.topk}/{self.draft_tokens}"


def tree_size(steps: int, topk: int) -> int:
    """The candidates sglang's draft tree holds (the doctor's rule of it)."""
    size = SpecFlags(steps, topk, None, disable_overlap=False, spec_v2=False, spec_v2_from="").tree_size
    assert size is not None  # steps and topk given
    return size


def valid(s: Setting) -> bool:
    """Whether sglang serves ``s`` as given: topk 1 verifies steps + 1 tokens (sglang sets that whatever is asked);
    topk > 1 verifies 2 .. the tree's candidates + 1 (asking more fails after the model has loaded)."""
    if s.steps < 1 or s.topk < 1:
        return False
    if s.topk == 1:
        return s.draft_tokens == s.steps + 1
    return 2 <= s.draft_tokens <= tree_size(s.steps, s.topk) + 1


def grid(
    steps: Iterable[int] = STEPS, topks: Iterable[int] = TOPKS, max_draft_tokens: int = MAX_DRAFT_TOKENS
) -> list[Setting]:
    """Every valid setting: each steps and topk, the draft tokens each topk allows up to ``max_draft_tokens``."""
    out = []
    for s, k in itertools.product(steps, topks):
        top = s + 1 if k == 1 else min(tree_size(s, k) + 1, max_draft_tokens)
        out += [Setting(s, k, n) for n in range(2, top + 1) if valid(Setting(s, k, n))]
    return sorted(out)


def accept_length(histogram: Sequence[float]) -> float:
    """Accepted draft tokens + 1 per verify step (sglang's ``accept len``) of a histogram of verify steps that accepted
    0, 1, ... draft tokens."""
    n = sum(histogram)
    if not n:
        raise TuneError("the data gives no verify step", expected="a token the target produced after the first")
    return sum((a + 1) * c for a, c in enumerate(histogram)) / n


def per_depth(histogram: Sequence[float]) -> list[float]:
    """Per depth k >= 1, the fraction of verify steps whose accepted path reached depth k."""
    n = sum(histogram)
    return [sum(histogram[k:]) / n for k in range(1, len(histogram))]


def chain_from_per_position(per_position: Sequence[float], served_steps: int | None = None) -> dict[Setting, float]:
    """topk-1 accept lengths from a chain's per-position figures (the fraction of verify steps that accepted draft
    token k, k = 1..S: ``measure-accept``'s, or a server's acceptance histogram): at steps s <= S, ``1 + sum_{k<=s}``
    of them (a request's end cuts a chain of any length alike)."""
    figures = [float(p) for p in per_position]
    if not figures or any(not 0.0 <= p <= 1.0 for p in figures) or any(b > a for a, b in itertools.pairwise(figures)):
        raise TuneError(
            "the per-position figures are not a chain's",
            found=", ".join(f"{p:g}" for p in figures)[:120] or "none",
            expected="fractions in 0..1 that do not grow with the position (draft token k+1 is accepted only after k)",
        )
    S = len(figures) if served_steps is None else min(served_steps, len(figures))
    return {Setting(s, 1, s + 1): 1.0 + sum(figures[:s]) for s in range(1, S + 1)}


# ---------------------------------------------------------------------- cost
@dataclass(frozen=True)
class Cycle:
    """One measured decode cycle: ``seconds`` at ``batch`` requests in flight, at ``setting``."""

    setting: Setting
    batch: int
    seconds: float


def features(s: Setting, batch: int) -> list[float]:
    return [1.0, float(s.steps), float(batch * s.draft_tokens), float(s.steps * batch * s.topk)]


@dataclass(frozen=True)
class CostModel:
    c0: float
    c_step: float
    c_verify: float
    c_draft: float

    def cycle(self, s: Setting, batch: int) -> float:
        """Seconds of one decode cycle at ``batch`` requests in flight."""
        return sum(c * f for c, f in zip((self.c0, self.c_step, self.c_verify, self.c_draft), features(s, batch)))

    def describe(self) -> str:
        return (
            f"cycle seconds = {self.c0:.4g} + {self.c_step:.4g} x steps + {self.c_verify:.4g} x B x draft_tokens + "
            f"{self.c_draft:.4g} x steps x B x topk"
        )


def cycle_from_phase(setting: Setting, phase: dict) -> Cycle:
    """A :class:`Cycle` from one phase of an ``eagle3-patches bench --json`` report (its concurrency, output tokens/s
    and sglang's accept length): ``concurrency * accept_length / output_tokens_per_s`` seconds."""
    rate, accept, batch = phase.get("output_tokens_per_s"), phase.get("accept_length"), phase.get("concurrency")
    if not isinstance(batch, int) or batch < 1 or not rate or rate <= 0 or not accept or accept < 1:
        raise TuneError(
            "a calibration phase lacks what a cycle's time is computed from",
            found=f"concurrency {batch!r}, output_tokens_per_s {rate!r}, accept_length {accept!r}"[:200],
            expected="a bench report of a speculative server (its accept length, its throughput)",
            fix="benchmark the calibration server with `eagle3-patches bench URL --json` and pass that file",
        )
    return Cycle(setting, batch, batch * float(accept) / float(rate))


def fit(cycles: Sequence[Cycle]) -> CostModel:
    """The non-negative parameters that fit ``cycles`` best in relative squared error (every subset of parameters
    tried: four of them).  Refused where the settings cannot tell the parameters apart."""
    import numpy as np

    X = np.array([features(c.setting, c.batch) for c in cycles], dtype=float)
    y = np.array([c.seconds for c in cycles], dtype=float)
    if len(cycles) < len(PARAMS) or np.linalg.matrix_rank(X) < len(PARAMS):
        raise TuneError(
            "the calibration cannot tell the cost model's four parameters apart",
            found=f"{len(cycles)} measured cycle(s) at "
            + (", ".join(sorted({f"{c.setting.label()} B={c.batch}" for c in cycles})) or "none")[:200],
            expected="at least four settings varying steps, draft tokens and topk (one with topk > 1)",
            fix="benchmark e.g. 1/1/2, 4/1/5, 2/4/8 and 3/4/16 (steps/topk/draft tokens) at each batch size",
        )
    Xr, yr = X / y[:, None], np.ones_like(y)
    best: tuple[float, list[float]] | None = None
    for keep in itertools.product((0, 1), repeat=len(PARAMS)):
        cols = [i for i, k in enumerate(keep) if k]
        if not cols:
            continue
        coef, *_ = np.linalg.lstsq(Xr[:, cols], yr, rcond=None)
        if (coef < 0).any():
            continue
        full = [0.0] * len(PARAMS)
        for i, c in zip(cols, coef):
            full[i] = float(c)
        err = float(((Xr @ np.array(full) - yr) ** 2).sum())
        if best is None or err < best[0]:
            best = (err, full)
    assert best is not None  # the constant alone fits with a non-negative coefficient
    return CostModel(*best[1])


# ---------------------------------------------------------------------- prediction
@dataclass(frozen=True)
class Prediction:
    setting: Setting
    batch: int
    accept_length: float
    cycle_s: float

    @property
    def tokens_per_s(self) -> float:
        return self.batch * self.accept_length / self.cycle_s


def predict(accept: dict[Setting, float], model: CostModel, batches: Sequence[int]) -> dict[int, list[Prediction]]:
    """Per batch size, every setting's prediction, best first (ties: the smaller setting)."""
    out = {}
    for b in batches:
        rows = [Prediction(s, b, a, model.cycle(s, b)) for s, a in accept.items() if valid(s)]
        if any(p.cycle_s <= 0 for p in rows):
            raise TuneError("the cost model gives a cycle no time", found=model.describe(), fix="calibrate again")
        out[b] = sorted(rows, key=lambda p: (-p.tokens_per_s, p.setting))
    return out


def recommend(predictions: dict[int, list[Prediction]]) -> dict[int, Prediction]:
    return {b: rows[0] for b, rows in predictions.items() if rows}


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""

    def ranks(v: Sequence[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for m in range(i, j + 1):
                r[order[m]] = (i + j) / 2
            i = j + 1
        return r

    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    den = math.sqrt(sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb))
    return cov / den if den else 0.0


def _rate(v: float) -> str:
    """Tokens/s to three significant figures at least: a slow device's 0.27 is not rounded to 0.3."""
    return f"{v:.1f}" if v >= 100 else f"{v:.3g}"


def format_report(
    predictions: dict[int, list[Prediction]], model: CostModel, depths: dict[int, list[float]], top: int = 12
) -> str:
    lines = [f"cost model (fitted): {model.describe()}"]
    if depths:
        lines.append(
            "target's token in the draft's tree at depth k (fraction of verify steps; the widest tree of each "
            "topk at 8 steps):"
        )
        for k, fr in sorted(depths.items()):
            lines.append(f"  topk {k}: " + " ".join(f"{x:.3f}" for x in fr))
    for b, rows in predictions.items():
        lines += ["", f"batch size {b}: {len(rows)} settings, the best {min(top, len(rows))}:"]
        lines.append(f"  {'steps/topk/draft tokens':<24} {'accept len':>10} {'cycle ms':>9} {'tok/s':>9}")
        for p in rows[:top]:
            lines.append(
                f"  {p.setting.label():<24} {p.accept_length:>10.3f} {p.cycle_s * 1e3:>9.2f} {_rate(p.tokens_per_s):>9}"
            )
    lines.append("")
    for b, p in recommend(predictions).items():
        lines.append(f"recommended at batch size {b}: {p.setting.flags()}")
    return "\n".join(lines)


def to_json(predictions: dict[int, list[Prediction]], model: CostModel, depths: dict[int, list[float]]) -> str:
    return json.dumps(
        {
            "cost_model": asdict(model),
            "per_depth": {str(k): v for k, v in depths.items()},
            "batches": {
                str(b): [
                    {
                        **asdict(p.setting),
                        "accept_length": p.accept_length,
                        "cycle_s": p.cycle_s,
                        "tokens_per_s": p.tokens_per_s,
                    }
                    for p in rows
                ]
                for b, rows in predictions.items()
            },
            "recommended": {
                str(b): {**asdict(p.setting), "flags": p.setting.flags()} for b, p in recommend(predictions).items()
            },
        },
        indent=2,
    )


#: the plot's colour of each topk
_COLOURS = {1: "#1f77b4", 2: "#ff7f0e", 4: "#2ca02c", 8: "#d62728"}


def svg(predictions: dict[int, list[Prediction]], width: int = 640, height: int = 360) -> str:
    """The predicted tokens/s against steps, one panel per batch size, one line per topk (its best draft tokens at
    each steps), the recommended setting circled: an SVG written by hand (no plotting library)."""
    H = height * len(predictions)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{H}" font-family="sans-serif" '
        'font-size="11">',
        f'<rect width="{width}" height="{H}" fill="white"/>',
    ]
    for i, (b, rows) in enumerate(predictions.items()):
        out += _panel(b, rows, i * height, width, height)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _panel(b: int, rows: list[Prediction], y0: int, width: int, height: int) -> list[str]:
    left, right, top, bottom = 60, width - 90, y0 + 30, y0 + height - 40
    best: dict[tuple[int, int], Prediction] = {}
    for p in rows:
        key = (p.setting.topk, p.setting.steps)
        if key not in best or p.tokens_per_s > best[key].tokens_per_s:
            best[key] = p
    ymax = max((p.tokens_per_s for p in rows), default=1.0) * 1.1 or 1.0
    steps = sorted({s for _, s in best}) or [1]
    smin, smax = steps[0], max(steps[-1], steps[0] + 1)

    def x(s: float) -> float:
        return left + (s - smin) / (smax - smin) * (right - left)

    def y(v: float) -> float:
        return bottom - v / ymax * (bottom - top)

    out = [
        f'<text x="{left}" y="{y0 + 18}" font-size="13">predicted output tokens/s, batch size {b}</text>',
        f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="black"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="black"/>',
        f'<text x="{(left + right) / 2:.1f}" y="{bottom + 30}" text-anchor="middle">steps</text>',
    ]
    out += [f'<text x="{x(s):.1f}" y="{bottom + 14}" text-anchor="middle">{s}</text>' for s in steps]
    out += [f'<text x="{left - 4}" y="{y(v) + 4:.1f}" text-anchor="end">{_rate(v)}</text>' for v in (0.0, ymax / 1.1)]
    for j, k in enumerate(sorted({k for k, _ in best})):
        path = " ".join(f"{x(s):.1f},{y(best[(k, s)].tokens_per_s):.1f}" for s in steps if (k, s) in best)
        c = _COLOURS.get(k, "gray")
        out.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2"/>')
        out.append(f'<text x="{right + 8}" y="{top + 14 * j + 10}" fill="{c}">topk {k}</text>')
    if rows:
        r = rows[0]
        out.append(
            f'<circle cx="{x(r.setting.steps):.1f}" cy="{y(r.tokens_per_s):.1f}" r="6" fill="none" '
            'stroke="black" stroke-width="2"/>'
        )
        out.append(f'<text x="{right + 8}" y="{bottom}">best {r.setting.label()}</text>')
    return out
