"""Tiny Qwen3-VL targets (dense and MoE), built locally with transformers' own model classes.

Same text dimensions as the tiny Kimi-K2.5 / DeepSeek-V3 targets (hidden 64, 6 layers, vocabulary
1024), so the tiny EAGLE-3 drafts of :mod:`.tiny_models` (hidden 64, aux ids [1, 2, 3]) fit them;
a one-block vision tower that text prompts never run.  Weights: transformers' own random init
under a fixed seed, written by ``save_pretrained`` (so the names are the real checkpoint names; the MoE
target's fused experts in the hub layout whatever transformers wrote), then moved into place atomically with the
tiny WordLevel tokenizer.
"""

from __future__ import annotations

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
