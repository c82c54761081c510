"""The converted draft loads into real sglang 0.5.9 ``LlamaForCausalLMEagle3`` (with eagle3-patches'
strict loading: unknown keys and unloaded parameters raise) with every parameter filled, bit-exact."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from safetensors.torch import load_file

from eagle3_patches.convert import convert
from eagle3_patches.testing import tiny_models as tm
from eagle3_patches.testing.isolation import run_isolated

pytestmark = pytest.mark.sglang

PATCH = "eagle3_draft_strict_loading"
HAVE_PATCH = importlib.util.find_spec(f"eagle3_patches.patches.{PATCH}") is not None
HAVE_SGLANG = importlib.util.find_spec("sglang") is not None


def _load_draft(target: str, drafts: list[str]) -> list[dict]:
    from eagle3_patches.testing.sglang_harness import load_drafts

    return load_drafts(target, drafts)


def _expected(path) -> dict[str, torch.Tensor]:
    """The sglang parameters the converted file must fill: q/k/v and gate/up fused as sglang fuses them."""
    t = {}
    for f in sorted(path.glob("*.safetensors")):
        t.update(load_file(str(f)))
    a, m = "midlayer.self_attn.", "midlayer.mlp."
    out = {
        "model.midlayer.self_attn.qkv_proj.weight": torch.cat(
            [t[a + "q_proj.weight"], t[a + "k_proj.weight"], t[a + "v_proj.weight"]]
        ),
        "model.midlayer.mlp.gate_up_proj.weight": torch.cat([t[m + "gate_proj.weight"], t[m + "up_proj.weight"]]),
        "lm_head.weight": t["lm_head.weight"],
    }
    for name in (
        "midlayer.self_attn.o_proj.weight",
        "midlayer.mlp.down_proj.weight",
        "midlayer.input_layernorm.weight",
        "midlayer.post_attention_layernorm.weight",
        "midlayer.hidden_norm.weight",
        "fc.weight",
        "norm.weight",
        "embed_tokens.weight",
    ):
        if name in t:
            out[f"model.{name}"] = t[name]
    return out, t


@pytest.mark.skipif(not HAVE_SGLANG, reason="sglang is not installed")
@pytest.mark.skipif(not HAVE_PATCH, reason=f"eagle3-patches' {PATCH} patch is not in this tree yet")
def test_converted_draft_loads_bit_exact_in_sglang_059(tiny, make_draft, tmp_path):
    def with_embed(t):
        t["embed_tokens.weight"] = (
            torch.randn(tm.VOCAB, tm.HIDDEN, generator=torch.Generator().manual_seed(5)) * 0.5
        ).to(torch.bfloat16)

    sources = {
        "plain": tiny["speculators_draft"],
        "sharded-with-embed": make_draft("spec-embed", speculators=True, tensors=with_embed, shards=2),
    }
    converted = {}
    for name, src in sources.items():
        converted[name] = convert(
            src, tmp_path / name, sglang_version="0.5.9", max_shard_size="64KB", progress=False
        ).dst
    results = run_isolated(_load_draft, str(tiny["deepseek_v3"]), [str(p) for p in converted.values()], patches=[PATCH])
    for (name, path), res in zip(converted.items(), results):
        assert res["ok"], f"{name}: {res}"
        params = res["params"]
        expected, raw = _expected(path)
        # every parameter filled from the file (embed_tokens only when the file has it)
        names = set(params) - ({"model.embed_tokens.weight"} if "model.embed_tokens.weight" not in expected else set())
        assert names == set(expected), f"{name}: {sorted(set(params) ^ set(expected))}"
        for pname, want in expected.items():
            got = params[pname]
            # the runner is float32 on CPU: bf16 -> f32 is exact, so compare the upcast values bit for bit
            assert torch.equal(got, want.to(got.dtype)), f"{name}: {pname}"
        hot = res["hot_token_id"]
        assert torch.equal(hot, raw["d2t"] + torch.arange(tm.DRAFT_VOCAB))
        assert torch.equal(hot, tm.hot_token_ids(tm.VOCAB, tm.DRAFT_VOCAB))
