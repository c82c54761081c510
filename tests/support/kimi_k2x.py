"""Kimi-K2.6 / Kimi-K2.7-Code at their real sizes, for the doctor: the configs with the shapes of the public ones, and
safetensors files that hold only a header (the file is as long as the tensors say, sparse: no data is written).

The targets (``moonshotai/Kimi-K2.6``, ``moonshotai/Kimi-K2.7-Code``) declare what Kimi-K2.5 declares:
``KimiK25ForConditionalGeneration`` (``model_type: kimi_k25``), a MoonViT tower and a DeepSeek-V3 text model of 61
layers (hidden 7168, 64 heads, MLA with ``q_lora_rank`` 1536 / ``kv_lora_rank`` 512 / rope 64 / nope 128 / v 128,
384 routed experts of 2048, the first layer dense of 18432, vocabulary 163840), so sglang serves them with the class
the tiny Kimi-K2.5 runs (:func:`~eagle3_patches.testing.tiny_models.kimi_k25_config`, whose tiny MoonViT is kept
here: the vision tower's sizes do not reach EAGLE-3).  The drafts: ``lightseekorg/kimi-k2.6-eagle3.1-mla`` and
``kimi-k2.7-coder-eagle3.1-mla`` (``Eagle3DeepseekV2ForCausalLM``, the target's MLA sizes, one dense layer,
``fc_norm`` and ``norm_output``; the coder draft's aux ids ``[1, 29, 57]``)."""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

from eagle3_patches.testing import tiny_models as tm

#: the text model of Kimi-K2.5, K2.6 and K2.7-Code
TARGET = tm.TinyTargetSpec(
    hidden=7168,
    vocab=163840,
    num_layers=61,
    num_heads=64,
    n_routed_experts=384,
    moe_intermediate_size=2048,
    intermediate_size=18432,
    q_lora_rank=1536,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    qk_nope_head_dim=128,
    v_head_dim=128,
)
#: the aux ids of ``kimi-k2.7-coder-eagle3.1-mla`` (its card: "target layers 1, 29, and 57")
CODER_AUX_IDS = (1, 29, 57)
EAGLE31 = {"fc_norm": True, "norm_output": True}


def draft_spec(aux_ids: tuple[int, ...] = CODER_AUX_IDS, eagle31: bool = True) -> tm.TinyDraftSpec:
    """The published MLA drafts' sizes: the target's hidden size and vocabulary (no reduced draft vocabulary)."""
    return tm.TinyDraftSpec(
        hidden=TARGET.hidden,
        target_hidden=TARGET.hidden,
        vocab=TARGET.vocab,
        draft_vocab=TARGET.vocab,
        aux_ids=aux_ids,
        num_heads=TARGET.num_heads,
        intermediate_size=TARGET.intermediate_size,
        extra_config=dict(EAGLE31) if eagle31 else {},
    )


def write_header_only(path: Path, shapes: dict[str, tuple[int, ...]]) -> Path:
    """A bf16 safetensors file of ``shapes`` whose data is a hole: the header is real, the file as long as the
    offsets say (a sparse file on the file systems that have them)."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = math.prod(shape) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        f.truncate(8 + len(raw) + offset)
    return path


def build_target(path: os.PathLike) -> Path:
    """The target's ``config.json`` and a header of its embedding and head (what the doctor reads of a target)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(tm.kimi_k25_config(TARGET)))
    h, v = TARGET.hidden, TARGET.vocab
    write_header_only(
        path / "model.safetensors",
        {"language_model.model.embed_tokens.weight": (v, h), "language_model.lm_head.weight": (v, h)},
    )
    return path


def mla_draft_shapes(draft: tm.TinyDraftSpec) -> dict[str, tuple[int, ...]]:
    """The MLA draft's tensors as the published checkpoints name them (``layers.0.*``, as
    :func:`~eagle3_patches.testing.tiny_models.mla_draft_tensors`), with ``fc_norm.<i>.weight`` where the draft sets
    ``fc_norm``."""
    s, h, nh = TARGET, draft.hidden, TARGET.num_heads
    assert s.q_lora_rank is not None
    a, m = "layers.0.self_attn.", "layers.0.mlp."
    shapes = {
        "fc.weight": (h, len(draft.aux_ids) * draft.target_hidden),
        a + "q_a_proj.weight": (s.q_lora_rank, 2 * h),
        a + "q_a_layernorm.weight": (s.q_lora_rank,),
        a + "q_b_proj.weight": (nh * (s.qk_nope_head_dim + s.qk_rope_head_dim), s.q_lora_rank),
        a + "kv_a_proj_with_mqa.weight": (s.kv_lora_rank + s.qk_rope_head_dim, 2 * h),
        a + "kv_a_layernorm.weight": (s.kv_lora_rank,),
        a + "kv_b_proj.weight": (nh * (s.qk_nope_head_dim + s.v_head_dim), s.kv_lora_rank),
        a + "o_proj.weight": (h, nh * s.v_head_dim),
        m + "gate_proj.weight": (draft.intermediate_size, h),
        m + "up_proj.weight": (draft.intermediate_size, h),
        m + "down_proj.weight": (h, draft.intermediate_size),
        "layers.0.input_layernorm.weight": (h,),
        "layers.0.hidden_norm.weight": (h,),
        "layers.0.post_attention_layernorm.weight": (h,),
        "norm.weight": (h,),
        "lm_head.weight": (draft.draft_vocab, h),
    }
    if draft.extra_config.get("fc_norm"):
        shapes |= {f"fc_norm.{i}.weight": (draft.target_hidden,) for i in range(len(draft.aux_ids))}
    return shapes


def build_mla_draft(path: os.PathLike, draft: tm.TinyDraftSpec | None = None) -> Path:
    """The MLA draft's ``config.json`` (:func:`~eagle3_patches.testing.tiny_models.mla_draft_config` at these sizes)
    and its header."""
    draft = draft or draft_spec()
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(tm.mla_draft_config(TARGET, draft)))
    write_header_only(path / "model.safetensors", mla_draft_shapes(draft))
    return path
