"""Tiny Qwen3-VL targets (dense and MoE), built locally with transformers' own model classes.

Same text dimensions as the tiny Kimi-K2.5 / DeepSeek-V3 targets (hidden 64, 6 layers, vocabulary
1024), so the tiny EAGLE-3 drafts of :mod:`.tiny_models` (hidden 64, aux ids [1, 2, 3]) fit them;
a one-block vision tower that text prompts never run.  Weights: transformers' own random init
under a fixed seed, written by ``save_pretrained`` (so the names are the real checkpoint names; the MoE
target's fused experts in the hub layout whatever transformers wrote), then moved into place atomically with the
tiny WordLevel tokenizer.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from . import tiny_models as tm

VISION = dict(
    depth=1,
    hidden_size=32,
    intermediate_size=64,
    num_heads=2,
    in_channels=3,
    patch_size=16,
    spatial_merge_size=2,
    temporal_patch_size=2,
    out_hidden_size=tm.HIDDEN,
    num_position_embeddings=64,
    deepstack_visual_indexes=[0],
)
SPECIAL = dict(
    image_token_id=tm.VOCAB - 24,
    video_token_id=tm.VOCAB - 23,
    vision_start_token_id=tm.VOCAB - 22,
    vision_end_token_id=tm.VOCAB - 21,
)


def lacks_its_processor(model: os.PathLike | str) -> bool:
    """A multimodal checkpoint (its config has a ``vision_config``) without the processor files sglang builds
    its multimodal processor from: the tiny Kimi-K2.5 (Kimi's processor is remote code, which no tiny
    checkpoint here carries; from sglang 0.5.11 the Kimi-K2.5 processor reads its ``media_processor`` and the
    tokenizer manager fails without it) and the tiny Qwen3-VL (transformers' processor needs a real torchvision)."""
    path = Path(model)
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return "vision_config" in config and not any(
        (path / name).exists() for name in ("preprocessor_config.json", "processor_config.json")
    )


def _text_config(moe: bool) -> dict:
    cfg = dict(
        vocab_size=tm.VOCAB,
        hidden_size=tm.HIDDEN,
        intermediate_size=128,
        num_hidden_layers=tm.NUM_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True},
    )
    if moe:
        cfg.update(
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            decoder_sparse_step=1,
            norm_topk_prob=True,
            mlp_only_layers=[],
        )
    return cfg


#: written next to a MoE target whose fused experts are in the hub layout (:func:`_fused_experts_as_on_the_hub`)
HUB_LAYOUT_MARK = ".experts-hub-layout"


def _fused_experts_as_on_the_hub(directory: Path) -> None:
    """Qwen3-VL-MoE checkpoints on the hub store the fused experts as ``gate_up_proj`` ``[experts, hidden,
    2 x moe_intermediate]`` and ``down_proj`` ``[experts, moe_intermediate, hidden]`` (transformers 4.x's layout,
    the one sglang's loader transposes).  transformers 5.x keeps them transposed in memory and ``save_pretrained``
    writes them that way, which sglang cannot load (a size mismatch in the expert weight loader): put them back
    in the hub layout, whatever transformers built them."""
    import json

    from safetensors.torch import load_file, save_file

    text = json.loads((directory / "config.json").read_text())["text_config"]
    hidden, inter = text["hidden_size"], text["moe_intermediate_size"]
    for f in sorted(directory.glob("*.safetensors")):
        tensors = load_file(f)
        transposed = any(
            k.endswith("experts.down_proj") and tuple(t.shape[-2:]) == (hidden, inter) for k, t in tensors.items()
        )
        if transposed:
            tensors = {
                k: (
                    t.transpose(-1, -2).contiguous() if k.endswith(("experts.down_proj", "experts.gate_up_proj")) else t
                )
                for k, t in tensors.items()
            }
            save_file(tensors, f, metadata={"format": "pt"})
    (directory / HUB_LAYOUT_MARK).write_text("fused experts in the hub layout\n")


def build_qwen3_vl(path: os.PathLike, *, moe: bool = False, seed: int = 0) -> Path:
    """``Qwen3VLForConditionalGeneration`` (``moe``: ``Qwen3VLMoeForConditionalGeneration``), float32."""
    import torch
    import transformers

    path = Path(path)
    if (path / "config.json").exists() and (not moe or (path / HUB_LAYOUT_MARK).exists()):
        return path
    if path.exists():  # a MoE target cached before the hub layout was enforced: built again
        shutil.rmtree(path, ignore_errors=True)
    prefix = "Qwen3VLMoe" if moe else "Qwen3VL"
    config = getattr(transformers, f"{prefix}Config")(
        text_config=_text_config(moe), vision_config=VISION, tie_word_embeddings=False, **SPECIAL
    )
    config.torch_dtype = torch.float32
    torch.manual_seed(seed)
    model = getattr(transformers, f"{prefix}ForConditionalGeneration")(config)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    model.save_pretrained(tmp, safe_serialization=True)
    if moe:
        _fused_experts_as_on_the_hub(tmp)
    tm.write_tokenizer(tmp, tm.VOCAB)
    try:
        os.rename(tmp, path)
    except OSError:  # built concurrently by another process: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    return path


# --------------------------------------------------------------------------- the tiny Kimi-K2.5 with images
#: the processor the image-serving tiny Kimi-K2.5 carries (its remote code, as the hub's checkpoint carries Kimi's)
PROCESSOR_SOURCE = Path(__file__).resolve().parent / "tiny_kimi_k25_processor.py"
PROCESSOR_MODULE = "processing_tiny_kimi_k25"


