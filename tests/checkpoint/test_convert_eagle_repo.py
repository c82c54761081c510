"""``eagle3-patches convert`` on the original EAGLE repository's EAGLE-3 layout (SafeAILab/EAGLE).

The source is ``test_draft_layouts.eagle_repo_eagle3``: the layout as the repository writes it (its builder's
docstring names the files).  The expected aux ids are the repository's own capture rule, transcribed here from
``eagle/model/modeling_llama_kv.py`` (``LlamaModel.forward``: the hidden states before layer ``idx`` are kept when
``idx == len(self.layers) - 3 or idx == len(self.layers) // 2 or idx == 2``), not this library's helper.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_draft_layouts import eagle_repo_eagle, eagle_repo_eagle3

from eagle3_patches.checkpoint import draft_layouts as D
from eagle3_patches.checkpoint import layer_ids as L
from eagle3_patches.checkpoint.eagle_repo import ConvertUsageError, plan_eagle_repo
from eagle3_patches.convert import ConvertError, convert
from eagle3_patches.diagnostic import ERROR
from eagle3_patches.doctor import doctor
from eagle3_patches.testing import tiny_models as tm
from eagle3_patches.testing.isolation import run_isolated

H, V, DV = tm.HIDDEN, tm.VOCAB, tm.DRAFT_VOCAB
PATCH = "eagle3_draft_strict_loading"


def repo_fed_layers(n: int) -> list[int]:
    """The layers whose input SafeAILab/EAGLE feeds its draft on an n-layer target (its loop, as written there)."""
    return [idx for idx in range(n) if idx == n - 3 or idx == n // 2 or idx == 2]


def ea3(root: Path, name: str = "ea3", *, config: dict | None = None, tensors=None) -> Path:
    """The EAGLE repository's draft, with ``config`` merged into its config.json and ``tensors(t)`` editing its
    tensors."""
    return edited(eagle_repo_eagle3(root / name), config=config, tensors=tensors)


def edited(src: Path, *, config: dict | None = None, tensors=None) -> Path:
    """``src`` with ``config`` merged into its config.json and ``tensors(t)`` editing its tensors."""
    if config:
        cfg = json.loads((src / "config.json").read_text())
        cfg.update(config)
        (src / "config.json").write_text(json.dumps(cfg))
    if tensors is not None:
        t = load_file(str(src / "model.safetensors"))
        tensors(t)
        save_file(t, str(src / "model.safetensors"))
    return src


def _no_debris(root: Path) -> bool:
    return not [p for p in root.iterdir() if p.name.startswith(".")]


# ---------------------------------------------------------------- what it writes
def test_the_converted_draft_is_sglangs_eagle3_with_the_repositorys_ids_and_every_tensor_bit_for_bit(tmp_path):
    src = ea3(tmp_path, config={"rope_theta": 500000.0, "rope_scaling": {"type": "linear", "factor": 2.0}})
    res = convert(src, tmp_path / "out", num_target_layers=8, sglang_version="0.5.9", progress=False)
    assert res.report is not None and not res.report.errors, res.report.format()
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    source = json.loads((src / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["model_type"] == "llama"
    # the repository feeds the inputs of layers 2, 4, 5 of an 8-layer target = the outputs of layers 1, 3, 4
    assert repo_fed_layers(8) == [2, 4, 5]
    assert cfg["eagle_config"] == {
        "eagle_aux_hidden_state_layer_ids": [1, 3, 4],
        "use_aux_hidden_state": True,
        L.CONVENTION_KEY: L.OUTPUT_OF_LAYER,
    }
    assert cfg["eagle3_patches_converted_from"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert cfg["draft_vocab_size"] == DV and cfg["target_hidden_size"] == H and cfg["num_hidden_layers"] == 1
    # rope and every other llama field carried as they are
    assert cfg["rope_scaling"] == {"type": "linear", "factor": 2.0} and cfg["rope_theta"] == 500000.0
    rewritten = {"architectures", "model_type", "num_hidden_layers", "draft_vocab_size", "dtype"}  # dtype: torch_dtype
    assert cfg["torch_dtype"] == source["dtype"] and "dtype" not in cfg
    assert {k: v for k, v in source.items() if k not in rewritten} == {
        k: v for k, v in cfg.items() if k in source and k not in rewritten
    }
    before, after = load_file(str(src / "model.safetensors")), load_file(str(tmp_path / "out" / "model.safetensors"))
    assert set(before) == set(after) and res.renamed == {}
    for name, t in before.items():
        assert after[name].dtype == t.dtype and torch.equal(after[name], t), name
    assert after["d2t"].dtype == torch.int64 and after["t2d"].dtype == torch.bool
    # the doctor serves the result on stock 0.5.9 with --speculative-algorithm EAGLE3
    r = doctor(draft=tmp_path / "out", sglang_version="0.5.9", speculative_algorithm="EAGLE3", with_patches=False)
    assert not r.errors, r.format()
    assert r.facts["draft_kind"]["verdict"] == D.SERVED


@pytest.mark.parametrize("n", [7, 8, 32, 61, 64])
def test_sglang_captures_exactly_the_states_the_repository_fed_the_draft(tmp_path, n):
    """On every release: the first id is always 1, which 0.5.13 and later still shift by +1."""
    res = convert(ea3(tmp_path), tmp_path / "out", num_target_layers=n, run_doctor=False, progress=False)
    ids = res.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    for release in ("0.5.9", "0.5.12", "0.5.13", "0.5.23"):
        assert list(L.what_captures(ids, n, release).points) == repo_fed_layers(n), release
    assert res.config["eagle3_patches_converted_from"]["eagle_aux_hidden_state_layer_ids"] == repo_fed_layers(n)


@pytest.mark.parametrize("n, fed", [(7, [2, 3, 4]), (61, [2, 30, 58]), (L.MAX_LAYERS, [2, 512, 1021])])
def test_the_repositorys_ids_at_the_edges_of_the_layer_count(tmp_path, cli, n, fed):
    """The smallest target with three distinct states (7 layers), Kimi-K2.5's 61 layers and the largest count
    --num-target-layers takes (1024): the ids, and the layer count recorded with them."""
    assert repo_fed_layers(n) == fed
    rc, out, err = cli("convert", ea3(tmp_path), tmp_path / "out", "--num-target-layers", n, "--no-progress", "--json")
    assert rc == 0, err
    cfg = json.loads(out)["config"]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [i - 1 for i in fed]
    assert cfg["eagle3_patches_converted_from"]["eagle_aux_hidden_state_layer_ids"] == fed
    assert cfg["eagle3_patches_converted_from"]["num_target_layers"] == n
    assert cfg["eagle3_patches_converted_from"]["format"] == "eagle-repository"


def test_a_layer_count_past_the_largest_is_a_usage_error(tmp_path, cli):
    rc, _, err = cli("convert", ea3(tmp_path), tmp_path / "out", "--num-target-layers", L.MAX_LAYERS + 1)
    assert rc == 2 and f"not a layer count in 1..{L.MAX_LAYERS}: '{L.MAX_LAYERS + 1}'" in err
    assert not (tmp_path / "out").exists()


def test_the_target_gives_the_layer_count_and_its_cross_checks_pass(tmp_path, make_target, tiny):
    target = make_target(config={"num_hidden_layers": 8})
    res = convert(ea3(tmp_path), tmp_path / "out", target=target, sglang_version="0.5.9", progress=False)
    assert res.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert not res.report.errors, res.report.format()


def test_a_full_vocabulary_draft_needs_no_d2t(tmp_path):
    def full(t):
        t["lm_head.weight"] = torch.randn(V, H, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
        del t["d2t"], t["t2d"]

    src = ea3(tmp_path, config={"draft_vocab_size": V}, tensors=full)
    res = convert(src, tmp_path / "out", num_target_layers=8, sglang_version="0.5.9", progress=False)
    assert res.config["draft_vocab_size"] == V and not res.report.errors, res.report.format()


@pytest.mark.parametrize(
    "config, dtype",
    [
        ({}, "bfloat16"),  # the config's own dtype
        ({"dtype": "float16"}, "float16"),  # the config's dtype wins over the stored bfloat16
        ({"dtype": None}, "bfloat16"),  # none stated: fc.weight's stored dtype
        ({"dtype": "torch.float16", "torch_dtype": None}, "float16"),  # written as transformers reads it
    ],
)
def test_torch_dtype_is_the_configs_else_the_stored_one(tmp_path, config, dtype):
    res = convert(ea3(tmp_path, config=config), tmp_path / "out", num_target_layers=8, run_doctor=False, progress=False)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["torch_dtype"] == dtype
    assert res.config["torch_dtype"] == dtype
    assert "dtype" not in res.config  # one dtype field: transformers would read a carried dtype before torch_dtype


def test_draft_vocab_size_is_the_configs_else_the_rows_of_lm_head(tmp_path):
    stated = convert(ea3(tmp_path), tmp_path / "a", num_target_layers=8, run_doctor=False, progress=False)
    assert stated.config["draft_vocab_size"] == DV
    unstated = ea3(tmp_path, "unstated", config={"draft_vocab_size": None})
    res = convert(unstated, tmp_path / "b", num_target_layers=8, sglang_version="0.5.9", progress=False)
    assert res.config["draft_vocab_size"] == DV and not res.report.errors, res.report.format()


def test_a_draft_without_its_lm_head_is_refused_naming_the_tensor(tmp_path):
    def no_lm_head(t):
        del t["lm_head.weight"]

    src = ea3(tmp_path, tensors=no_lm_head)
    with pytest.raises(ConvertError) as err:
        convert(src, tmp_path / "out", num_target_layers=8, progress=False)
    assert err.value.what == "the source lacks tensors every EAGLE-3 draft needs"
    assert err.value.where == str(src) and err.value.found == "lm_head.weight"
    assert err.value.fix == "re-export the draft"
    assert not (tmp_path / "out").exists()


def test_the_source_auto_map_is_not_carried(tmp_path):
    """Its remote code would build the source's class, not sglang's LlamaForCausalLMEagle3."""
    src = ea3(tmp_path, config={"auto_map": {"AutoModelForCausalLM": "cnets.Model"}})
    convert(src, tmp_path / "out", num_target_layers=8, run_doctor=False, progress=False)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert "auto_map" not in cfg and cfg["architectures"] == ["LlamaForCausalLMEagle3"]


def _with_embed_tokens(t):
    t["embed_tokens.weight"] = torch.ones(V, H, dtype=torch.bfloat16)


def test_embed_tokens_is_kept_unless_dropped(tmp_path, cli):
    src = ea3(tmp_path, tensors=_with_embed_tokens)
    kept = convert(src, tmp_path / "kept", num_target_layers=8, run_doctor=False, progress=False)
    assert kept.dropped == [] and "embed_tokens.weight" in load_file(str(tmp_path / "kept" / "model.safetensors"))
    plan = plan_eagle_repo(src, num_target_layers=8)  # the planner's own default keeps it too
    assert plan.dropped == [] and "embed_tokens.weight" in {i.out for i in plan.items}
    rc, out, err = cli("convert", src, tmp_path / "out", "--num-target-layers", "8", "--drop-embed-tokens")
    assert rc == 0, err
    assert "dropped embed_tokens.weight" in out
    after = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert "embed_tokens.weight" not in after and "fc.weight" in after


def test_the_source_doctor_says_convert_and_the_table_marks_the_layout(tmp_path):
    r = doctor(draft=ea3(tmp_path), sglang_version="0.5.9", speculative_algorithm="EAGLE3", with_patches=False)
    unserved = next(f for f in r.findings if f.code == "draft-kind-not-served")
    assert "eagle3-patches convert" in unserved.fix and "--num-target-layers" in unserved.fix
    assert r.facts["draft_kind"]["verdict"] == D.CONVERT
    assert D.verdict(D.BY_KEY["eagle-repo-eagle3"], "0.5.23").status == D.CONVERT


def test_cli_converts_and_names_the_source_format(tmp_path, cli):
    rc, out, err = cli("convert", ea3(tmp_path), tmp_path / "out", "--num-target-layers", "8", "--no-progress")
    assert rc == 0, err
    assert "aux layer ids [2, 4, 5] (eagle-repository: input of layer N) -> [1, 3, 4]" in out


# ---------------------------------------------------------------- what it refuses
def test_without_the_target_layer_count_it_is_a_usage_error(tmp_path, cli):
    src = ea3(tmp_path)
    with pytest.raises(ConvertUsageError) as err:
        convert(src, tmp_path / "out", progress=False)
    assert "layer count" in err.value.what and "--num-target-layers" in err.value.expected
    assert err.value.where == str(src / "config.json")
    rc, _, stderr = cli("convert", src, tmp_path / "out", "--no-progress")
    assert rc == 2 and "--target" in stderr and "--num-target-layers" in stderr
    assert not (tmp_path / "out").exists() and _no_debris(tmp_path)


def test_explicit_ids_need_no_layer_count(tmp_path):
    res = convert(ea3(tmp_path), tmp_path / "out", aux_layer_ids=[2, 4, 5], sglang_version="0.5.9", progress=False)
    assert res.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]


def test_explicit_ids_are_bounded_by_the_layer_count(tmp_path):
    """Input-of-layer 7 is the output of layer 6, the last sglang captures on an 8-layer target; 8 is the final
    state."""
    src = ea3(tmp_path)
    res = convert(src, tmp_path / "ok", aux_layer_ids=[2, 4, 7], num_target_layers=8, run_doctor=False)
    assert res.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 6]
    with pytest.raises(ConvertError) as err:
        convert(src, tmp_path / "out", aux_layer_ids=[2, 4, 8], num_target_layers=8, run_doctor=False)
    assert "aux id 8 (the input of layer 8) has no capture point in sglang on a 8-layer target" in err.value.what
    assert err.value.where == "--aux-layer-ids" and err.value.found == "[2, 4, 8]"
    assert err.value.expected == "ids in 1..7" and not (tmp_path / "out").exists()


def test_pickle_weights_are_refused_never_loaded(tmp_path):
    src = ea3(tmp_path)
    (src / "model.safetensors").unlink()
    (src / "pytorch_model.bin").write_bytes(b"\x80\x04 would be unpickled by torch.load")
    with pytest.raises(ConvertError) as err:
        convert(src, tmp_path / "out", num_target_layers=8, progress=False)
    assert "never loads pickles" in err.value.what and err.value.found == "pytorch_model.bin"
    assert "safetensors" in err.value.fix and "weights_only=True" in err.value.fix


def test_a_reduced_lm_head_without_d2t_is_refused_naming_the_automodel_failure(tmp_path):
    def no_d2t(t):
        del t["d2t"], t["t2d"]

    src = ea3(tmp_path, tensors=no_d2t)
    with pytest.raises(ConvertError) as err:
        convert(src, tmp_path / "out", num_target_layers=8, progress=False)
    assert f"{DV} rows, fewer than the target's {V} tokens" in err.value.what
    assert "NeMo Automodel #2447" in err.value.what
    assert err.value.where == str(src) and err.value.found == f"lm_head.weight [{DV}, {H}], no d2t"
    assert "d2t" in err.value.expected and "export d2t" in err.value.fix
    assert not (tmp_path / "out").exists()


def test_the_target_vocabulary_decides_whether_d2t_is_needed(tmp_path, make_target):
    """The draft's own vocab_size says full vocabulary; the target's is larger: d2t is needed."""

    def full(t):
        t["lm_head.weight"] = torch.zeros(V, H, dtype=torch.bfloat16)
        del t["d2t"], t["t2d"]

    target = make_target(config={"num_hidden_layers": 8, "vocab_size": 2 * V})
    with pytest.raises(ConvertError, match="NeMo Automodel"):
        convert(ea3(tmp_path, tensors=full), tmp_path / "out", target=target, progress=False)


@pytest.mark.parametrize("n, states", [(6, 2), (4, 2), (5, 1)])
def test_a_target_too_shallow_for_three_states_is_refused(tmp_path, n, states):
    assert len(repo_fed_layers(n)) == states
    with pytest.raises(ConvertError) as err:
        convert(ea3(tmp_path), tmp_path / "out", num_target_layers=n, progress=False)
    assert f"{states} distinct state(s)" in err.value.what and "at least 7 layers" in err.value.expected


def test_a_layer_count_disagreeing_with_the_target_is_refused(tmp_path, make_target):
    target = make_target(config={"num_hidden_layers": 8})
    with pytest.raises(ConvertError) as err:
        convert(ea3(tmp_path), tmp_path / "out", target=target, num_target_layers=9, progress=False)
    assert err.value.what == "--num-target-layers disagrees with the target's config"
    assert err.value.found == "8 in the config, --num-target-layers 9"


@pytest.mark.parametrize("stated", [H // 2, 2 * H])
def test_a_target_hidden_size_disagreeing_with_fc_is_refused_on_either_side(tmp_path, stated):
    src = ea3(tmp_path, config={"target_hidden_size": stated})
    with pytest.raises(ConvertError) as err:
        convert(src, tmp_path / "out", num_target_layers=8, progress=False)
    assert err.value.what == "target_hidden_size disagrees with fc.weight"
    assert err.value.where == f"{src / 'config.json'}: target_hidden_size"
    assert err.value.found == f"{stated}; fc.weight [{H}, {3 * H}]"
    assert err.value.expected == f"{H} (fc in-width / 3 states)" and err.value.fix == "repair the source config.json"


def test_a_target_hidden_size_agreeing_with_fc_is_kept(tmp_path):
    res = convert(ea3(tmp_path, config={"target_hidden_size": H}), tmp_path / "out", num_target_layers=8)
    assert res.config["target_hidden_size"] == H and not res.report.errors, res.report.format()


@pytest.mark.parametrize("model_type", ["qwen3", "deepseek_v3"])  # sorting after "llama" and before it
def test_a_config_that_is_not_llama_is_refused(tmp_path, model_type):
    src = ea3(tmp_path, config={"model_type": model_type})
    with pytest.raises(ConvertError) as err:
        convert(src, tmp_path / "out", num_target_layers=8, progress=False)
    assert "not a llama config" in err.value.what
    assert err.value.where == f"{src / 'config.json'}: model_type"
    assert err.value.found == repr(model_type) and err.value.expected == "'llama'"


@pytest.mark.parametrize("length", [78, 79, 200])  # repr 80 characters (shown whole), 81 and more (cut to 80)
def test_a_hostile_model_type_is_shown_cut_to_80_characters(tmp_path, length):
    model_type = "x" * length
    with pytest.raises(ConvertError) as err:
        convert(ea3(tmp_path, config={"model_type": model_type}), tmp_path / "out", num_target_layers=8)
    assert err.value.found == f"'{model_type}'"[:80] and len(err.value.found) == min(length + 2, 80)


def test_an_unusable_config_field_is_refused_naming_the_file_and_field(tmp_path):
    src = ea3(tmp_path, config={"draft_vocab_size": "many"})
    with pytest.raises(ConvertError) as err:
        convert(src, tmp_path / "out", num_target_layers=8, progress=False)
    assert err.value.what == "the source config field draft_vocab_size is unusable"
    assert err.value.where == f"{src / 'config.json'}: draft_vocab_size"
    assert "'many'" in err.value.found and "integer" in err.value.expected


def test_more_ids_than_fc_takes_states_is_refused(tmp_path):
    """fc.weight takes 3 x 64 = 192 inputs: not one state per id for 5 ids."""
    src = ea3(tmp_path)
    with pytest.raises(ConvertError) as err:
        convert(src, tmp_path / "out", aux_layer_ids=[2, 3, 4, 5, 6], num_target_layers=8, progress=False)
    assert err.value.what == "fc.weight does not take one target hidden state per aux layer (5)"
    assert err.value.where == f"{src / 'config.json'}: fc.weight"
    assert err.value.found == f"[{H}, {3 * H}]" and err.value.expected == "[hidden, 5 x target hidden]"
    assert "--aux-layer-ids" in err.value.fix and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "fc, found",
    [
        (None, "no fc.weight"),
        (torch.zeros(3 * H), f"[{3 * H}]"),
        (torch.zeros(H, 3 * H, 1), f"[{H}, {3 * H}, 1]"),
    ],
)
def test_an_automodel_fc_that_is_not_a_matrix_is_refused(tmp_path, fc, found):
    """Automodel's draft is known by its class name, so fc.weight's shape reaches the converter unchecked."""
    from test_draft_layouts import automodel_eagle3

    def put(t):
        del t["model.fc.weight"]
        if fc is not None:
            t["model.fc.weight"] = fc

    src = edited(automodel_eagle3(tmp_path), tensors=put)
    with pytest.raises(ConvertError) as err:
        convert(src, tmp_path / "out", aux_layer_ids=[2, 4, 5], progress=False)
    assert err.value.what == "fc.weight does not take one target hidden state per aux layer (3)"
    assert err.value.where == f"{src / 'config.json'}: fc.weight" and err.value.found == found


def test_a_draft_already_in_sglangs_format_is_not_taken_for_a_source(tmp_path):
    src = tm.build_eagle3_draft(tmp_path / "sglang")
    with pytest.raises(ConvertError) as err:
        convert(src, tmp_path / "out", num_target_layers=8, progress=False)
    assert err.value.what == "the source is already in SGLang format; nothing to convert"
    assert "eagle3-patches doctor --draft" in err.value.fix


def test_another_unserved_layout_is_refused_with_its_own_fix(tmp_path):
    """The EAGLE repository's EAGLE-1/2 draft is no EAGLE-3 draft: the converter names it and the table's fix."""
    with pytest.raises(ConvertError) as err:
        convert(eagle_repo_eagle(tmp_path), tmp_path / "out", num_target_layers=8, progress=False)
    assert "neither a speculators EAGLE-3 draft, the original EAGLE repository's nor NeMo Automodel's" in err.value.what
    assert "EAGLE-1/2" in err.value.found and err.value.fix == D.BY_KEY["eagle-repo-eagle"].fix


# ---------------------------------------------------------------- real sglang
def _load(target: str, drafts: list[str]) -> list[dict]:
    from eagle3_patches.testing.sglang_harness import load_drafts

    return load_drafts(target, drafts)


@pytest.mark.sglang
@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="sglang is not installed")
def test_the_converted_draft_loads_into_sglangs_llama_eagle3_bit_exact(tiny, tmp_path):
    """Real ``LlamaForCausalLMEagle3`` of the installed release under strict loading (an unknown key or an unloaded
    parameter raises)."""
    out = convert(ea3(tmp_path), tmp_path / "out", num_target_layers=8, sglang_version="0.5.9", progress=False).dst
    (res,) = run_isolated(_load, str(tiny["deepseek_v3"]), [str(out)], patches=[PATCH])
    assert res["ok"], res
    t = load_file(str(out / "model.safetensors"))
    params = res["params"]
    a = "midlayer.self_attn."
    want = {  # by suffix: from 0.5.12 the decoder layer is model.layers.0 (model.midlayer before)
        "fc.weight": t["fc.weight"],
        "lm_head.weight": t["lm_head.weight"],
        "self_attn.qkv_proj.weight": torch.cat(
            [t[a + "q_proj.weight"], t[a + "k_proj.weight"], t[a + "v_proj.weight"]]
        ),
    }
    for suffix, value in want.items():
        (name,) = [n for n in params if n.endswith(suffix)]
        assert torch.equal(params[name], value.to(params[name].dtype)), name
    assert torch.equal(res["hot_token_id"], t["d2t"] + torch.arange(DV))
    assert torch.equal(res["hot_token_id"], tm.hot_token_ids(V, DV))
    assert not [f for f in doctor(draft=out, sglang_version="0.5.9").findings if f.severity == ERROR]


def test_the_layer_count_also_bounds_a_speculators_drafts_ids(tiny, tmp_path):
    """--num-target-layers is the target's layer count for either source: speculators' ids [2, 3, 4] need 5 layers."""
    with pytest.raises(ConvertError, match="no capture point in sglang on a 4-layer target"):
        convert(tiny["speculators_draft"], tmp_path / "out", num_target_layers=4, progress=False)
    assert convert(tiny["speculators_draft"], tmp_path / "ok", num_target_layers=5, run_doctor=False, progress=False)


# ---------------------------------------------------------------- NeMo Automodel's EAGLE-3 layout
def test_automodels_draft_is_converted_with_the_ids_it_was_trained_on(tmp_path, cli):
    from test_draft_layouts import automodel_eagle3

    src = automodel_eagle3(tmp_path)
    before = load_file(str(src / "model.safetensors"))
    assert any(n.startswith("model.") for n in before)  # Automodel's names
    res = convert(src, tmp_path / "out", aux_layer_ids=[2, 4, 5], progress=False)
    cfg = res.config
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert cfg["eagle3_patches_converted_from"]["format"] == "nemo-automodel"
    after = load_file(str(tmp_path / "out" / "model.safetensors"))
    for name, t in before.items():
        out_name = name[len("model.") :] if name.startswith("model.") else name
        assert torch.equal(after[out_name], t), name  # the prefix dropped, every tensor (d2t, t2d) bit for bit
    r = doctor(tm.build_kimi_k25(tmp_path / "target"), tmp_path / "out", sglang_version="0.5.9")
    assert "draft-kind-not-served" not in r.codes()


def test_automodels_draft_without_ids_is_a_usage_error_naming_the_flag(tmp_path, cli):
    from test_draft_layouts import automodel_eagle3

    src = automodel_eagle3(tmp_path)
    with pytest.raises(ConvertUsageError) as err:
        convert(src, tmp_path / "out", num_target_layers=8, progress=False)  # no rule: the layer count is not enough
    assert "--aux-layer-ids" in err.value.expected
    rc, _, stderr = cli("convert", src, tmp_path / "out", "--no-progress")
    assert rc == 2 and "--aux-layer-ids" in stderr and not (tmp_path / "out").exists()
    stated = automodel_eagle3(tmp_path / "stated", eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 4, 5]})
    res = convert(stated, tmp_path / "out2", progress=False)  # ids the config states need no flag
    assert res.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert D.BY_KEY["automodel-eagle3"].convert


def test_an_eagle1_class_name_on_an_eagle3_draft_is_converted_with_the_ids_it_was_trained_on(tmp_path):
    src = tm.build_eagle3_draft(tmp_path / "misnamed")
    cfg = json.loads((src / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLMEagle"]  # the EAGLE-1/2 class would build a 2 x hidden fc
    del cfg["eagle_config"]
    (src / "config.json").write_text(json.dumps(cfg))
    assert D.classify(cfg, {"fc.weight": (H, 3 * H)}).layout.key == "eagle1-name-eagle3-fc"
    for n in (None, 8):  # the repository's rule is not its training's: the layer count gives no ids
        with pytest.raises(ConvertUsageError) as err:
            convert(src, tmp_path / "out", num_target_layers=n, progress=False)
        assert err.value.what == "this draft names no aux layer ids, and no rule gives them"
        assert err.value.where == str(src / "config.json") and "--aux-layer-ids" in err.value.expected
    res = convert(src, tmp_path / "out", aux_layer_ids=[2, 3, 4], progress=False)
    assert res.config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert res.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert D.BY_KEY["eagle1-name-eagle3-fc"].convert
