"""Tiny, deterministic checkpoints for tests and the CPU demo (no model hub).

* :func:`build_deepseek_v3` - a 6-layer DeepSeek-V3 text model (MLA, MoE with a
  shared expert, noaux_tc routing), the architecture of Kimi-K2.5's language model.
* :func:`build_kimi_k25` - ``KimiK25ForConditionalGeneration``: the same text
  model under ``language_model.`` plus a 1-layer MoonViT ``vision_config``.
* :func:`build_eagle3_draft` - an EAGLE-3 draft in SGLang format
  (``LlamaForCausalLMEagle3``, ``midlayer.*``, ``d2t``/``t2d``, ``eagle_config``)
  whose hidden size equals the target's, as for Kimi-K2.5 and its drafters (this
  equality is what lets sglang's fc skip stay silent).
* :func:`build_speculators_draft` - the same draft as ``speculators`` saves it
  (``layers.0.*``, ``transformer_layer_config``, ``speculators_model_type``).

Each builder writes ``config.json``, ``model.safetensors`` and a tiny WordLevel
tokenizer, and is a pure function of its arguments (same bytes every time).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

HIDDEN = 64
VOCAB = 1024
NUM_LAYERS = 6
DRAFT_VOCAB = 256
#: sglang <= 0.5.12 convention: id i captures the output of layer i (see docs/checkpoints.md)
DRAFT_AUX_IDS = (1, 2, 3)


@dataclass(frozen=True)
class TinyTargetSpec:
    hidden: int = HIDDEN
    vocab: int = VOCAB
    num_layers: int = NUM_LAYERS
    num_heads: int = 4
    n_routed_experts: int = 8
    moe_intermediate_size: int = 32
    intermediate_size: int = 128
    seed: int = 0
    q_lora_rank: int | None = 48  # None: a plain q_proj (Kimi-VL / Moonlight)

    def text_config(self) -> dict:
        return {
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "deepseek_v3",
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate_size,
            "moe_intermediate_size": self.moe_intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_heads,
            "n_shared_experts": 1,
            "n_routed_experts": self.n_routed_experts,
            "num_experts_per_tok": 2,
            "routed_scaling_factor": 2.5,
            "kv_lora_rank": 32,
            "q_lora_rank": self.q_lora_rank,
            "qk_rope_head_dim": 16,
            "qk_nope_head_dim": 16,
            "v_head_dim": 16,
            "n_group": 1,
            "topk_group": 1,
            "first_k_dense_replace": 1,
            "moe_layer_freq": 1,
            "topk_method": "noaux_tc",
            "scoring_func": "sigmoid",
            "norm_topk_prob": True,
            "hidden_act": "silu",
            "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            # sglang's CPU rope asserts yarn scaling
            "rope_scaling": {
                "type": "yarn",
                "rope_type": "yarn",
                "factor": 1.0,
                "original_max_position_embeddings": 2048,
                "beta_fast": 32,
                "beta_slow": 1,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
            },
            "attention_bias": False,
            "attention_dropout": 0.0,
            "tie_word_embeddings": False,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 0,
            "initializer_range": 0.02,
            "torch_dtype": "bfloat16",
        }


@dataclass(frozen=True)
class TinyDraftSpec:
    hidden: int = HIDDEN
    target_hidden: int = HIDDEN
    vocab: int = VOCAB
    draft_vocab: int = DRAFT_VOCAB
    aux_ids: tuple[int, ...] = DRAFT_AUX_IDS
    num_heads: int = 4
    num_kv_heads: int = 4
    intermediate_size: int = 128
    seed: int = 1
    extra_config: dict = field(default_factory=dict)

    def llama_config(self) -> dict:
        return {
            "model_type": "llama",
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": 1,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.hidden // self.num_heads,
            "hidden_act": "silu",
            "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "rope_scaling": None,
            "tie_word_embeddings": False,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 0,
            "torch_dtype": "bfloat16",
        }


# --------------------------------------------------------------------------- tensors
def _generator(seed: int):
    import torch

    return torch.Generator().manual_seed(seed)


def _rand(gen, *shape, std: float = 0.05):
    import torch

    return (torch.randn(*shape, generator=gen) * std).to(torch.bfloat16)


def _ones(*shape):
    import torch

    return torch.ones(*shape, dtype=torch.bfloat16)


def deepseek_v3_tensors(spec: TinyTargetSpec, prefix: str = "") -> dict:
    """HF DeepSeek-V3 tensor names and shapes, random bf16 values from ``spec.seed``."""
    gen = _generator(spec.seed)
    h, nh = spec.hidden, spec.num_heads
    qk_head = 16 + 16
    t = {f"{prefix}model.embed_tokens.weight": _rand(gen, spec.vocab, h, std=0.5)}
    for i in range(spec.num_layers):
        p = f"{prefix}model.layers.{i}."
        t[p + "input_layernorm.weight"] = _ones(h)
        t[p + "post_attention_layernorm.weight"] = _ones(h)
        a = p + "self_attn."
        if spec.q_lora_rank is None:
            t[a + "q_proj.weight"] = _rand(gen, nh * qk_head, h)
        else:
            t[a + "q_a_proj.weight"] = _rand(gen, spec.q_lora_rank, h)
            t[a + "q_a_layernorm.weight"] = _ones(spec.q_lora_rank)
            t[a + "q_b_proj.weight"] = _rand(gen, nh * qk_head, spec.q_lora_rank)
        t[a + "kv_a_proj_with_mqa.weight"] = _rand(gen, 32 + 16, h)
        t[a + "kv_a_layernorm.weight"] = _ones(32)
        t[a + "kv_b_proj.weight"] = _rand(gen, nh * (16 + 16), 32)
        t[a + "o_proj.weight"] = _rand(gen, h, nh * 16)
        m = p + "mlp."
        if i < 1:  # first_k_dense_replace
            t[m + "gate_proj.weight"] = _rand(gen, spec.intermediate_size, h)
            t[m + "up_proj.weight"] = _rand(gen, spec.intermediate_size, h)
            t[m + "down_proj.weight"] = _rand(gen, h, spec.intermediate_size)
        else:
            e, mi = spec.n_routed_experts, spec.moe_intermediate_size
            t[m + "gate.weight"] = _rand(gen, e, h)
            t[m + "gate.e_score_correction_bias"] = _rand(gen, e).float()
            for j in range(e):
                t[m + f"experts.{j}.gate_proj.weight"] = _rand(gen, mi, h)
                t[m + f"experts.{j}.up_proj.weight"] = _rand(gen, mi, h)
                t[m + f"experts.{j}.down_proj.weight"] = _rand(gen, h, mi)
            t[m + "shared_experts.gate_proj.weight"] = _rand(gen, mi, h)
            t[m + "shared_experts.up_proj.weight"] = _rand(gen, mi, h)
            t[m + "shared_experts.down_proj.weight"] = _rand(gen, h, mi)
    t[f"{prefix}model.norm.weight"] = _ones(h)
    t[f"{prefix}lm_head.weight"] = _rand(gen, spec.vocab, h, std=0.5)
    return t


def hot_token_ids(vocab: int, draft_vocab: int, seed: int = 7):
    """The target ids of the draft vocabulary: a sorted, deterministic, non-contiguous subset."""
    import torch

    perm = torch.randperm(vocab, generator=_generator(seed))
    return torch.sort(perm[:draft_vocab]).values


def eagle3_draft_tensors(spec: TinyDraftSpec, *, midlayer_prefix: str = "midlayer.") -> dict:
    import torch

    gen = _generator(spec.seed)
    h, k = spec.hidden, len(spec.aux_ids)
    hd = h // spec.num_heads
    m = midlayer_prefix
    t = {
        "fc.weight": _rand(gen, h, k * spec.target_hidden),
        m + "self_attn.q_proj.weight": _rand(gen, spec.num_heads * hd, 2 * h),
        m + "self_attn.k_proj.weight": _rand(gen, spec.num_kv_heads * hd, 2 * h),
        m + "self_attn.v_proj.weight": _rand(gen, spec.num_kv_heads * hd, 2 * h),
        m + "self_attn.o_proj.weight": _rand(gen, h, spec.num_heads * hd),
        m + "mlp.gate_proj.weight": _rand(gen, spec.intermediate_size, h),
        m + "mlp.up_proj.weight": _rand(gen, spec.intermediate_size, h),
        m + "mlp.down_proj.weight": _rand(gen, h, spec.intermediate_size),
        m + "input_layernorm.weight": _ones(h),
        m + "post_attention_layernorm.weight": _ones(h),
        m + "hidden_norm.weight": _ones(h),
        "norm.weight": _ones(h),
        "lm_head.weight": _rand(gen, spec.draft_vocab, h, std=0.5),
    }
    if spec.draft_vocab < spec.vocab:
        hot = hot_token_ids(spec.vocab, spec.draft_vocab)
        t["d2t"] = (hot - torch.arange(spec.draft_vocab)).to(torch.int64)
        t2d = torch.zeros(spec.vocab, dtype=torch.bool)
        t2d[hot] = True
        t["t2d"] = t2d
    return t


# --------------------------------------------------------------------------- files
def write_tokenizer(path: Path, vocab: int) -> None:
    """A WordLevel tokenizer: ``<pad> <s> </s> <unk>`` then words ``t4 .. t{vocab-1}``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    words.update({f"t{i}": i for i in range(4, vocab)})
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    from tokenizers import decoders

    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "pad_token": "<pad>",
                "model_max_length": 2048,
                "add_bos_token": False,
            },
            indent=1,
        )
    )
    (path / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"})
    )


