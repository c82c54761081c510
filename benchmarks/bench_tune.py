"""Benchmark: ``eagle3-patches tune`` checked against reality on CPU, on the tiny Kimi-K2.5 with the trained draft.

1. **The data**: the tiny target without speculation serves the benchmark's own requests (sglang's serving benchmark,
   random ids, greedy) with the ``hidden_state_dump`` instrument on: a known-good server's states on the workload
   measured below, as an operator would dump theirs.
2. **Calibration**: the real EAGLE3 server at the four calibration settings (steps/topk/draft tokens 1/1/2, 4/1/5,
   2/4/8, 3/4/16), each measured with sglang's serving benchmark (``eagle3_patches.bench.run_phase``: random ids,
   greedy) at every batch size (its ``--max-concurrency``): a warm-up phase, then ``--repeats`` phases whose median
   stands for the setting, written as ``eagle3-patches bench --json`` reports.
3. **tune**: ``eagle3-patches tune --draft --target --data <dump> --calibration ... --json`` as a user runs it: the
   draft's trees on the dump, the cost model fitted to the calibration, the prediction for every setting of the grid.
4. **Reality**: more settings served and measured the same way (the evaluation set, and each batch size's
   recommended setting where it is not among them): per batch size the rank correlation (Spearman) of predicted and
   measured output tokens/s over every setting served, the same over the settings the cost was not fitted to, the
   recommended setting's measured tokens/s against the best measured, and the predicted against sglang's measured
   accept length at topk > 1 (the offline tree acceptance against the server's).

    python benchmarks/bench_tune.py [--batch-sizes 1,4] [--prompts 4] [--max-new-tokens 24] [--repeats 3]
        [--data DUMP] [--out DIR]

Minutes on CPU (a dozen servers start one after the other, each under the Triton interpreter).  Not a timed test: it
prints its figures.  On a GPU host the same run (``--device cuda``) serves the tiny models on the GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eagle3_patches import bench, settings, tune  # noqa: E402
from eagle3_patches.testing import tiny_models  # noqa: E402
from eagle3_patches.testing.server import Server, ServerError, speculative_flags  # noqa: E402

CALIBRATION = [tune.Setting(1, 1, 2), tune.Setting(4, 1, 5), tune.Setting(2, 4, 8), tune.Setting(3, 4, 16)]
#: across the grid: short and long chains, narrow and wide trees (a ranking is only as telling as the spread of what
#: it ranks)
EVALUATION = [
    tune.Setting(2, 1, 3),
    tune.Setting(3, 1, 4),
    tune.Setting(6, 1, 7),
    tune.Setting(2, 2, 4),
    tune.Setting(3, 2, 6),
    tune.Setting(2, 8, 16),
]


def dump(target: Path, out: Path, kw: dict, device: str) -> Path:
    """The states of the target serving the benchmark's own requests (sglang's serving benchmark, single-stream):
    the data ``tune`` measures acceptance on is the workload the servers are measured on."""
    dump_dir = out / "dump"
    env = {
        settings.ENABLE: "hidden_state_dump",
        settings.DUMP_DIR: str(dump_dir),
        settings.DUMP_LAYER_IDS: ",".join(map(str, tiny_models.DRAFT_AUX_IDS)),
    }
    server = Server(str(target), ["--disable-radix-cache"], log_path=out / "dump.log", env=env, device=device)
    try:
        server.start()
        bench.run_phase(server.url, 1, label="dump", quiet=True, **kw)
        time.sleep(3)  # the dump writes its last shard after an idle second
    finally:
        server.stop()
    return dump_dir


def server_accept_length(url: str) -> float | None:
    """The server's own average accept length since it started (what sglang's benchmark reports)."""
    import urllib.request

    with urllib.request.urlopen(url + "/get_server_info", timeout=60) as r:
        info = json.load(r)
    states = info.get("internal_states") or [{}]
    return states[0].get("avg_spec_accept_length")


def measure(
    target: Path, draft: Path, s: tune.Setting, batches, out: Path, kw: dict, device: str, repeats: int
) -> dict:
    """sglang's serving benchmark of the server at ``s``, per batch size a warm-up phase (not counted: a server's first
    requests pay what its later ones do not, and not alike at every setting) and ``repeats`` measured ones, of which
    the median by output tokens/s stands for the setting (the others' tokens/s kept in ``runs_tokens_per_s``): an
    ``eagle3-patches bench --json`` report (its first server's phases)."""
    # sglang adds to the accept length it reports (its server info, which its benchmark reads) when it logs a decode
    # step, every 40 by default: more than a short phase runs
    args = [*speculative_flags(str(draft), "EAGLE3", s.steps, s.topk, s.draft_tokens), "--decode-log-interval", "1"]
    server = Server(str(target), args, log_path=out / f"serve-{s.label().replace('/', '-')}.log", device=device)
    phases = []
    try:
        server.start()
        for b in batches:
            bench.run_phase(server.url, b, label=s.label(), quiet=True, **kw)  # the warm-up
            runs = sorted(
                (bench.run_phase(server.url, b, label=s.label(), quiet=True, **kw)[0] for _ in range(repeats)),
                key=lambda p: p.output_tokens_per_s,
            )
            phase = runs[len(runs) // 2]
            if phase.accept_length is None:  # the benchmark's own read of the server's figure came back empty
                phase.accept_length = server_accept_length(server.url)
            phases.append({**asdict(phase), "runs_tokens_per_s": [p.output_tokens_per_s for p in runs]})
    finally:
        server.stop()
    report = {"servers": [{"url": server.url, "label": s.label(), "single": phases[0], "concurrent": None}]}
    if len(phases) > 1:  # bench's report has two phases: the others go in files of their own
        report["phases"] = phases
    return report


def _spread(phase: dict) -> str:
    runs = phase.get("runs_tokens_per_s") or [phase["output_tokens_per_s"]]
    return f"{min(runs):.4g}-{max(runs):.4g}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch-sizes", default="1,4")
    ap.add_argument("--prompts", type=int, default=4, help="requests per benchmark phase")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument(
        "--repeats", type=int, default=3, help="measured phases per server and batch size, after a warm-up one"
    )
    ap.add_argument("--data", help="a dump of an earlier run to reuse (default: dump anew)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--out",
        help="where the logs, dump and reports go (default: a new temporary directory); a run into the "
        "directory of an earlier one reuses the settings it measured",
    )
    args = ap.parse_args()
    batches = [int(b) for b in args.batch_sizes.split(",")]
    out = Path(args.out or tempfile.mkdtemp(prefix="bench-tune-"))
    out.mkdir(parents=True, exist_ok=True)
    root = Path(os.environ.get("EAGLE3_TINY_CACHE") or out / "models")
    target = tiny_models.build_kimi_k25(root / "tiny-kimi-k25")
    draft = tiny_models.build_trained_eagle3_draft(root)
    kw = dict(num_prompts=args.prompts, input_len=8, output_len=args.max_new_tokens, seed=4321, tokenizer=str(target))
    t0 = time.time()
    if args.data:
        data = Path(args.data)
    else:
        data = dump(target, out, kw, args.device)
    print(f"[1] the dump of greedy requests: {data} ({time.time() - t0:.0f} s)", flush=True)

    measured: dict[tune.Setting, dict] = {}

    def serve(s: tune.Setting) -> None:
        t = time.time()
        saved = out / f"measured-{s.label().replace('/', '-')}.json"  # a run started again reuses what was measured
        try:
            if saved.is_file():
                measured[s] = json.loads(saved.read_text())
            else:
                measured[s] = measure(target, draft, s, batches, out, kw, args.device, args.repeats)
                saved.write_text(json.dumps(measured[s]))
        except (ServerError, Exception) as exc:  # noqa: BLE001 - a setting that fails is reported, not fatal
            print(f"  {s.label()}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            return
        ph = measured[s].get("phases") or [measured[s]["servers"][0]["single"]]
        figures = ", ".join(
            f"B={p['concurrency']} {p['output_tokens_per_s']:.4g} tok/s (runs {_spread(p)}), accept length "
            f"{p['accept_length']:.3f}"
            for p in ph
        )
        print(f"  {s.label()}: {figures} ({time.time() - t:.0f} s)", flush=True)

    print("[2] calibration (steps/topk/draft tokens), sglang's serving benchmark:", flush=True)
    for s in CALIBRATION:
        serve(s)
    calib_args = []
    for s in CALIBRATION:
        if s not in measured:
            continue
        for i, ph in enumerate(measured[s].get("phases") or [measured[s]["servers"][0]["single"]]):
            f = out / f"calib-{s.label().replace('/', '-')}-{i}.json"
            f.write_text(json.dumps({"servers": [{"single": ph}]}))
            calib_args += ["--calibration", f"{s.steps},{s.topk},{s.draft_tokens}={f}"]

    print("[3] eagle3-patches tune:", flush=True)
    cmd = [
        sys.executable,
        "-m",
        "eagle3_patches",
        "tune",
        "--draft",
        str(draft),
        "--target",
        str(target),
        "--data",
        str(data),
        *calib_args,
        "--batch-sizes",
        args.batch_sizes,
        "--plot",
        str(out / "tune.svg"),
    ]
    human = subprocess.run(cmd, capture_output=True, text=True)
    if human.returncode:
        print(human.stderr[-3000:])
        return 1
    print("\n".join("  " + line for line in human.stdout.splitlines()), flush=True)
    report = json.loads(subprocess.run([*cmd, "--json"], capture_output=True, text=True, check=True).stdout)
    predicted = {
        int(b): {tune.Setting(r["steps"], r["topk"], r["draft_tokens"]): r for r in rows}
        for b, rows in report["batches"].items()
    }
    recommended = {
        int(b): tune.Setting(r["steps"], r["topk"], r["draft_tokens"]) for b, r in report["recommended"].items()
    }

    print("[4] the evaluation settings and the recommended ones, sglang's serving benchmark:", flush=True)
    for s in [*EVALUATION, *recommended.values()]:
        if s not in measured:
            serve(s)

    print("\n[5] predicted against measured (sglang's serving benchmark, output tokens/s):")
    summary = {}
    for i, b in enumerate(batches):
        rows = []
        for s, m in sorted(measured.items()):
            ph = (m.get("phases") or [m["servers"][0]["single"]])[i]
            rows.append(
                (
                    s,
                    predicted[b][s]["tokens_per_s"],
                    ph["output_tokens_per_s"],
                    predicted[b][s]["accept_length"],
                    ph["accept_length"],
                    ph,
                )
            )
        print(f"  batch size {b}:")
        print(
            f"    {'setting':<10} {'pred tok/s':>10} {'meas tok/s':>10} {'runs':>13} {'pred acc':>9} "
            f"{'meas acc':>9}  fit"
        )
        for s, p, m, pa, ma, ph in rows:
            fit_mark = "calibration" if s in CALIBRATION else ""
            print(f"    {s.label():<10} {p:>10.4g} {m:>10.4g} {_spread(ph):>13} {pa:>9.3f} {ma or 0:>9.3f}  {fit_mark}")
        widths = [
            (max(r[5]["runs_tokens_per_s"]) - min(r[5]["runs_tokens_per_s"])) / r[2]
            for r in rows
            if len(r[5].get("runs_tokens_per_s") or []) > 1
        ]
        if widths:
            rates = [r[2] for r in rows]
            print(
                f"    run-to-run spread of a setting (max - min over its median): median "
                f"{statistics.median(widths):.0%}, largest {max(widths):.0%}; the settings' measured tok/s span "
                f"{min(rates):.4g}-{max(rates):.4g}"
            )
        rho = tune.spearman([r[1] for r in rows], [r[2] for r in rows])
        held = [r for r in rows if r[0] not in CALIBRATION]
        rho_held = tune.spearman([r[1] for r in held], [r[2] for r in held]) if len(held) > 2 else float("nan")
        best = max(rows, key=lambda r: r[2])
        rec = next((r for r in rows if r[0] == recommended[b]), None)
        ratio = rec[2] / best[2] if rec else float("nan")
        print(
            f"    Spearman rank correlation, predicted vs measured tok/s: {rho:.2f} over {len(rows)} settings, "
            f"{rho_held:.2f} over the {len(held)} not calibrated on"
        )
        print(
            f"    recommended {recommended[b].label()}: measured {rec[2] if rec else float('nan'):.4g} tok/s, "
            f"{ratio:.0%} of the best measured ({best[0].label()}, {best[2]:.4g} tok/s)"
        )
        tree = [r for r in rows if r[0].topk > 1 and r[4]]
        if tree:
            err = max(abs(r[3] - r[4]) for r in tree)
            print(
                f"    topk > 1: predicted (the draft's tree on the dump) vs sglang's accept length: largest "
                f"difference {err:.3f} over {len(tree)} settings"
            )
        summary[b] = {
            "spearman": rho,
            "spearman_held_out": rho_held,
            "recommended_over_best": ratio,
            "run_spread_median": statistics.median(widths) if widths else None,
        }
    print(f"\nreports, logs and the plot: {out} ({time.time() - t0:.0f} s in all)")
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
