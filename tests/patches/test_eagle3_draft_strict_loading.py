"""eagle3_draft_strict_loading: layers.0.* loads into midlayer; unknown / missing / bad d2t refused."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from eagle3_patches.testing import tiny_models as tm
from eagle3_patches.testing.isolation import run_isolated
from eagle3_patches.testing.releases import only_release
from eagle3_patches.testing.sglang_harness import load_drafts

pytestmark = pytest.mark.sglang
PATCH = ["eagle3_draft_strict_loading"]


def _variant(root, name, *, spec=tm.TinyDraftSpec(), edit=None, prefix="midlayer."):
    tensors = tm.eagle3_draft_tensors(spec, midlayer_prefix=prefix)
    if edit:
        edit(tensors)
    return tm.build_eagle3_draft(root / name, spec, tensors=tensors)


@pytest.fixture(scope="module")
def drafts(tiny_root):
    root = tiny_root / "strict-loading"
    arange = torch.arange(tm.DRAFT_VOCAB)
    return {
        "midlayer": _variant(root, "midlayer"),
        "layers0": _variant(root, "layers0", prefix="layers.0."),
        "unknown": _variant(root, "unknown", edit=lambda t: t.update({"input_norm.weight": torch.ones(3 * tm.HIDDEN)})),
        "missing": _variant(root, "missing", edit=lambda t: t.pop("midlayer.mlp.down_proj.weight")),
        "d2t_absolute": _variant(root, "d2t-absolute", edit=lambda t: t.update(d2t=t["d2t"] + arange)),
        "d2t_twice": _variant(root, "d2t-twice", edit=lambda t: t.update(d2t=t["d2t"] - arange)),
        "full_vocab": _variant(root, "full-vocab", spec=tm.TinyDraftSpec(draft_vocab=tm.VOCAB)),
    }


def _load(tiny, drafts, patches):
    names = list(drafts)
    results = run_isolated(load_drafts, str(tiny["deepseek_v3"]), [str(drafts[n]) for n in names], patches=patches)
    return dict(zip(names, results))


def _expected_params(path) -> dict[str, torch.Tensor]:
    """What sglang's parameters must hold, from the file: q/k/v and gate/up fused as sglang fuses them."""
    t = {tm_name.replace("layers.0.", "midlayer."): v.float() for tm_name, v in load_file(str(path / "model.safetensors")).items()}
    a, m = "midlayer.self_attn.", "midlayer.mlp."
    out = {
        "model.midlayer.self_attn.qkv_proj.weight": torch.cat([t[a + "q_proj.weight"], t[a + "k_proj.weight"], t[a + "v_proj.weight"]]),
        "model.midlayer.mlp.gate_up_proj.weight": torch.cat([t[m + "gate_proj.weight"], t[m + "up_proj.weight"]]),
    }
    for name in ("midlayer.self_attn.o_proj.weight", "midlayer.mlp.down_proj.weight", "midlayer.input_layernorm.weight",
                 "midlayer.post_attention_layernorm.weight", "midlayer.hidden_norm.weight", "fc.weight", "norm.weight"):
        out[f"model.{name}"] = t[name]
    out["lm_head.weight"] = t["lm_head.weight"]
    return out


def _bit_exact(loaded: dict, path) -> list[str]:
    def param(name):  # sglang >= 0.5.12 names the decoder layer layers.0 instead of midlayer
        return name if name in loaded else name.replace("model.midlayer.", "model.layers.0.")

    return [n for n, v in _expected_params(path).items() if not torch.equal(loaded[param(n)], v)]


@pytest.fixture(scope="module")
def stock(tiny, drafts):
    return _load(tiny, drafts, None)


@pytest.fixture(scope="module")
def patched(tiny, drafts):
    return _load(tiny, drafts, PATCH)


@pytest.mark.stock
@only_release("<0.5.12", "0.5.12 loads layers.0.* natively")
def test_stock_drops_layers0_midlayer_silently(stock, drafts):
    """The bug on 0.5.9: a speculators-named draft 'loads' with its midlayer at random init."""
    assert stock["layers0"]["ok"]
    mismatched = _bit_exact(stock["layers0"]["params"], drafts["layers0"])
    assert any("midlayer" in n for n in mismatched)
    assert stock["unknown"]["ok"] and stock["missing"]["ok"] and stock["d2t_absolute"]["ok"]  # all silent


def test_patched_loads_layers0_bit_exactly_into_midlayer(patched, drafts):
    assert patched["layers0"]["ok"], patched["layers0"]
    assert _bit_exact(patched["layers0"]["params"], drafts["layers0"]) == []


def test_patched_correct_draft_loads_silently(patched, drafts):
    assert patched["midlayer"]["ok"], patched["midlayer"]
    assert _bit_exact(patched["midlayer"]["params"], drafts["midlayer"]) == []
    hot = tm.hot_token_ids(tm.VOCAB, tm.DRAFT_VOCAB)
    assert torch.equal(patched["midlayer"]["hot_token_id"], hot)


def test_full_vocab_draft_without_d2t_loads(patched):
    assert patched["full_vocab"]["ok"], patched["full_vocab"]
    assert patched["full_vocab"]["hot_token_id"] is None


@pytest.mark.parametrize(
    "variant, needle",
    [
        ("unknown", "input_norm.weight"),
        ("unknown", "norm_before_fc"),
        ("missing", "mlp.down_proj.weight"),
        ("d2t_absolute", "absolute target ids"),
        ("d2t_twice", "arange subtracted twice"),
    ],
)
def test_patched_refuses_bad_checkpoint_naming_the_key(patched, drafts, variant, needle):
    result = patched[variant]
    assert not result["ok"]
    assert result["type"] == "Eagle3ConfigError"
    assert needle in result["message"]
    assert str(drafts[variant]) in result["message"]  # says which checkpoint
