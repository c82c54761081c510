"""Benchmark: converting a Kimi-K2.5-sized speculators draft.  Goals: throughput >= 0.5x `cp`
of the same bytes (in the same run), peak RSS < 1.5 GB.

The source is a speculators-format EAGLE-3 draft with SpecForge's Kimi-K2.5 dimensions
(hidden 7168, 64 heads of 128, intermediate 18432, vocab 163840, draft vocab 32000, aux ids
[3, 31, 59] in speculators' meaning), one ``model.safetensors`` with real bytes (a random
block repeated; ``d2t`` / ``t2d`` are a real vocabulary map): about 4.7 GB with
``embed_tokens.weight`` (speculators saves it), 2.4 GB with ``--no-embed``.

Each round runs ``cp`` of the source file followed by ``sync`` of the copy (the converter
fsyncs its output) and ``eagle3-patches convert`` in a fresh process, in alternating order,
after a ``sync``; outputs are removed in between.  The convert process reports its own peak
RSS (``VmHWM``): ``wait4``'s ``ru_maxrss`` would carry this benchmark's own peak (torch, the
64 MB block) into the child across fork + exec.

    python benchmarks/bench_convert.py [--no-embed] [--rounds 3] [--workdir DIR] [--hidden 7168 ...]

Not a timed test: it prints its figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eagle3_patches.checkpoint.safetensors_header import alignment_order, encode_header  # noqa: E402

BLOCK = 64 << 20


def build_source(
    root: Path, *, hidden: int, heads: int, head_dim: int, inter: int, vocab: int, draft_vocab: int, embed: bool
) -> int:
    import torch

    from eagle3_patches.testing.tiny_models import hot_token_ids

    root.mkdir(parents=True)
    layer = {
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_theta": 50000.0, "rope_type": "default"},
        "tie_word_embeddings": False,
    }
    cfg = {
        "architectures": ["Eagle3DraftModel"],
        "auto_map": {"": "config.Eagle3SpeculatorConfig"},
        "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0",
        "dtype": "bfloat16",
        "draft_vocab_size": draft_vocab,
        "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": [3, 31, 59],
        "norm_before_residual": False,
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_output": False,
        "embed_requires_grad": False,
        "tie_word_embeddings": False,
        "transformer_layer_config": layer,
        "speculators_config": {
            "algorithm": "eagle3",
            "verifier": {"name_or_path": "moonshotai/Kimi-K2.5", "architectures": ["KimiK25ForConditionalGeneration"]},
        },
    }
    (root / "config.json").write_text(json.dumps(cfg, indent=2))
    (root / "config.py").write_text("raise SystemExit('speculators config class: never executed')\n")
    a, m = "layers.0.self_attn.", "layers.0.mlp."
    entries = [
        ("fc.weight", "BF16", [hidden, 3 * hidden]),
        (a + "q_proj.weight", "BF16", [heads * head_dim, 2 * hidden]),
        (a + "k_proj.weight", "BF16", [heads * head_dim, 2 * hidden]),
        (a + "v_proj.weight", "BF16", [heads * head_dim, 2 * hidden]),
        (a + "o_proj.weight", "BF16", [hidden, heads * head_dim]),
        (m + "gate_proj.weight", "BF16", [inter, hidden]),
        (m + "up_proj.weight", "BF16", [inter, hidden]),
        (m + "down_proj.weight", "BF16", [hidden, inter]),
        ("layers.0.input_layernorm.weight", "BF16", [hidden]),
        ("layers.0.post_attention_layernorm.weight", "BF16", [hidden]),
        ("layers.0.hidden_norm.weight", "BF16", [hidden]),
        ("norm.weight", "BF16", [hidden]),
        ("lm_head.weight", "BF16", [draft_vocab, hidden]),
        ("d2t", "I64", [draft_vocab]),
        ("t2d", "BOOL", [vocab]),
    ]
    if embed:
        entries.append(("embed_tokens.weight", "BF16", [vocab, hidden]))
    entries = alignment_order(entries)
    header, offsets = encode_header(entries, {"format": "pt"})
    hot = hot_token_ids(vocab, draft_vocab)
    d2t = (hot - torch.arange(draft_vocab)).to(torch.int64).numpy().tobytes()
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[hot] = True
    special = {"d2t": d2t, "t2d": t2d.numpy().tobytes()}
    block = os.urandom(BLOCK)
    with open(root / "model.safetensors", "wb") as f:
        f.write(header)
        for name, _, _ in entries:
            b, e = offsets[name]
            if name in special:
                f.write(special[name])
                continue
            n = e - b
            while n:
                k = min(n, BLOCK)
                f.write(block[:k])
                n -= k
        f.flush()
        os.fsync(f.fileno())
    return (root / "model.safetensors").stat().st_size


def run_child(cmd: list[str]) -> tuple[float, str]:
    """Run ``cmd``; return (wall seconds, stdout)."""
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:3]} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return wall, proc.stdout


CONVERT = (
    "import json,sys,time;t=time.perf_counter();"
    "from eagle3_patches.convert import convert;"
    "r=convert(sys.argv[1],sys.argv[2],progress=False,sglang_version='0.5.9');"
    "hwm=[int(l.split()[1])*1024 for l in open('/proc/self/status') if l.startswith('VmHWM:')][0];"
    "print(json.dumps({'seconds':time.perf_counter()-t,'bytes':r.bytes_copied,'ok':r.report.ok,'files':len(r.files),'peak':hwm}))"
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--no-embed", action="store_true", help="leave embed_tokens.weight out of the source (2.4 GB instead of 4.7 GB)"
    )
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--intermediate", type=int, default=18432)
    ap.add_argument("--vocab", type=int, default=163840)
    ap.add_argument("--draft-vocab", type=int, default=32000)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-convert-", dir=args.workdir))
    try:
        t0 = time.perf_counter()
        src = work / "draft-speculators"
        size = build_source(
            src,
            hidden=args.hidden,
            heads=args.heads,
            head_dim=args.head_dim,
            inter=args.intermediate,
            vocab=args.vocab,
            draft_vocab=args.draft_vocab,
            embed=not args.no_embed,
        )
        print(
            f"source: {size / 1e9:.2f} GB speculators draft (hidden {args.hidden}, vocab {args.vocab}, draft vocab "
            f"{args.draft_vocab}), "
            f"written in {time.perf_counter() - t0:.1f} s"
        )
        cps, convs, rss = [], [], []

        def run_cp() -> float:
            cp_dir = work / "cp"
            cp_dir.mkdir()
            target = cp_dir / "model.safetensors"
            t = time.perf_counter()
            subprocess.run(["cp", str(src / "model.safetensors"), str(target)], check=True)
            subprocess.run(["sync", str(target)], check=True)
            dt = time.perf_counter() - t
            shutil.rmtree(cp_dir)
            return dt

        def run_convert() -> tuple[float, float, int]:
            dst = work / "draft-sglang"
            wall, out = run_child([sys.executable, "-P", "-c", CONVERT, str(src), str(dst)])
            info = json.loads(out.strip().splitlines()[-1])
            assert info["ok"] and info["bytes"] <= size
            shutil.rmtree(dst)
            return wall, info["seconds"], info["peak"]

        for r in range(args.rounds):
            # alternate the order, and let writeback settle before each timed copy (a shared virtual disk is noisy)
            order = ("cp", "convert") if r % 2 == 0 else ("convert", "cp")
            for what in order:
                os.sync()
                time.sleep(1)
                if what == "cp":
                    cps.append(run_cp())
                else:
                    wall, inner, peak = run_convert()
                    convs.append((wall, inner))
                    rss.append(peak)
            print(
                f"round {r + 1}: cp+sync {cps[-1]:.2f} s ({size / cps[-1] / 1e9:.2f} GB/s); convert "
                f"{convs[-1][1]:.2f} s in process, "
                f"{convs[-1][0]:.2f} s wall with interpreter start ({size / convs[-1][0] / 1e9:.2f} GB/s), ratio "
                f"{cps[-1] / convs[-1][0]:.2f}x, "
                f"peak RSS {rss[-1] / 1e6:.0f} MB"
            )
        ratios = sorted(c / v[0] for c, v in zip(cps, convs))
        median = ratios[len(ratios) // 2]
        best = min(cps) / min(v[0] for v in convs)
        peak = max(rss)
        print()
        print(
            "throughput vs cp (wall, including interpreter start and the doctor's checks): median of rounds "
            f"{median:.2f}x, "
            f"best-of {best:.2f}x [goal >= 0.5x: {'met' if median >= 0.5 else 'NOT met'}]"
        )
        print(
            f"peak RSS of the convert process: {peak / 1e6:.0f} MB [goal < 1500 MB: "
            f"{'met' if peak < 1.5e9 else 'NOT met'}]"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