def write_checkpoint(path: Path, config: dict, tensors: dict, vocab: int) -> Path:
    """Write atomically: a temp dir renamed into place, so a half-built fixture never exists."""
    from safetensors.torch import save_file

    path = Path(path)
    if (path / "config.json").exists():
        return path
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    save_file({k: v.contiguous() for k, v in sorted(tensors.items())}, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    write_tokenizer(tmp, vocab)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(tmp, path)
    except OSError:  # built concurrently by another process: keep theirs
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return path


def build_deepseek_v3(path: os.PathLike, spec: TinyTargetSpec = TinyTargetSpec()) -> Path:
    return write_checkpoint(Path(path), spec.text_config(), deepseek_v3_tensors(spec), spec.vocab)


def kimi_k25_config(spec: TinyTargetSpec = TinyTargetSpec()) -> dict:
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": spec.text_config(),
        "vision_config": {
            "patch_size": 14,
            "init_pos_emb_height": 8,
            "init_pos_emb_width": 8,
            "init_pos_emb_time": 4,
            "num_attention_heads": 2,
            "num_hidden_layers": 1,
            "hidden_size": 32,
            "vt_hidden_size": 32,
            "vt_num_attention_heads": 2,
            "vt_num_hidden_layers": 1,
            "intermediate_size": 64,
            "vt_intermediate_size": 64,
            "merge_kernel_size": [2, 2],
            "mm_hidden_size": 32,
            "text_hidden_size": spec.hidden,
        },
        "media_placeholder_token_id": spec.vocab - 1,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
    }


