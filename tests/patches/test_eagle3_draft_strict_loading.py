"""eagle3_draft_strict_loading: layers.0.* loads into midlayer; unknown / missing / bad d2t refused."""

from __future__ import annotations

import json

import pytest
import torch
from support.releases import only_release

from eagle3_patches.selftest import PASSED
from eagle3_patches.selftest.checkpoints import draft_variant
from eagle3_patches.selftest.checks import REFUSED_FOR
from eagle3_patches.selftest.scenarios import bit_exact_mismatches, differing_tensors
from eagle3_patches.testing import tiny_models as tm
from eagle3_patches.testing.isolation import run_isolated
from eagle3_patches.testing.sglang_harness import load_drafts

pytestmark = pytest.mark.sglang
PATCH = ["eagle3_draft_strict_loading"]


@pytest.fixture(scope="module")
def check(run_check):
    """The selftest check: every draft of ``STRICT_DRAFTS`` loaded into a real draft ModelRunner, stock and patched."""
    return run_check("eagle3_draft_strict_loading")


@pytest.fixture(scope="module")
def drafts(check):
    return check.observations["paths"]


@pytest.fixture(scope="module")
def stock(check):
    return check.observations["stock_by_name"]


@pytest.fixture(scope="module")
def patched(check):
    return check.observations["patched_by_name"]


@pytest.mark.stock
@only_release("<0.5.12", "0.5.12 loads layers.0.* natively")
def test_stock_drops_layers0_midlayer_silently(stock, drafts):
    """The bug on 0.5.9: a speculators-named draft 'loads' with its midlayer at random init."""
    assert stock["layers0_draft"]["ok"]
    mismatched = bit_exact_mismatches(stock["layers0_draft"]["params"], drafts["layers0_draft"])
    assert any("midlayer" in n for n in mismatched)
    assert all(stock[n]["ok"] for n in REFUSED_FOR)  # every bad draft: silent


def test_the_check_passes(check):
    assert check.status == PASSED, check.reason


def test_patched_loads_layers0_bit_exactly_into_midlayer(patched, drafts):
    assert patched["layers0_draft"]["ok"], patched["layers0_draft"]
    assert bit_exact_mismatches(patched["layers0_draft"]["params"], drafts["layers0_draft"]) == []


def test_patched_correct_draft_loads_silently(patched, drafts):
    assert patched["midlayer_draft"]["ok"], patched["midlayer_draft"]
    assert bit_exact_mismatches(patched["midlayer_draft"]["params"], drafts["midlayer_draft"]) == []
    hot = tm.hot_token_ids(tm.VOCAB, tm.DRAFT_VOCAB)
    assert torch.equal(patched["midlayer_draft"]["hot_token_id"], hot)


def test_full_vocab_draft_without_d2t_loads(patched):
    assert patched["full_vocab_draft"]["ok"], patched["full_vocab_draft"]
    assert patched["full_vocab_draft"]["hot_token_id"] is None


@pytest.mark.parametrize(
    "variant, needle",
    [
        ("unknown_key_draft", "1 tensor(s) sglang would drop silently: input_norm.weight"),  # one is enough
        ("unknown_key_draft", "norm_before_fc"),
        ("missing_tensor_draft", "mlp.down_proj.weight"),
        ("d2t_absolute_draft", "absolute target ids"),
        ("d2t_twice_draft", "arange subtracted twice"),
    ],
)
def test_patched_refuses_bad_checkpoint_naming_the_key(patched, drafts, variant, needle):
    result = patched[variant]
    assert not result["ok"]
    assert result["type"] == "Eagle3ConfigError"
    assert needle in result["message"]
    assert str(drafts[variant]) in result["message"]  # says which checkpoint
    assert "check the checkpoint with `eagle3-patches doctor --draft PATH`" in result["message"]  # and how to look


def _load_then_update(target: str, first: str, second: str):
    """The draft loaded as the server loads it, then its weights loaded again from another checkpoint, as
    ``update_weights_from_disk`` does: the parameters as the second load leaves them."""
    from safetensors.torch import load_file

    from eagle3_patches.testing import sglang_harness as h

    sa = h.eagle3_server_args(target, first)
    tr = h.model_runner(sa)
    dr = h.draft_runner(sa, tr, model_path=first)
    dr.model.load_weights(iter(load_file(f"{second}/model.safetensors").items()))
    return {n: p.detach().clone() for n, p in dr.model.named_parameters()}


