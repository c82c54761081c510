"""The CPU demo (README's main job): EAGLE-3 on a tiny Kimi-K2.5 through real sglang 0.5.9 code.

1. builds (or reuses) a tiny Kimi-K2.5 target and a tiny EAGLE-3 draft in .eagle3-demo/;
2. stock sglang 0.5.9: the target alone runs prefill + decode; EAGLE-3 on Kimi fails at start;
3. with eagle3-patches: the real TpModelWorker + EAGLEWorker run a prefill batch, and the draft's
   fc receives the 3 x hidden concatenation; the patch status is printed;
4. --speculative-algorithm EAGLE with the EAGLE-3 draft is refused with the fix in the message.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eagle3_patches.testing import tiny_models  # noqa: E402
from eagle3_patches.testing.isolation import run_isolated  # noqa: E402

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12]]


def _target_alone(target: str):
    from eagle3_patches.testing import sglang_harness as h

    runner = h.model_runner(h.server_args(target))
    runner.model.language_model.set_eagle3_layers_to_capture(list(tiny_models.DRAFT_AUX_IDS))
    step = h.prefill(runner, PROMPTS, return_hidden_states=True)
    dec = h.decode(runner, step)
    return {
        "layers_to_capture": list(runner.model.language_model.model.layers_to_capture),
        "captured": tuple(step.logits_output.hidden_states.shape),
        "tokens": [step.next_token_ids.tolist(), dec.next_token_ids.tolist()],
    }


def _eagle3(target: str, draft: str, algorithm: str = "EAGLE3"):
    import eagle3_patches
    from eagle3_patches.testing import sglang_harness as h

    try:
        tw, dw = h.eagle_workers(h.eagle3_server_args(target, draft, algorithm=algorithm))
    except Exception as exc:  # noqa: BLE001 - shown to the reader
        return {"error": f"{type(exc).__name__}: {exc}"}
    fc_inputs = h.record_fc_inputs(dw)
    result, _ = h.eagle_prefill(tw, dw, PROMPTS)
    return {
        "target_hidden_states": tuple(result.logits_output.hidden_states.shape),
        "fc_inputs": fc_inputs,
        "fc_weight": tuple(dw.draft_model_runner.model.model.fc.weight.shape),
        "status": {n: s.state.value for n, s in eagle3_patches.status().items()},
    }


def main() -> int:
    t0 = time.time()
    paths = tiny_models.build_all(ROOT / ".eagle3-demo")
    target, draft = str(paths["kimi_k25"]), str(paths["draft"])
    h = tiny_models.HIDDEN
    print(f"tiny Kimi-K2.5 target: {target}\n  hidden {h}, {tiny_models.NUM_LAYERS} layers; draft aux ids {list(tiny_models.DRAFT_AUX_IDS)}")

    print("\n[1] stock sglang 0.5.9, target alone (ModelRunner, capture on via language_model):")
    out = run_isolated(_target_alone, target)
    print(f"  layers_to_capture {out['layers_to_capture']}  captured hidden states {out['captured']}  tokens {out['tokens']}")

    print("\n[2] stock sglang 0.5.9, --speculative-algorithm EAGLE3 on Kimi-K2.5:")
    stock = run_isolated(_eagle3, target, draft, patches=None)
    print(f"  {stock.get('error', stock)}")

    print("\n[3] with eagle3-patches, TpModelWorker + EAGLEWorker.forward_batch_generation:")
    patched = run_isolated(_eagle3, target, draft, patches="all")
    if "error" in patched:
        print(f"  FAILED: {patched['error']}")
        return 1
    print(f"  target logits_output.hidden_states {patched['target_hidden_states']}  (3 x {h} = {3 * h})")
    print(f"  draft fc.weight {patched['fc_weight']}; fc input widths seen by a forward hook: {patched['fc_inputs']}")
    for name, state in patched["status"].items():
        print(f"    {name:<30} {state}")

    print("\n[4] with eagle3-patches, --speculative-algorithm EAGLE with the EAGLE-3 draft:")
    refused = run_isolated(_eagle3, target, draft, "EAGLE", patches="all")
    print("  " + refused.get("error", "NOT REFUSED").replace("\n", "\n  "))

    ok = (
        "set_eagle3_layers_to_capture" in stock.get("error", "")
        and patched["fc_inputs"] and all(s[-1] == 3 * h for s in patched["fc_inputs"])
        and "Eagle3ConfigError" in refused.get("error", "")
    )
    print(f"\ndemo {'OK' if ok else 'FAILED'} in {time.time() - t0:.0f}s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
