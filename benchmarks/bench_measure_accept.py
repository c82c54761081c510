"""Benchmark: ``eagle3-patches measure-accept``'s draft forward at a real drafter's size, on synthetic target states.

The draft is random, with the shapes of the published Kimi-K2.5 EAGLE-3 drafter (AQ-MedAI/Kimi-K25-eagle3, its
``config.json`` on the Hugging Face hub: ``LlamaForCausalLMEagle3``, hidden 7168, 64 heads of 128 (64 kv heads),
intermediate 18432, draft vocabulary 32000 over the target's 163840, aux layers [2, 30, 58] so ``fc`` 21504 -> 7168,
rope_theta 1e6, rms_norm_eps 1e-6, bfloat16): 1.19 billion parameters, the target's embedding aside.  Per sequence
length it times ``DraftForward.predict`` over one sequence (3 steps, the spec v1 worker's positions: what the replay
runs per sequence) and reports tokens per second and the peak memory above the weights.

The baseline, measured in the same run on the same device and dtype: one plain ``[L, 14336] @ [14336, 8192]`` matmul
(the q projection's shape), whose FLOP rate is what the forward's matrix products could reach at best; the forward's
FLOPs are counted from the shapes (the matrix products and the attention; norms, RoPE and softmax left out), so
``of matmul`` is the forward's FLOP rate over the plain matmul's.

Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` above what the weights hold; on the CPU the process's peak
RSS (``ru_maxrss``) above the RSS once the weights are built, lengths measured in ascending order (a running peak).

    python benchmarks/bench_measure_accept.py [--device cpu|cuda[:N]] [--dtype float32|bfloat16|float16]
        [--lengths 128,512,2048] [--embed-rows N] [--repeat 1]

It needs torch and this repository only (no sglang, no safetensors).  ``--embed-rows`` shrinks the target
embedding the draft looks its tokens up in (163840 rows by default): a lookup costs the same whatever the rows, so
on a small machine the figures hold with fewer.  Not a timed test: it prints its figures.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eagle3_patches.acceptance.draft_reference import DraftForward, DraftShape  # noqa: E402

#: AQ-MedAI/Kimi-K25-eagle3 config.json
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER = 7168, 64, 64, 128, 18432
DRAFT_VOCAB, VOCAB, AUX = 32000, 163840, 3
STEPS = 3


def build(device, dtype, embed_rows: int) -> DraftForward:
    import torch

    H, q, kv = HIDDEN, HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    shapes = {
        "fc.weight": (H, AUX * H),
        "midlayer.self_attn.q_proj.weight": (q, 2 * H),
        "midlayer.self_attn.k_proj.weight": (kv, 2 * H),
        "midlayer.self_attn.v_proj.weight": (kv, 2 * H),
        "midlayer.self_attn.o_proj.weight": (H, q),
        "midlayer.mlp.gate_proj.weight": (INTER, H),
        "midlayer.mlp.up_proj.weight": (INTER, H),
        "midlayer.mlp.down_proj.weight": (H, INTER),
        "lm_head.weight": (DRAFT_VOCAB, H),
    }
    g = torch.Generator(device=device).manual_seed(0)
    params = {n: torch.empty(s, device=device, dtype=dtype).normal_(0, 0.02, generator=g) for n, s in shapes.items()}
    for n in ("input_layernorm", "post_attention_layernorm", "hidden_norm"):
        params[f"midlayer.{n}.weight"] = torch.ones(H, device=device, dtype=dtype)
    params["norm.weight"] = torch.ones(H, device=device, dtype=dtype)
    embed = torch.empty(embed_rows, H, device=device, dtype=dtype).normal_(0, 1.0, generator=g)
    return DraftForward(params, embed, DraftShape(H, HEADS, KV_HEADS, HEAD_DIM, 1e-6, 1e6))


def forward_flops(L: int) -> float:
    """The matrix products and the attention of ``STEPS`` steps over a sequence of ``L`` tokens."""
    H, q, kv = HIDDEN, HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    per_row = 2 * (2 * H * (q + 2 * kv) + q * H + 3 * H * INTER + H * DRAFT_VOCAB)  # qkv, o, mlp, lm_head
    total = 2 * AUX * H * H * (L - 1)  # fc, step 1 only
    for step in range(1, STEPS + 1):
        n = L - step
        keys = n * (n + 1) / 2 + n * (step - 1)  # causal over the step-1 keys, plus the chain
        total += per_row * n + 4 * HEADS * HEAD_DIM * keys
    return total


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_rate(device, dtype, L: int, repeat: int) -> float:
    """FLOP/s of one plain [L, 2H] @ [2H, heads * head_dim] matmul."""
    import torch

    a = torch.randn(L, 2 * HIDDEN, device=device, dtype=dtype)
    b = torch.randn(2 * HIDDEN, HEADS * HEAD_DIM, device=device, dtype=dtype)
    a @ b
    sync(device)
    t = time.perf_counter()
    for _ in range(repeat):
        a @ b
    sync(device)
    return 2 * L * 2 * HIDDEN * HEADS * HEAD_DIM * repeat / (time.perf_counter() - t)


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def main() -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", help="cpu, cuda or cuda:N (default: the first GPU, else the CPU)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--lengths", default="128,512,2048", help="sequence lengths, comma-separated, ascending")
    ap.add_argument("--embed-rows", type=int, default=VOCAB, help=f"rows of the target embedding ({VOCAB})")
    ap.add_argument("--repeat", type=int, default=1, help="timed runs per length (the best is kept)")
    args = ap.parse_args()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, args.dtype)
    lengths = sorted(int(x) for x in args.lengths.split(","))

    t0 = time.perf_counter()
    forward = build(device, dtype, args.embed_rows)
    sync(device)
    built = time.perf_counter() - t0
    weights = sum(p.numel() for n, p in forward.params.items())
    base = torch.cuda.memory_allocated(device) if device.type == "cuda" else current_rss_mb()
    print(
        f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}, "
        f"{torch.get_num_threads()} threads), {args.dtype}, draft {weights / 1e9:.2f}B parameters + embedding "
        f"{args.embed_rows} x {HIDDEN}, built in {built:.0f} s",
        flush=True,
    )
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        w = torch.randint(args.embed_rows, (16,), generator=g)
        forward.predict(w, torch.randn(16, AUX * HIDDEN, generator=g), STEPS)  # warm-up
        rows = []
        for L in lengths:
            tokens = torch.randint(args.embed_rows, (L,), generator=g)
            aux = torch.randn(L, AUX * HIDDEN, generator=g).to(device=device, dtype=dtype)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            best = float("inf")
            for _ in range(args.repeat):
                sync(device)
                t = time.perf_counter()
                forward.predict(tokens, aux, STEPS)
                sync(device)
                best = min(best, time.perf_counter() - t)
            if device.type == "cuda":
                peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20
            else:
                peak = rss_mb() - base
            mm = matmul_rate(device, dtype, L, max(1, args.repeat))
            rate = forward_flops(L) / best
            row = {
                "length": L,
                "seconds": round(best, 3),
                "tokens_per_s": round(L / best, 1),
                "peak_mb_above_weights": round(peak),
                "forward_tflops": round(rate / 1e12, 3),
                "matmul_tflops": round(mm / 1e12, 3),
                "of_matmul": round(rate / mm, 2),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    per_token = sum(r["seconds"] for r in rows) / sum(r["length"] for r in rows)
    print(f"1M tokens at these lengths' mean rate: {per_token * 1e6 / 3600:.2f} h (forward only)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