def test_patched_draft_takes_a_weight_update_bit_exactly(tiny, tiny_root, drafts):
    """The loaders the strict load wraps are put back as they were: a second load_weights (a weight update)
    loads every tensor of the new checkpoint."""
    update = draft_variant(tiny_root / "strict-loading-update", "update", spec=tm.TinyDraftSpec(seed=7))
    params = run_isolated(
        _load_then_update, str(tiny["deepseek_v3"]), str(drafts["midlayer_draft"]), str(update), patches=PATCH
    )
    assert bit_exact_mismatches(params, update) == []
    assert bit_exact_mismatches(params, drafts["midlayer_draft"])  # the update really differs from the first load


def test_patched_refuses_a_draft_without_its_lm_head(tiny, tiny_root):
    """draft_vocab_size < vocab_size: the draft's own head is required (sglang takes the target's only when
    asked to); stock sglang leaves it at its initial value."""
    no_head = draft_variant(tiny_root / "strict-loading-no-head", "no-head", edit=lambda t: t.pop("lm_head.weight"))
    (result,) = run_isolated(load_drafts, str(tiny["deepseek_v3"]), [str(no_head)], patches=PATCH)
    assert not result["ok"] and result["type"] == "Eagle3ConfigError"
    assert "left at their initial value: lm_head.weight" in result["message"], result["message"]


@pytest.mark.stock
def test_stock_loads_a_draft_without_its_lm_head_silently(tiny, tiny_root):
    no_head = draft_variant(
        tiny_root / "strict-loading-no-head-stock", "no-head", edit=lambda t: t.pop("lm_head.weight")
    )
    (result,) = run_isolated(load_drafts, str(tiny["deepseek_v3"]), [str(no_head)])
    assert result["ok"]


# --------------------------------------------------------------------------- quantized drafts
# A draft stock sglang serves correctly must never be refused: the quantization methods add
# parameters (fp8's kv-cache scales, weight / input scales, compressed-tensors' packed weights)
# and sglang's loader fills them, or leaves them to the method's defaults.  Stock and patched load
# the same tensors into the same parameters (compared as `load_weights` leaves them, before the
# method's `process_weights_after_loading`, which needs CUDA kernels for some of them).
QUANTIZED = {
    "online-fp8": ("midlayer", {"speculative_draft_model_quantization": "fp8"}),  # --quantization fp8
    "online-fp8-kv-scales": ("kv_scales", {"speculative_draft_model_quantization": "fp8"}),
    "online-fp8-kv-scale-deprecated": ("kv_scale_deprecated", {"speculative_draft_model_quantization": "fp8"}),
    "unquantized-kv-scales": ("kv_scales", {}),  # scales with nothing to hold them: ignored, as sglang ignores them
    "fp8-checkpoint": ("fp8", {}),
    "compressed-tensors-w8a8-fp8": ("w8a8-fp8", {}),
    "compressed-tensors-w4a16": ("w4a16", {}),  # Kimi-K2.5's own format
    "tied-with-lm-head": ("tied", {}),
    "online-fp8-unknown-key": ("unknown", {"speculative_draft_model_quantization": "fp8"}),
    "missing-v-shard": ("missing_v", {}),
    "missing-q-k-shards": ("missing_q_k", {}),
    "pre-fused-projections": ("fused", {}),  # qkv_proj / gate_up_proj as sglang's own state dict names them
    "head-from-target": ("head_from_target", {}),  # no draft_vocab_size: sglang takes the target's lm_head
    "two-missing": ("two_missing", {}),
    "prefixed-absolute-d2t": ("prefixed_d2t", {}),  # sglang takes any name holding "d2t" as the d2t
    "thirteen-unknown-keys": ("thirteen_unknown", {}),
}
STRAY = [f"stray_{i:02d}.weight" for i in range(13)]
K_SCALE, V_SCALE = 0.125, 0.25