def kimi_vl_config(spec: TinyTargetSpec = TinyTargetSpec(q_lora_rank=None)) -> dict:
    """Kimi-VL: the tiny DeepSeek text model (sglang runs it as DeepseekV2ForCausalLM) and the same MoonViT."""
    k25 = kimi_k25_config(spec)
    vision = {k: v for k, v in k25["vision_config"].items() if not k.startswith(("vt_", "mm_", "text_"))}
    return {
        "architectures": ["KimiVLForConditionalGeneration"],
        "model_type": "kimi_vl",
        "text_config": spec.text_config(),
        "vision_config": vision,
        "media_placeholder_token_id": spec.vocab - 1,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
    }


def build_kimi_vl(path: os.PathLike, spec: TinyTargetSpec = TinyTargetSpec(q_lora_rank=None)) -> Path:
    return write_checkpoint(Path(path), kimi_vl_config(spec), deepseek_v3_tensors(spec, prefix="language_model."), spec.vocab)


def build_kimi_k25(path: os.PathLike, spec: TinyTargetSpec = TinyTargetSpec()) -> Path:
    """The text weights under ``language_model.``; the (unused) vision tower keeps sglang's init."""
    return write_checkpoint(Path(path), kimi_k25_config(spec), deepseek_v3_tensors(spec, prefix="language_model."), spec.vocab)