def kimi_k25_vision_tensors(config: dict, seed: int = 2) -> dict:
    """MoonViT and the projector of :func:`tiny_models.kimi_k25_config`'s ``vision_config``, under the hub's names
    (``wqkv`` / ``wo``, ``mm_projector.proj.0`` / ``.2``, which sglang's loader renames); random bf16 from ``seed``,
    norms at one and zero."""
    import torch

    v = config["vision_config"]
    d, ff, text = v["vt_hidden_size"], v["vt_intermediate_size"], v["text_hidden_size"]
    kh, kw = v["merge_kernel_size"]
    merged = d * kh * kw
    gen = tm._generator(seed)
    out = {
        "vision_tower.patch_embed.proj.weight": tm._rand(gen, d, 3, v["patch_size"], v["patch_size"]),
        "vision_tower.patch_embed.proj.bias": tm._rand(gen, d),
        "vision_tower.patch_embed.pos_emb.weight": tm._rand(gen, v["init_pos_emb_height"], v["init_pos_emb_width"], d),
        "vision_tower.encoder.final_layernorm.weight": tm._ones(d),
        "vision_tower.encoder.final_layernorm.bias": torch.zeros(d, dtype=torch.bfloat16),
        "mm_projector.pre_norm.weight": tm._ones(d),
        "mm_projector.pre_norm.bias": torch.zeros(d, dtype=torch.bfloat16),
        "mm_projector.proj.0.weight": tm._rand(gen, merged, merged),
        "mm_projector.proj.0.bias": tm._rand(gen, merged),
        "mm_projector.proj.2.weight": tm._rand(gen, text, merged),
        "mm_projector.proj.2.bias": tm._rand(gen, text),
    }
    for i in range(v["vt_num_hidden_layers"]):
        b = f"vision_tower.encoder.blocks.{i}."
        out.update(
            {
                b + "norm0.weight": tm._ones(d),
                b + "norm0.bias": torch.zeros(d, dtype=torch.bfloat16),
                b + "norm1.weight": tm._ones(d),
                b + "norm1.bias": torch.zeros(d, dtype=torch.bfloat16),
                b + "wqkv.weight": tm._rand(gen, 3 * d, d),
                b + "wqkv.bias": tm._rand(gen, 3 * d),
                b + "wo.weight": tm._rand(gen, d, d),
                b + "wo.bias": tm._rand(gen, d),
                b + "mlp.fc0.weight": tm._rand(gen, ff, d),
                b + "mlp.fc0.bias": tm._rand(gen, ff),
                b + "mlp.fc1.weight": tm._rand(gen, d, ff),
                b + "mlp.fc1.bias": tm._rand(gen, d),
            }
        )
    return out


def _with_processor(media_token_id: int):
    """What the image-serving checkpoint adds: its tokenizer spells ``media_token_id`` ``<|media_pad|>`` (an added
    special token, so that runs of it split), and the processor's code named by ``processor_config.json``."""

    def finish(tmp: Path) -> None:
        tok_file = tmp / "tokenizer.json"
        tok = json.loads(tok_file.read_text())
        vocab = tok["model"]["vocab"]
        word = next(w for w, i in vocab.items() if i == media_token_id)
        vocab[MEDIA_TOKEN] = vocab.pop(word)
        tok["added_tokens"] = [
            *tok.get("added_tokens", []),
            {
                "id": media_token_id,
                "content": MEDIA_TOKEN,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            },
        ]
        tok_file.write_text(json.dumps(tok))
        shutil.copyfile(PROCESSOR_SOURCE, tmp / f"{PROCESSOR_MODULE}.py")
        auto = {"AutoProcessor": f"{PROCESSOR_MODULE}.TinyKimiK25Processor"}
        (tmp / "processor_config.json").write_text(
            json.dumps({"processor_class": "TinyKimiK25Processor", "auto_map": auto}, indent=1)
        )

    return finish


MEDIA_TOKEN = "<|media_pad|>"


def build_kimi_k25_vl(path: os.PathLike, spec: tm.TinyTargetSpec | None = None) -> Path:
    """The tiny Kimi-K2.5 that serves images: :func:`tiny_models.build_kimi_k25`'s text weights (so the trained
    draft fits it), MoonViT's and the projector's weights (:func:`kimi_k25_vision_tensors`), and the tiny processor
    (:mod:`.tiny_kimi_k25_processor`, loaded with ``--trust-remote-code``)."""
    spec = spec or tm.TinyTargetSpec()
    config = tm.kimi_k25_config(spec)
    tensors = {**tm.deepseek_v3_tensors(spec, prefix="language_model."), **kimi_k25_vision_tensors(config)}
    return tm.write_checkpoint(
        Path(path), config, tensors, spec.vocab, finish=_with_processor(config["media_placeholder_token_id"])
    )


def image_data_url(width: int, height: int, seed: int) -> str:
    """A PNG of random pixels (fixed by ``seed``) as the data URL sglang's ``image_data`` takes."""
    import base64
    import io
    import random

    from PIL import Image

    rng = random.Random(seed)
    image = Image.new("RGB", (width, height))
    image.putdata([(rng.randrange(256), rng.randrange(256), rng.randrange(256)) for _ in range(width * height)])
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