@pytest.fixture(scope="module")
def quantized_drafts(tiny_root, drafts):
    import torch

    from eagle3_patches.testing import quantized_drafts as qd

    root = tiny_root / "strict-loading-quantized"

    def kv_scales(t):  # the spellings sglang's maybe_remap_kv_scale_name knows (modelopt: under k_proj/v_proj)
        t["midlayer.self_attn.k_proj.k_scale"] = torch.tensor(K_SCALE)
        t["midlayer.self_attn.v_proj.v_scale"] = torch.tensor(V_SCALE)

    def tied(t):  # a tied draft that still carries its lm_head (and an embedding of the full vocabulary)
        t["lm_head.weight"] = torch.zeros(tm.VOCAB, tm.HIDDEN)

    def fused(t):
        m = "midlayer."
        t[m + "self_attn.qkv_proj.weight"] = torch.cat([t.pop(f"{m}self_attn.{p}_proj.weight") for p in "qkv"])
        t[m + "mlp.gate_up_proj.weight"] = torch.cat([t.pop(f"{m}mlp.{p}_proj.weight") for p in ("gate", "up")])

    def prefixed_absolute_d2t(t):
        del t["d2t"]
        t["model.d2t"] = tm.hot_token_ids(tm.VOCAB, tm.DRAFT_VOCAB).to(torch.int64)  # target ids, not offsets

    head_spec = tm.TinyDraftSpec(draft_vocab=tm.VOCAB, extra_config={"draft_vocab_size": None})
    tied_spec = tm.TinyDraftSpec(draft_vocab=tm.VOCAB, extra_config={"tie_word_embeddings": True})
    built = {
        "midlayer": drafts["midlayer_draft"],
        "unknown": drafts["unknown_key_draft"],
        "kv_scales": draft_variant(root, "kv-scales", edit=kv_scales),
        "kv_scale_deprecated": draft_variant(
            root, "kv-scale-deprecated", edit=lambda t: t.update({"midlayer.self_attn.kv_scale": torch.tensor(K_SCALE)})
        ),
        "tied": draft_variant(root, "tied", spec=tied_spec, edit=tied),
        "missing_v": draft_variant(root, "missing-v", edit=lambda t: t.pop("midlayer.self_attn.v_proj.weight")),
        "missing_q_k": draft_variant(
            root, "missing-q-k", edit=lambda t: [t.pop(f"midlayer.self_attn.{p}_proj.weight") for p in "qk"]
        ),
        "fused": draft_variant(root, "fused", edit=fused),
        "prefixed_d2t": draft_variant(root, "prefixed-d2t", edit=prefixed_absolute_d2t),
        "head_from_target": draft_variant(
            root, "head-from-target", spec=head_spec, edit=lambda t: t.pop("lm_head.weight")
        ),
        "two_missing": draft_variant(
            root,
            "two-missing",
            edit=lambda t: [t.pop(f"midlayer.{n}.weight") for n in ("self_attn.o_proj", "mlp.down_proj")],
        ),
        "thirteen_unknown": draft_variant(
            root, "thirteen-unknown", edit=lambda t: t.update({n: torch.ones(4) for n in STRAY})
        ),
    }
    for kind in qd.QUANT_CONFIGS:
        built[kind] = qd.build_quantized_draft(root / kind, kind)
    return built


def _canonical(params: dict | None) -> dict | None:
    """Parameter names as sglang <= 0.5.11 spells them: sglang >= 0.5.12 names the decoder layer layers.0."""
    return None if params is None else {n.replace("model.layers.0.", "model.midlayer."): v for n, v in params.items()}


def _load_quantized(target: str, drafts: list, server_args: dict):
    import torch

    # compressed-tensors asks for the GPU generation before it builds a layer: an H200's (sm90)
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    return load_drafts(target, drafts, dtype="bfloat16", **server_args)


def _load_quantized_variants(tiny, quantized_drafts, patches):
    """One process per set of server arguments (a launch's flags: sglang >= 0.5.23 resolves them once)."""
    out = {}
    for flags in {json.dumps(args, sort_keys=True) for _, args in QUANTIZED.values()}:
        cases = [c for c, (_, args) in QUANTIZED.items() if json.dumps(args, sort_keys=True) == flags]
        drafts = [str(quantized_drafts[QUANTIZED[c][0]]) for c in cases]
        results = run_isolated(_load_quantized, str(tiny["deepseek_v3"]), drafts, json.loads(flags), patches=patches)
        out.update(
            {
                c: dict(r, loaded=_canonical(r["loaded"]), loaders=_canonical(r["loaders"]))
                for c, r in zip(cases, results)
            }
        )
    return out