def eagle3_draft_config(spec: TinyDraftSpec = TinyDraftSpec()) -> dict:
    cfg = spec.llama_config()
    cfg.update(
        {
            "architectures": ["LlamaForCausalLMEagle3"],
            "draft_vocab_size": spec.draft_vocab,
            "target_hidden_size": spec.target_hidden,
            "eagle_config": {
                "eagle_aux_hidden_state_layer_ids": list(spec.aux_ids),
                "use_aux_hidden_state": True,
            },
        }
    )
    cfg.update(spec.extra_config)
    return cfg


def build_eagle3_draft(path: os.PathLike, spec: TinyDraftSpec = TinyDraftSpec(), tensors: dict | None = None) -> Path:
    return write_checkpoint(Path(path), eagle3_draft_config(spec), tensors or eagle3_draft_tensors(spec), spec.vocab)


def speculators_config(spec: TinyDraftSpec = TinyDraftSpec(), verifier: str = "tiny-kimi-k25") -> dict:
    """``config.json`` as speculators 0.9 ``save_pretrained`` writes it (see docs/checkpoints.md)."""
    layer = spec.llama_config()
    layer.pop("torch_dtype")
    layer["rope_parameters"] = {"rope_theta": layer.pop("rope_theta"), "rope_type": "default"}
    layer.pop("rope_scaling")
    return {
        "architectures": ["Eagle3DraftModel"],
        "auto_map": {"": "config.Eagle3SpeculatorConfig"},
        "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0",
        "dtype": "bfloat16",
        "draft_vocab_size": spec.draft_vocab,
        "target_hidden_size": spec.target_hidden,
        # speculators' meaning: id N = the input of layer N (HF hidden_states[N])
        "eagle_aux_hidden_state_layer_ids": [i + 1 for i in spec.aux_ids],
        "norm_before_residual": False,
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_output": False,
        "embed_requires_grad": False,
        "tie_word_embeddings": False,
        "transformer_layer_config": layer,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "verifier": {"name_or_path": verifier, "architectures": ["KimiK25ForConditionalGeneration"]},
        },
    }


def build_speculators_draft(path: os.PathLike, spec: TinyDraftSpec = TinyDraftSpec()) -> Path:
    """The same weights as :func:`build_eagle3_draft` (same seed), named as speculators saves them."""
    return write_checkpoint(
        Path(path), speculators_config(spec), eagle3_draft_tensors(spec, midlayer_prefix="layers.0."), spec.vocab
    )


def build_all(root: os.PathLike) -> dict[str, Path]:
    root = Path(root)
    return {
        "deepseek_v3": build_deepseek_v3(root / "tiny-deepseek-v3"),
        "kimi_k25": build_kimi_k25(root / "tiny-kimi-k25"),
        "draft": build_eagle3_draft(root / "tiny-eagle3-draft"),
        "speculators_draft": build_speculators_draft(root / "tiny-eagle3-draft-speculators"),
    }


def tensor_names(path: os.PathLike) -> Iterable[str]:
    from safetensors import safe_open

    with safe_open(str(Path(path) / "model.safetensors"), "pt") as f:
        return list(f.keys())


# --------------------------------------------------------------------------- trained draft
#: the tiny EAGLE-3 draft trained on the tiny Kimi-K2.5 target's greedy continuations
#: (regenerate bit for bit with ``tools/train_tiny_draft.py``; check with ``--check``)
TRAINED_DRAFT_TENSORS = Path(__file__).resolve().parent / "data" / "tiny_kimi_k25_eagle3_draft.safetensors"


def build_trained_eagle3_draft(root: os.PathLike, tensors_file: os.PathLike = TRAINED_DRAFT_TENSORS) -> Path:
    """A servable draft directory (SGLang format, float32) holding the trained tensors.

    Written to ``root/tiny-eagle3-draft-trained-<sha256 of the tensors file>``: retraining gives a
    new directory, never a stale one.
    """
    import hashlib

    from safetensors.torch import load_file

    digest = hashlib.sha256(Path(tensors_file).read_bytes()).hexdigest()[:12]
    path = Path(root) / f"tiny-eagle3-draft-trained-{digest}"
    if (path / "config.json").exists():
        return path
    tensors = load_file(str(tensors_file))
    spec = TinyDraftSpec(draft_vocab=int(tensors["lm_head.weight"].shape[0]), extra_config={"torch_dtype": "float32"})
    return write_checkpoint(path, eagle3_draft_config(spec), tensors, spec.vocab)
