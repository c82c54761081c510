"""Cost of the EAGLE-3 patch set on the target's hot path: tiny Kimi-K2.5 prefill and decode with
aux capture on, stock sglang vs patched, in the same run (alternating isolated processes).

The guards are shape checks only (no device synchronisation); goal: ratio <= 1.02.
Usage: python benchmarks/bench_patch_overhead.py [--rounds 3] [--steps 30]
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


def _time_steps(target: str, steps: int) -> dict:
    from eagle3_patches.testing import sglang_harness as h

    runner = h.model_runner(h.server_args(target))
    runner.model.language_model.set_eagle3_layers_to_capture([1, 2, 3])  # stock Kimi lacks the delegation
    prompt = [[(7 * i) % 1000 + 4 for i in range(32)]]
    h.prefill(runner, prompt, return_hidden_states=True)  # warm-up
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
    return {"prefill": statistics.median(prefill), "decode": statistics.median(decode)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        target = str(tiny_models.build_kimi_k25(Path(tmp) / "kimi"))
        results = {"stock": [], "patched": []}
        for _ in range(args.rounds):
            for label, patches in (("stock", None), ("patched", "all")):
                results[label].append(run_isolated(_time_steps, target, args.steps, patches=patches))
    print(f"{'phase':<8} {'stock ms':>10} {'patched ms':>11} {'ratio':>7}")
    for phase in ("prefill", "decode"):
        s = statistics.median(r[phase] for r in results["stock"]) * 1e3
        p = statistics.median(r[phase] for r in results["patched"]) * 1e3
        print(f"{phase:<8} {s:>10.2f} {p:>11.2f} {p / s:>7.3f}")
    print("goal: ratio <= 1.02 (medians of", args.rounds, "alternating rounds x", args.steps, "steps)")


if __name__ == "__main__":
    main()
