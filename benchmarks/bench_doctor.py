"""Benchmark: the doctor's complete check on a Kimi-K2.5-sized target and draft.  Goal: < 1 s.

The target is 64 sparse safetensors shards holding the tensor names and shapes of a
61-layer, 384-expert Kimi-K2.5 (DeepSeek-V3 text model under ``language_model.``, routed
experts as compressed-tensors INT4 ``weight_packed`` / ``weight_scale`` / ``weight_shape``,
a MoonViT tower), about 200k tensors and 0.6 TB declared, plus its index.  Each shard is its
header followed by a hole (``truncate``), so no disk space is used.  The draft has SpecForge's
Kimi-K2.5 dimensions (hidden 7168, vocab 163840, draft vocab 32000, aux ids [2, 30, 58]); only
its ``d2t`` / ``t2d`` hold real bytes.

    python benchmarks/bench_doctor.py [--workdir DIR] [--keep]

Prints: tensors and bytes declared; the doctor's wall time for its (default, complete) check:
every shard header validated by the safetensors library, the whole index checked against
them (in process after imports, best of 3; and a cold CLI-style process); bytes read (the
doctor's own counter and /proc/self/io rchar); and, as baselines measured in the same run,
the floor any complete check has to pay: ``safetensors.safe_open`` on every shard plus
``json.loads`` of the index, and merely reading those bytes.  Not a timed test.
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

H, LAYERS, EXPERTS, VOCAB, DRAFT_VOCAB = 7168, 61, 384, 163840, 32000
MOE_I, DENSE_I, Q_LORA, KV_LORA, ROPE, NOPE, V_HEAD, HEADS = 2048, 18432, 1536, 512, 64, 128, 128, 64
SHARDS = 64


def kimi_config() -> dict:
    text = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "kimi_k2",
        "vocab_size": VOCAB,
        "hidden_size": H,
        "intermediate_size": DENSE_I,
        "moe_intermediate_size": MOE_I,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "n_shared_experts": 1,
        "n_routed_experts": EXPERTS,
        "num_experts_per_tok": 8,
        "routed_scaling_factor": 2.827,
        "kv_lora_rank": KV_LORA,
        "q_lora_rank": Q_LORA,
        "qk_rope_head_dim": ROPE,
        "qk_nope_head_dim": NOPE,
        "v_head_dim": V_HEAD,
        "n_group": 1,
        "topk_group": 1,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "hidden_act": "silu",
        "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-5,
        "rope_theta": 50000.0,
        "rope_scaling": {
            "type": "yarn",
            "factor": 64.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {"num_bits": 4, "group_size": 32, "symmetric": True, "type": "int", "strategy": "group"},
                }
            },
            "ignore": [
                "lm_head",
                "re:.*self_attn.*",
                "re:.*shared_experts.*",
                "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
            ],
        },
    }
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": text,
        "vision_config": {
            "patch_size": 14,
            "hidden_size": 1152,
            "vt_hidden_size": 1152,
            "num_hidden_layers": 27,
            "mm_hidden_size": 1152,
            "text_hidden_size": H,
        },
        "media_placeholder_token_id": 163605,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
    }


def kimi_tensors() -> list[tuple[str, str, list[int]]]:
    p = "language_model.model."
    t = [(p + "embed_tokens.weight", "BF16", [VOCAB, H])]
    for i in range(LAYERS):
        lp = f"{p}layers.{i}."
        a = lp + "self_attn."
        t += [
            (lp + "input_layernorm.weight", "BF16", [H]),
            (lp + "post_attention_layernorm.weight", "BF16", [H]),
            (a + "q_a_proj.weight", "BF16", [Q_LORA, H]),
            (a + "q_a_layernorm.weight", "BF16", [Q_LORA]),
            (a + "q_b_proj.weight", "BF16", [HEADS * (NOPE + ROPE), Q_LORA]),
            (a + "kv_a_proj_with_mqa.weight", "BF16", [KV_LORA + ROPE, H]),
            (a + "kv_a_layernorm.weight", "BF16", [KV_LORA]),
            (a + "kv_b_proj.weight", "BF16", [HEADS * (NOPE + V_HEAD), KV_LORA]),
            (a + "o_proj.weight", "BF16", [H, HEADS * V_HEAD]),
        ]
        m = lp + "mlp."
        if i == 0:
            t += [
                (m + "gate_proj.weight", "BF16", [DENSE_I, H]),
                (m + "up_proj.weight", "BF16", [DENSE_I, H]),
                (m + "down_proj.weight", "BF16", [H, DENSE_I]),
            ]
            continue
        t += [(m + "gate.weight", "BF16", [EXPERTS, H]), (m + "gate.e_score_correction_bias", "F32", [EXPERTS])]
        for j in range(EXPERTS):
            e = f"{m}experts.{j}."
            for proj, (rows, cols) in (("gate_proj", (MOE_I, H)), ("up_proj", (MOE_I, H)), ("down_proj", (H, MOE_I))):
                t += [
                    (e + proj + ".weight_packed", "I32", [rows, cols // 8]),
                    (e + proj + ".weight_scale", "BF16", [rows, cols // 32]),
                    (e + proj + ".weight_shape", "I32", [2]),
                ]
        s = m + "shared_experts."
        t += [
            (s + "gate_proj.weight", "BF16", [MOE_I, H]),
            (s + "up_proj.weight", "BF16", [MOE_I, H]),
            (s + "down_proj.weight", "BF16", [H, MOE_I]),
        ]
    t += [(p + "norm.weight", "BF16", [H]), ("language_model.lm_head.weight", "BF16", [VOCAB, H])]
    v = "vision_tower."
    t += [(v + "patch_embed.proj.weight", "BF16", [1152, 3, 14, 14]), (v + "patch_embed.proj.bias", "BF16", [1152])]
    for b in range(27):
        bp = f"{v}encoder.blocks.{b}."
        t += [
            (bp + "wqkv.weight", "BF16", [3 * 1152, 1152]),
            (bp + "wqkv.bias", "BF16", [3 * 1152]),
            (bp + "wo.weight", "BF16", [1152, 1152]),
            (bp + "wo.bias", "BF16", [1152]),
            (bp + "mlp.fc0.weight", "BF16", [4304, 1152]),
            (bp + "mlp.fc0.bias", "BF16", [4304]),
            (bp + "mlp.fc1.weight", "BF16", [1152, 4304]),
            (bp + "mlp.fc1.bias", "BF16", [1152]),
            (bp + "norm0.weight", "BF16", [1152]),
            (bp + "norm0.bias", "BF16", [1152]),
            (bp + "norm1.weight", "BF16", [1152]),
            (bp + "norm1.bias", "BF16", [1152]),
        ]
    t += [("mm_projector.proj.0.weight", "BF16", [4608, 4608]), ("mm_projector.proj.2.weight", "BF16", [H, 4608])]
    return t


def write_sparse(path: Path, entries, payload: dict[str, bytes] | None = None) -> int:
    """A safetensors file whose data region is a hole, except ``payload`` tensors. Returns the declared size."""
    header, offsets = encode_header(entries, {"format": "pt"})
    data_len = max((e for _, e in offsets.values()), default=0)
    with open(path, "wb") as f:
        f.write(header)
        for name, raw in (payload or {}).items():
            b, e = offsets[name]
            assert len(raw) == e - b, name
            f.seek(len(header) + b)
            f.write(raw)
        f.truncate(len(header) + data_len)
    return len(header) + data_len


def build_target(root: Path) -> tuple[int, int]:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(kimi_config(), indent=2))
    tensors = kimi_tensors()
    per = -(-len(tensors) // SHARDS)
    weight_map, declared = {}, 0
    for s in range(SHARDS):
        part = tensors[s * per : (s + 1) * per]
        name = f"model-{s + 1:05d}-of-{SHARDS:06d}.safetensors"
        declared += write_sparse(root / name, part)
        weight_map.update({n: name for n, _, _ in part})
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": declared}, "weight_map": weight_map}, indent=2)
    )
    return len(tensors), declared


def build_draft(root: Path) -> int:
    import torch

    from eagle3_patches.testing.tiny_models import hot_token_ids

    root.mkdir(parents=True)
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": H,
        "intermediate_size": DENSE_I,
        "num_attention_heads": 64,
        "num_key_value_heads": 64,
        "head_dim": 128,
        "num_hidden_layers": 1,
        "vocab_size": VOCAB,
        "draft_vocab_size": DRAFT_VOCAB,
        "target_hidden_size": H,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 50000.0,
        "max_position_embeddings": 262144,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": [2, 30, 58],
            "use_aux_hidden_state": True,
            "eagle3_patches_layer_id_convention": "output-of-layer",
        },
    }
    (root / "config.json").write_text(json.dumps(cfg, indent=2))
    hot = hot_token_ids(VOCAB, DRAFT_VOCAB)
    d2t = (hot - torch.arange(DRAFT_VOCAB)).to(torch.int64)
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[hot] = True
    m = "midlayer."
    entries = [
        ("fc.weight", "BF16", [H, 3 * H]),
        (m + "self_attn.q_proj.weight", "BF16", [64 * 128, 2 * H]),
        (m + "self_attn.k_proj.weight", "BF16", [64 * 128, 2 * H]),
        (m + "self_attn.v_proj.weight", "BF16", [64 * 128, 2 * H]),
        (m + "self_attn.o_proj.weight", "BF16", [H, 64 * 128]),
        (m + "mlp.gate_proj.weight", "BF16", [DENSE_I, H]),
        (m + "mlp.up_proj.weight", "BF16", [DENSE_I, H]),
        (m + "mlp.down_proj.weight", "BF16", [H, DENSE_I]),
        (m + "input_layernorm.weight", "BF16", [H]),
        (m + "post_attention_layernorm.weight", "BF16", [H]),
        (m + "hidden_norm.weight", "BF16", [H]),
        ("norm.weight", "BF16", [H]),
        ("lm_head.weight", "BF16", [DRAFT_VOCAB, H]),
        ("d2t", "I64", [DRAFT_VOCAB]),
        ("t2d", "BOOL", [VOCAB]),
    ]
    payload = {"d2t": d2t.numpy().tobytes(), "t2d": t2d.numpy().tobytes()}
    return write_sparse(root / "model.safetensors", alignment_order(entries), payload)


def rchar() -> int:
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("rchar:"):
                return int(line.split()[1])
    except OSError:
        pass
    return -1


def measure(target: Path, draft: Path, launch: list[str]):
    from eagle3_patches.doctor import doctor

    best = None
    for _ in range(3):
        r0 = rchar()
        t0 = time.perf_counter()
        report = doctor(target, draft, sglang_version="0.5.9", launch=launch)
        dt = time.perf_counter() - t0
        if best is None or dt < best[1]:
            best = (report, dt, rchar() - r0)
    return best


def floors(target: Path) -> tuple[float, float]:
    """(library floor, read floor) in seconds, best of 3: what any complete check has to pay."""
    from safetensors import safe_open

    files = sorted(target.glob("*.safetensors"))
    index = target / "model.safetensors.index.json"
    lib = read = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for f in files:
            with safe_open(str(f), framework="numpy") as h:
                h.keys()
        json.loads(index.read_bytes())
        lib = min(lib, time.perf_counter() - t0)
        t0 = time.perf_counter()
        for f in files:
            with open(f, "rb") as fh:
                fh.read(8 + int.from_bytes(fh.read(8), "little"))
        index.read_bytes()
        read = min(read, time.perf_counter() - t0)
    return lib, read


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, help="where to build the sparse checkpoints (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the built checkpoints")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-doctor-", dir=args.workdir))
    try:
        t0 = time.perf_counter()
        n_tensors, declared = build_target(work / "Kimi-K2.5")
        draft_declared = build_draft(work / "Kimi-K2.5-eagle3")
        build_s = time.perf_counter() - t0
        disk = sum(os.stat(p).st_blocks * 512 for p in work.rglob("*") if p.is_file())
        index_mb = (work / "Kimi-K2.5" / "model.safetensors.index.json").stat().st_size / 1e6
        print(
            f"built in {build_s:.1f} s: target {n_tensors} tensors in {SHARDS} shards, {declared / 1e12:.3f} TB "
            "declared "
            f"(index {index_mb:.1f} MB); draft {draft_declared / 1e9:.2f} GB declared; {disk / 1e6:.1f} MB on disk"
        )

        # warm the imports (the patch registry) as a long-lived process would have them
        import eagle3_patches

        eagle3_patches.get_registry()
        launch = [
            "eagle3-patches",
            "run",
            "--",
            "python",
            "-m",
            "sglang.launch_server",
            "--tp",
            "8",
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-num-steps",
            "3",
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            "4",
        ]
        target, draft = work / "Kimi-K2.5", work / "Kimi-K2.5-eagle3"
        report, dt, io = measure(target, draft, launch)
        print()
        print(report.format(show_info=False))
        print()
        lib, read = floors(target)
        print(
            f"doctor, complete check (every header + whole index; in process, imports warm, best of 3): {dt:.3f} s, "
            f"{report.facts['target_headers_read']}, doctor-counted read {report.facts['bytes_read'] / 1e6:.1f} MB, "
            f"rchar {io / 1e6:.1f} MB"
            f"   [goal < 1 s: {'met' if dt < 1 else 'NOT met'}]"
        )
        print(
            f"  baselines in this run: safetensors.safe_open on every shard + json.loads of the index {lib:.3f} s "
            f"(doctor / library floor = {dt / lib:.2f}x); reading those bytes {read:.3f} s (doctor / read = "
            f"{dt / read:.1f}x)"
        )

        cold = (
            "import sys,time,json;t=time.perf_counter();"
            "from eagle3_patches.doctor import doctor;"
            f"r=doctor({str(target)!r},{str(draft)!r},sglang_version='0.5.9',launch={launch!r});"
            "print(json.dumps([time.perf_counter()-t, r.facts['bytes_read'], r.exit_code]))"
        )
        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-P", "-c", cold],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=True,
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])),
            },
        ).stdout
        wall = time.perf_counter() - t0
        inner, read_b, rc = json.loads(out.strip().splitlines()[-1])
        print(
            f"doctor, complete check in a cold process (interpreter + imports + doctor, no torch): {wall:.2f} s wall, "
            f"{inner:.2f} s after interpreter start, exit {rc}"
        )
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