@pytest.fixture(scope="module")
def quantized_stock(tiny, quantized_drafts):
    return _load_quantized_variants(tiny, quantized_drafts, None)


@pytest.fixture(scope="module")
def quantized_patched(tiny, quantized_drafts):
    return _load_quantized_variants(tiny, quantized_drafts, PATCH)


@pytest.mark.parametrize(
    "case",
    [
        "online-fp8",
        "fp8-checkpoint",
        "compressed-tensors-w8a8-fp8",
        "compressed-tensors-w4a16",
        "tied-with-lm-head",
        "unquantized-kv-scales",
        "pre-fused-projections",
        "head-from-target",
    ],
)
def test_patched_loads_what_stock_serves_identically(quantized_stock, quantized_patched, case):
    stock, patched = quantized_stock[case], quantized_patched[case]
    assert stock["loaded"] is not None, stock  # stock sglang loads the draft ...
    assert patched.get("type") != "Eagle3ConfigError", patched["message"]  # ... and the patch set does not refuse it
    assert (patched["ok"], patched.get("type")) == (stock["ok"], stock.get("type"))  # the same end (CPU kernels)
    unset = (
        {"lm_head.weight"} if case == "head-from-target" else set()
    )  # at its init: the worker sets the target's later
    assert [n for n in differing_tensors(stock["loaded"], patched["loaded"]) if n not in unset] == []


def test_quantized_drafts_really_are_quantized(quantized_patched):
    """The cases above exercise the quantization methods' own parameters, not plain weights."""
    import torch

    loaded = {c: quantized_patched[c]["loaded"] for c in QUANTIZED if quantized_patched[c]["loaded"] is not None}
    qkv = "model.midlayer.self_attn.qkv_proj."
    assert "model.midlayer.self_attn.attn.k_scale" in loaded["online-fp8"]
    assert loaded["fp8-checkpoint"][qkv + "weight"].dtype == torch.float8_e4m3fn
    assert loaded["fp8-checkpoint"][qkv + "input_scale"].shape == (3,)  # one per q/k/v shard
    assert loaded["compressed-tensors-w8a8-fp8"][qkv + "weight_scale"].shape[1] == 1  # per channel
    assert loaded["compressed-tensors-w4a16"][qkv + "weight_packed"].dtype == torch.int32
    assert qkv + "weight" not in loaded["compressed-tensors-w4a16"]


@pytest.mark.stock
def test_stock_drops_kv_scales_under_their_checkpoint_spellings(quantized_stock):
    loaded = quantized_stock["online-fp8-kv-scales"]["loaded"]
    assert float(loaded["model.midlayer.self_attn.attn.k_scale"]) == -1.0  # BaseKVCacheMethod's "not loaded"
    assert float(loaded["model.midlayer.self_attn.attn.v_scale"]) == -1.0


@pytest.mark.parametrize(
    "case, k, v", [("online-fp8-kv-scales", K_SCALE, V_SCALE), ("online-fp8-kv-scale-deprecated", K_SCALE, -1.0)]
)
def test_patched_loads_kv_scales_as_sglangs_llama_loader_maps_them(quantized_patched, case, k, v):
    """`k_proj.k_scale` / `kv_scale` land in the attention's k/v scales (a lone kv_scale is duplicated into
    v_scale by sglang's BaseKVCacheMethod after loading), where stock dropped them."""
    result = quantized_patched[case]
    assert result.get("type") != "Eagle3ConfigError", result.get("message")
    loaded = result["loaded"]
    assert float(loaded["model.midlayer.self_attn.attn.k_scale"]) == k
    assert float(loaded["model.midlayer.self_attn.attn.v_scale"]) == v


def test_patched_still_refuses_unknown_keys_under_quantization(quantized_patched):
    result = quantized_patched["online-fp8-unknown-key"]
    assert result["type"] == "Eagle3ConfigError"
    assert "input_norm.weight" in result["message"] and "k_scale" not in result["message"]


@pytest.mark.stock
def test_stock_loads_a_draft_missing_one_fused_shard_silently(quantized_stock):
    assert quantized_stock["missing-v-shard"]["ok"]


@pytest.mark.parametrize("case", ["missing-v-shard", "missing-q-k-shards"])
def test_patched_names_the_missing_shard_of_a_fused_parameter(quantized_patched, case):
    result = quantized_patched[case]
    assert result["type"] == "Eagle3ConfigError"
    shards = "v" if case == "missing-v-shard" else "qk"
    for shard in "qkv":
        assert (f"qkv_proj.weight (shard '{shard}')" in result["message"]) == (shard in shards), result["message"]


