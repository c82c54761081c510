"""Cost of the EAGLE-3 patch set on the target's hot path: tiny Kimi-K2.5 prefill and decode with
aux capture on, stock sglang vs patched, in the same run.

One isolated process builds the real ModelRunner once, then alternates: ``eagle3_patches.revert()``
(stock sglang) and ``eagle3_patches.apply()`` (patched) every round, timing the same prefill and
decode steps in each state, so both states share the model, the allocator and the machine's noise.
The guards are shape checks only (no device synchronisation); goal: ratio <= 1.02.

Usage: python benchmarks/bench_patch_overhead.py [--rounds 20] [--steps 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eagle3_patches.testing import tiny_models  # noqa: E402
from eagle3_patches.testing.isolation import run_isolated  # noqa: E402


def _alternate(target: str, rounds: int, steps: int) -> dict:
    import eagle3_patches
    from eagle3_patches.testing import sglang_harness as h

    runner = h.model_runner(h.server_args(target))
    runner.model.set_eagle3_layers_to_capture([1, 2, 3])  # the Kimi delegation (patched at start)
    prompt = [[(7 * i) % 1000 + 4 for i in range(32)]]

    def timed() -> tuple[float, float]:
        prefill, decode = [], []
        for _ in range(steps):
            t = time.perf_counter()
            step = h.prefill(runner, prompt, return_hidden_states=True)
            prefill.append(time.perf_counter() - t)
            t = time.perf_counter()
            h.decode(runner, step)
            decode.append(time.perf_counter() - t)
            runner.req_to_token_pool.clear()
            runner.token_to_kv_pool_allocator.clear()
        return statistics.median(prefill), statistics.median(decode)

    timed()  # warm-up
    out = {"stock": [], "patched": []}
    for _ in range(rounds):
        for label in ("stock", "patched"):
            states = eagle3_patches.revert() if label == "stock" else eagle3_patches.apply()
            if label == "patched":
                assert states["aux_capture_validation"].state.value == "applied"
            out[label].append(timed())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        target = str(tiny_models.build_kimi_k25(Path(tmp) / "kimi"))
        res = run_isolated(_alternate, target, args.rounds, args.steps, patches="all")
    print(f"{'phase':<8} {'stock ms':>9} {'patched ms':>11} {'ratio':>7}   per-round ratios (min .. max)")
    for i, phase in enumerate(("prefill", "decode")):
        s = [r[i] for r in res["stock"]]
        p = [r[i] for r in res["patched"]]
        ratios = [b / a for a, b in zip(s, p)]
        print(
            f"{phase:<8} {statistics.median(s) * 1e3:>9.3f} {statistics.median(p) * 1e3:>11.3f} "
            f"{statistics.median(p) / statistics.median(s):>7.3f}   {min(ratios):.3f} .. {max(ratios):.3f}"
        )
    print(f"goal: ratio <= 1.02 (medians over {args.rounds} alternating rounds x {args.steps} steps, one process)")


if __name__ == "__main__":
    main()
