"""The CPU demo (README's main job): the real SGLang 0.5.9 server doing EAGLE-3 speculative
decoding on a tiny Kimi-K2.5, with the accept length measured.  Every step is a real
``python -m sglang.launch_server`` under ``eagle3-patches run --cpu-profile`` (docs/e2e.md).

1. builds (or reuses) the tiny Kimi-K2.5 target and the trained tiny EAGLE-3 draft in .eagle3-demo/
   (``--retrain``: regenerate the draft with tools/train_tiny_draft.py first, ~10 min);
2. stock sglang 0.5.9 (every patch disabled): Kimi-K2.5 + EAGLE3 fails at start (started beside the
   reference server's start, with the refused start of step 4: neither is timed);
3. with eagle3-patches: the target without speculation, then with EAGLE3 (3 steps, topk 1) and the
   diagnostic probe; same prompts, greedy: outputs compared token for token, the accept length,
   tokens/s of both (eagle3_patches.bench), the draft fc input width the probe saw in the server,
   and the patch status the server's processes logged; why EAGLE3 is slower on this CPU (a cycle's parts timed
   on sglang's own workers: tools/forward_costs.py) and the speedup its accept length implies on a
   GPU (eagle3_patches.bench.expected_speedup);
4. --speculative-algorithm EAGLE with the EAGLE-3 draft: refused at start, with the fix;
   and with the guards disabled, the field's symptom (accept length ~1.0).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import forward_costs  # noqa: E402 - tools/, beside this script

from eagle3_patches import bench  # noqa: E402
from eagle3_patches.testing import tiny_models  # noqa: E402
from eagle3_patches.testing.isolation import run_isolated  # noqa: E402
from eagle3_patches.testing.server import Server, ServerError, speculative_flags  # noqa: E402

WORK = ROOT / ".eagle3-demo"
H = tiny_models.HIDDEN


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def status_line(log: str) -> str:
    m = re.search(r"layers_to_capture \[[^\]]*\]; (.*)$", log, re.M)
    return m.group(1) if m else "(no status line in the server log)"


#: the draft's cost per forward relative to the target's decode step on a GPU, for the expected speedups printed: a
#: one-layer EAGLE-3 draft reads about 1-1.5 B parameters a step (its layer, fc, lm_head) against Kimi-K2.5's 32 B
#: activated ones, a few percent; a larger share for a smaller target
GPU_DRAFT_COSTS = (0.03, 0.1)


def why_slower_here(report: dict, parts: dict[str, float], steps: int) -> list[str]:
    """The demo's speed ratio explained from its own measurements (``parts``: :func:`forward_costs.measure`), and
    what its accept length implies on a GPU."""
    accept = report["servers"][0]["single"]["accept_length"]
    cycle = report["ratios"]["single"]["cycle_in_plain_steps"]
    if not accept or not cycle:
        return []
    plain = parts["plain_decode"]
    split = ", ".join(f"{label} {parts[name] / plain:.2f}" for name, label in forward_costs.PARTS.items())
    gpu = ", ".join(f"x{bench.expected_speedup(accept, steps, c):.1f} with c = {c:g}" for c in GPU_DRAFT_COSTS)
    return [
        "",
        "  why speculation is slower here (measured):",
        f"    in the servers above an EAGLE3 cycle yields {accept:.2f} tokens and takes the wall time of {cycle:.1f}",
        f"    plain decode steps: {accept:.2f} / {cycle:.1f} = x{accept / cycle:.2f}.",
        "    sglang's own workers, timed in one process with the same flags (one request): a plain decode step",
        f"    {plain:.2f} s, an EAGLE3 cycle {parts['cycle']:.2f} s = {parts['cycle'] / plain:.2f} plain steps;",
        f"    in plain steps: {split}.",
        "    On this CPU every kernel runs under the Triton interpreter and the tensors are tiny (hidden 64): the",
        f"    {steps + 1}-token verify costs {parts['verify'] / plain:.1f} plain steps and the draft"
        f" {(parts['draft'] + parts['forward_draft_extend_after_decode']) / plain:.1f} more,",
        f"    and {accept:.2f} tokens a cycle do not pay for them.",
        "  what this accept length implies on a GPU:",
        "    speedup = accept length / (1 + steps x c), c = a draft forward's cost relative to a target decode",
        "    step (Leviathan et al. 2023; the EAGLE papers' tau is the accept length): the verify costs about one",
        "    decode step there, decoding being memory-bound at small batch; Kimi-K2.5's one-layer draft reads a few",
        f"    percent of the target's activated weights a step. With steps = {steps}: {gpu}.",
        "    Caveat: an estimate. It leaves out scheduling overhead and the draft's extend, shrinks as the batch",
        "    grows (verify becomes compute-bound), and this tiny draft's accept length on a random target is not",
        "    a real Kimi-K2.5 drafter's: measure yours with eagle3-patches bench against the server without",
        "    speculation.",
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="EAGLE-3 on a tiny Kimi-K2.5 through the real sglang 0.5.9 server on CPU")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--retrain", action="store_true", help="retrain the draft (tools/train_tiny_draft.py) first")
    ap.add_argument("--skip-symptom", action="store_true", help="skip the EAGLE-with-guards-disabled server (~1 min)")
    args = ap.parse_args(argv)
    t0 = time.time()
    logs = WORK / "logs"
    if args.retrain:
        subprocess.run([sys.executable, str(ROOT / "tools" / "train_tiny_draft.py")], check=True)
    target = str(tiny_models.build_kimi_k25(WORK / "tiny-kimi-k25"))
    draft = str(tiny_models.build_trained_eagle3_draft(WORK))
    cfg = json.loads((Path(draft) / "config.json").read_text())
    print(
        f"tiny Kimi-K2.5 target: {target}\n  hidden {H}, {tiny_models.NUM_LAYERS} layers, vocab {tiny_models.VOCAB}, "
        "random weights"
    )
    print(
        f"trained EAGLE-3 draft: {draft}\n  aux ids {cfg['eagle_config']['eagle_aux_hidden_state_layer_ids']}, "
        f"fc {3 * H} -> {H}, draft vocab {cfg['draft_vocab_size']} (tools/train_tiny_draft.py, from hidden_state_dump "
        "shards)"
    )
    # sglang's serving benchmark, the same random token ids for both (seed 4321: held out, the draft was trained on
    # prompts from seed 1234), greedy
    kw = dict(
        num_prompts=args.prompts, input_len=8, output_len=args.max_new_tokens, seed=4321, tokenizer=target, quiet=True
    )
    spec = speculative_flags(draft, "EAGLE3", steps=3, topk=1, draft_tokens=4)
    import eagle3_patches

    all_patches = eagle3_patches.get_registry().names()

    # the two starts that must fail exit within a minute and are not timed: they run beside the reference's start
    stock = Server(target, spec, log_path=logs / "stock.log", disable=all_patches)
    refused = Server(target, speculative_flags(draft, "EAGLE"), log_path=logs / "eagle-refused.log")
    with ThreadPoolExecutor(max_workers=2) as pool:
        exits = [pool.submit(stock.wait_exit, 240), pool.submit(refused.wait_exit, 240)]
        base = Server(target, [], log_path=logs / "baseline.log")
        try:
            base.start()
            stock_rc, refused_rc = (f.result() for f in exits)  # nothing else runs while the reference is timed
            print("\n[1] stock sglang 0.5.9 (every patch disabled), Kimi-K2.5 + --speculative-algorithm EAGLE3:")
            err = [
                line for line in stock.log().splitlines() if "Error" in line and "set_eagle3_layers_to_capture" in line
            ]
            how = "sglang killed its own process tree" if stock_rc == -9 else "exited"
            print(f"  failed at start ({how}, status {stock_rc}): {err[-1].strip() if err else stock.log_tail(3)}")
            print("\n[2] with eagle3-patches: the target without speculation (reference)")
            ref = bench.bench_server(base.url, label="no spec", concurrency=1, **kw)
        finally:
            base.stop()

    print("\n[3] with eagle3-patches: --speculative-algorithm EAGLE3 (3 steps, topk 1, 4 draft tokens), probe on")
    probe_dir = logs / "probe"
    for old in probe_dir.glob("*.jsonl"):
        old.unlink()
    eagle3 = Server(target, spec, log_path=logs / "eagle3.log", env={"EAGLE3_PATCHES_PROBE": str(probe_dir)})
    try:
        t1 = time.time()
        eagle3.start()
        print(f"  server ready in {time.time() - t1:.0f} s")
        rep = bench.bench_server(eagle3.url, label="EAGLE3", concurrency=1, **kw)
    except ServerError as exc:
        print(f"  FAILED: {exc}")
        return 1
    finally:
        eagle3.stop()
    report = {"servers": [asdict(rep), asdict(ref)]}
    report["ratios"] = bench.compare(rep, ref)
    print("\n" + "\n".join("  " + line for line in bench.format_table(report).splitlines()))
    for i, (a, b) in enumerate(zip(rep.outputs, ref.outputs)):
        print(f"  prompt {i}\n    EAGLE3  {a}\n    no spec {b}  {'identical' if a == b else 'DIFFERENT'}")
    print(f"  accept length (sglang's avg_spec_accept_length): {_fmt(rep.single.accept_length)}")
    parts = run_isolated(forward_costs.measure, target, draft, patches="all")
    print("\n".join(why_slower_here(report, parts, steps=3)))
    records = [
        json.loads(line)
        for f in sorted(probe_dir.glob("*.jsonl"))
        for line in f.read_text().splitlines()
        if line.strip()
    ]
    for r in records:
        if r.get("hop") == "draft_input" and r.get("mode") == "decode":
            print(
                f"  probe (in the server): draft input in decode: width {r.get('width')} (the draft's own state "
                "between its steps: fc skipped there by design)"
            )
        elif r.get("hop") == "draft_input" and r.get("fc_applied") is not None:
            print(
                f"  probe (in the server): draft input in {r.get('mode')}: width {r.get('width')}, "
                f"fc {'applied' if r.get('fc_applied') else 'SKIPPED'}, fc input {r.get('fc_input_shape')} (3 x {H} = "
                f"{3 * H})"
            )
        elif r.get("hop") == "target_output" and r.get("width"):
            print(
                f"  probe (in the server): target output in {r.get('mode')}: layers_to_capture "
                f"{r.get('layers_to_capture')}, width {r.get('width')}"
            )
    print("  patch status in the server's processes:")
    for item in status_line(eagle3.log()).split(", "):
        print(f"    {item.replace('=', ': ')}")

    print("\n[4] --speculative-algorithm EAGLE with the EAGLE-3 draft (the field's mistake):")
    msg = [
        line
        for line in refused.log().splitlines()
        if "EAGLE-3 draft" in line or line.lstrip().startswith(("where", "found", "expected", "fix"))
    ]
    print(f"  refused at start (exit status {refused_rc}):")
    for line in msg[:6]:
        print(f"    {line.strip()}")
    if not args.skip_symptom:
        print("  the same with the algorithm and fc guards disabled (what stock sglang does silently):")
        sym = Server(
            target,
            speculative_flags(draft, "EAGLE"),
            log_path=logs / "eagle-unguarded.log",
            disable=["eagle3_algorithm_guard", "eagle3_fc_guard"],
        )
        try:
            sym.start()
            srep = bench.bench_server(
                sym.url, label="EAGLE", concurrency=1, **{**kw, "num_prompts": 1, "progress": False}
            )
            print(
                f"    accept length {_fmt(srep.single.accept_length)} "
                f"(EAGLE3 above: {_fmt(rep.single.accept_length)}); "
                f"outputs still identical to no speculation: {srep.outputs == ref.outputs[:1]}"
            )
        finally:
            sym.stop()
    print(f"\ndemo finished in {time.time() - t0:.0f} s; server logs in {logs}")
    ok = report["ratios"]["same_outputs"] and rep.single.accept_length is not None
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