def test_patched_names_twelve_of_the_tensors_it_would_drop(quantized_patched):
    message = quantized_patched["thirteen-unknown-keys"]["message"]
    assert "13 tensor(s) sglang would drop silently: " in message, message
    listed = message.split("13 tensor(s) sglang would drop silently: ")[1].splitlines()[0].split(";")[0]
    assert listed == ", ".join(STRAY[:12]) + " ...", listed


@pytest.mark.parametrize("case", [c for c in QUANTIZED if c != "online-fp8-unknown-key"])
def test_patched_leaves_each_parameter_the_weight_loader_stock_leaves(quantized_stock, quantized_patched, case):
    """The strict load records through the parameters' weight loaders and puts each back as it found it (an
    attribute it added is removed): a later load (a weight update, a second draft) meets sglang's own loaders."""
    stock, patched = quantized_stock[case], quantized_patched[case]
    if patched["loaders"] is None:  # refused: nothing was left behind to compare
        assert patched["type"] == "Eagle3ConfigError"
        return
    assert patched["loaders"] == stock["loaders"]
    assert None in stock["loaders"].values()  # a parameter sglang loads with its default loader (fc: an nn.Linear)


@pytest.mark.runtime_only  # the fork diff's copy logs through sglang's logger, not eagle3_patches'
@pytest.mark.parametrize(
    "case, needle",
    [
        ("tied-with-lm-head", "lm_head.weight (tie_word_embeddings"),
        ("unquantized-kv-scales", "k_proj.k_scale (a kv-cache scale"),
        ("online-fp8", None),
        ("compressed-tensors-w4a16", None),
    ],
)
def test_patched_logs_the_tensors_ignored_as_sglang_ignores_them(quantized_patched, case, needle):
    ignored = [
        line for line in quantized_patched[case]["log"] if "ignored as sglang's Llama loader ignores them" in line
    ]
    if needle is None:
        assert ignored == []
    else:
        assert len(ignored) == 1 and needle in ignored[0], quantized_patched[case]["log"]


def test_patched_names_every_parameter_left_unloaded(quantized_patched):
    message = quantized_patched["two-missing"]["message"]
    assert "left at their initial value: " in message, message
    assert "self_attn.o_proj.weight" in message and "mlp.down_proj.weight" in message, message


@pytest.mark.parametrize("variant", ["d2t_absolute_draft", "d2t_twice_draft"])
def test_patched_refuses_a_bad_d2t_for_itself_alone(patched, drafts, variant):
    """The rest of the draft still loads: the refusal names the d2t, not parameters left unloaded after it."""
    from safetensors.torch import load_file

    from eagle3_patches.checkpoint.d2t import check_d2t

    message = patched[variant]["message"]
    assert "d2t: " in message and "left at their initial value" not in message and "drop silently" not in message, (
        message
    )
    problem = check_d2t(
        load_file(f"{drafts[variant]}/model.safetensors")["d2t"], target_vocab=tm.VOCAB, draft_vocab=tm.DRAFT_VOCAB
    )
    assert problem.what in message  # the d2t checker's own words


def test_patched_gives_the_d2t_checkers_remedy(patched, drafts):
    """(absolute ids: the one remedy the fork diff's copy of the checker words as the library does)"""
    from safetensors.torch import load_file

    from eagle3_patches.checkpoint.d2t import check_d2t

    d2t = load_file(f"{drafts['d2t_absolute_draft']}/model.safetensors")["d2t"]
    problem = check_d2t(d2t, target_vocab=tm.VOCAB, draft_vocab=tm.DRAFT_VOCAB)
    assert problem.fix in patched["d2t_absolute_draft"]["message"]


@pytest.mark.stock
def test_stock_loads_a_prefixed_absolute_d2t_as_offsets(quantized_stock):
    assert quantized_stock["prefixed-absolute-d2t"]["ok"]  # every proposal off, silently


def test_patched_checks_a_d2t_under_a_prefix_as_sglang_loads_it(quantized_patched):
    result = quantized_patched["prefixed-absolute-d2t"]
    assert result["type"] == "Eagle3ConfigError" and "absolute target ids" in result["message"], result
