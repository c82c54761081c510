"""The one map from a draft checkpoint's tensor names to sglang's (``checkpoint/draft_names.py``), which the doctor,
the converter and measure-accept share: each name as sglang's ``LlamaForCausalLMEagle3.load_weights`` reads it."""

from __future__ import annotations

import pytest

from eagle3_patches.checkpoint.draft_names import draft_tensor_name


@pytest.mark.parametrize(
    ("raw", "name", "naming"),
    [
        ("fc.weight", "fc.weight", "sglang"),
        ("model.fc.weight", "fc.weight", "model-prefix"),  # sglang tries the name, then model. + it
        ("model.norm.weight", "norm.weight", "model-prefix"),  # a name after the head's in sort order too
        ("midlayer.self_attn.qkv_proj.weight", "midlayer.self_attn.qkv_proj.weight", "sglang"),
        ("layers.0.mlp.down_proj.weight", "midlayer.mlp.down_proj.weight", "speculators"),
        ("model.layers.0.input_layernorm.weight", "midlayer.input_layernorm.weight", "speculators"),
        ("model.layers.1.mlp.down_proj.weight", "layers.1.mlp.down_proj.weight", "model-prefix"),  # not the one layer
        ("lm_head.weight", "lm_head.weight", "sglang"),
        ("model.lm_head.weight", "model.lm_head.weight", "sglang"),  # looked up as model.model.lm_head: dropped
        ("d2t", "d2t", "map"),
        ("model.d2t", "d2t", "map"),  # sglang: any name holding d2t
        ("t2d", "t2d", "map"),
    ],
)
def test_each_draft_tensor_name_reaches_the_parameter_sglang_loads_it_into(raw, name, naming):
    assert draft_tensor_name(raw) == (name, naming)
