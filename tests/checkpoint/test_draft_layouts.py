"""checkpoint/draft_layouts: which kind of draft a checkpoint is, in which layout, and whether a release serves it.

Every kind and layout is detected from a checkpoint written as its exporter writes it: configs with transformers'
own config classes (``LlamaConfig``, ``Qwen3Config``, ``DeepseekV3Config``) plus the exporter's fields, weights
with safetensors; speculators' EAGLE-3 draft is the fixture written by the real ``speculators`` library
(``tools/make_speculators_fixture.py``).  Where no library is installable here the fields come from the format's
public source, named in each builder.  The doctor's verdict is judged on 0.5.9 and at each boundary where a
release starts serving a layout; the algorithm guard and the doctor answer "EAGLE-3?" the same for every layout.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import DeepseekV3Config, LlamaConfig, Qwen3Config

from eagle3_patches.checkpoint import draft_layouts as D
from eagle3_patches.checkpoint.draft_kind import eagle3_draft_evidence
from eagle3_patches.checkpoint.formats import MLA_DRAFT_ARCH
from eagle3_patches.diagnostic import ERROR, INFO
from eagle3_patches.doctor import doctor
from eagle3_patches.testing import tiny_models as tm

H, V, DV = tm.HIDDEN, tm.VOCAB, tm.DRAFT_VOCAB
SPEC = tm.TinyDraftSpec()


def _llama(**extra) -> dict:
    """A tiny draft's llama fields, as transformers' ``LlamaConfig`` writes them."""
    cfg = LlamaConfig(
        hidden_size=H,
        intermediate_size=SPEC.intermediate_size,
        num_attention_heads=SPEC.num_heads,
        num_key_value_heads=SPEC.num_kv_heads,
        num_hidden_layers=1,
        vocab_size=V,
        torch_dtype="bfloat16",
    ).to_dict()
    return cfg | extra


def _write(path: Path, config: dict, tensors: dict) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config, default=str))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    return path


def _eagle3_tensors(prefix: str = "midlayer.", *, model_prefix: bool = False) -> dict:
    t = tm.eagle3_draft_tensors(SPEC, midlayer_prefix=prefix)
    return {(f"model.{k}" if model_prefix and k != "lm_head.weight" else k): v for k, v in t.items()}


def _eagle1_tensors() -> dict:
    """EAGLE-1/2's draft (SafeAILab/EAGLE ``eagle/model/cnets1.py``): ``fc`` takes [embedding, hidden] = 2 x hidden,
    its decoder layer is ``layers.0.*`` with q/k/v over hidden."""
    t = {k: v for k, v in _eagle3_tensors("layers.0.").items() if k not in ("d2t", "t2d", "lm_head.weight")}
    t["fc.weight"] = t["fc.weight"][:, : 2 * H]
    for p in ("q", "k", "v"):
        t[f"layers.0.self_attn.{p}_proj.weight"] = t[f"layers.0.self_attn.{p}_proj.weight"][:, :H]
    del t["layers.0.hidden_norm.weight"]
    return t


# ---------------------------------------------------------------- the layouts, as their exporters write them
def sglang_eagle3(root: Path) -> Path:
    return tm.build_eagle3_draft(root / "sglang-eagle3")


def sglang_eagle3_multilayer(root: Path) -> Path:
    return _write(root / "multi", tm.eagle3_draft_config() | {"num_hidden_layers": 2}, _eagle3_tensors())


def sglang_eagle31(root: Path) -> Path:
    """EAGLE-3.1's flags (sglang ``models/kimi_k25_eagle3.py``'s docstring: ``fc_norm``, ``norm_output``)."""
    return _write(root / "e31", tm.eagle3_draft_config() | {"fc_norm": True, "norm_output": True}, _eagle3_tensors())


def modelopt_eagle3(root: Path) -> Path:
    """NVIDIA ModelOpt's EAGLE-3 export (``modelopt/torch/export/plugins/hf_spec_export.py``: the llama template
    config with its ``eagle_config`` keys; tensors ``layers.0.*``, ``fc``, ``norm``, ``d2t``, no ``t2d``)."""
    cfg = tm.eagle3_draft_config()
    cfg["eagle_config"] |= {"use_last_layernorm": False, "next_layer_regular": True, "parallel_draft_step": 1}
    t = _eagle3_tensors("layers.0.")
    del t["t2d"]
    return _write(root / "modelopt", cfg, t)


def kimi_eagle3_mla(root: Path) -> Path:
    """ModelOpt's ``kimik2`` template (``architectures: ["Eagle3DeepseekV2ForCausalLM"]``, ``model_type: kimi_k2``),
    fields from transformers' ``DeepseekV3Config``."""
    cfg = DeepseekV3Config(hidden_size=H, num_hidden_layers=1, vocab_size=V).to_dict()
    cfg |= {"architectures": ["Eagle3DeepseekV2ForCausalLM"], "model_type": "kimi_k2", "draft_vocab_size": DV}
    cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(tm.DRAFT_AUX_IDS), "use_aux_hidden_state": True}
    return _write(root / "kimi-mla", cfg, {"fc.weight": torch.zeros(H, 3 * H), "norm.weight": torch.ones(H)})


def kimi_eagle31_mla(root: Path) -> Path:
    """The same template with EAGLE-3.1's norms (``kimi-k2.6-eagle3.1-mla``: ``fc_norm``, ``norm_output``)."""
    path = kimi_eagle3_mla(root)
    cfg = json.loads((path / "config.json").read_text()) | {"fc_norm": True, "norm_output": True}
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def speculators_eagle3(root: Path) -> Path:
    return tm.build_speculators_fixture(root)  # written by speculators 0.9.0 itself


def speculators_eagle(root: Path) -> Path:
    """speculators' EAGLE-1 / HASS draft (vllm-project/speculators ``src/speculators/models/eagle.py``:
    ``EagleSpeculatorConfig`` registered as ``"eagle"``, architectures ``EagleSpeculator``, a llama
    ``transformer_layer_config``, ``layernorms``, ``fusion_bias``; tensors ``fusion_fc``, ``transformer.*``).
    speculators needs transformers >= 5, which this environment does not have: built from that source."""
    cfg = {
        "architectures": ["EagleSpeculator"],
        "speculators_model_type": "eagle",
        "speculators_version": "0.9.0",
        "transformer_layer_config": _llama(),
        "layernorms": False,
        "fusion_bias": False,
    }
    t = {"fusion_fc.weight": torch.zeros(H, 2 * H), "transformer.self_attn.q_proj.weight": torch.zeros(H, H)}
    return _write(root / "spec-eagle", cfg, t)


def eagle_repo_eagle3(root: Path) -> Path:
    """The EAGLE repository's EAGLE-3 draft (SafeAILab/EAGLE ``eagle/traineagle3/config.json``: ``LlamaForCausalLM``,
    ``num_hidden_layers: 1``, ``draft_vocab_size``; ``cnets.py``: ``midlayer``, ``fc`` over 3 x hidden, ``norm``,
    ``lm_head``, buffers ``d2t`` / ``t2d``)."""
    return _write(root / "ea3", _llama(architectures=["LlamaForCausalLM"], draft_vocab_size=DV), _eagle3_tensors())


def eagle_repo_eagle(root: Path) -> Path:
    """The EAGLE repository's EAGLE-1/2 draft (``eagle/train/EAGLE-LLaMA3-Instruct-8B.json``, ``cnets1.py``)."""
    return _write(root / "ea1", _llama(architectures=["LlamaForCausalLM"], bias=False), _eagle1_tensors())


def sglang_eagle(root: Path) -> Path:
    """sglang's own EAGLE-1/2 copies (the EAGLE repository's draft, ``architectures: ["LlamaForCausalLMEagle"]``)."""
    return _write(root / "sgl-ea1", _llama(architectures=["LlamaForCausalLMEagle"]), _eagle1_tensors())


def automodel_eagle3(root: Path, **extra) -> Path:
    """NeMo Automodel's EAGLE-3 draft (its ``serve_sglang`` / ``serve_vllm`` docs: ``architectures:
    ["LlamaEagle3DraftModel"]``, tensors under ``model.``, ``lm_head.weight`` at the top, ``d2t`` / ``t2d``
    offsets in the weights)."""
    cfg = _llama(architectures=["LlamaEagle3DraftModel"], draft_vocab_size=DV) | extra
    return _write(root / f"automodel{len(extra)}", cfg, _eagle3_tensors(model_prefix=True))


def automodel_eagle(root: Path) -> Path:
    return _write(root / "automodel-ea1", _llama(architectures=["LlamaEagleDraftModel"]), _eagle1_tensors())


def peagle(root: Path) -> Path:
    """P-EAGLE (NeMo Automodel's ``peagle_recipe``: ``parallel_drafting: true`` with ``mask_token_id`` and
    ``num_depths`` in the saved config)."""
    return automodel_eagle3(root, parallel_drafting=True, mask_token_id=3, num_depths=4)


def dflash(root: Path) -> Path:
    """A DFlash draft as ModelOpt's ``DFlashExporter`` writes it (z-lab's format: ``DFlashDraftModel``,
    ``model_type: qwen3``, ``block_size``, ``dflash_config``), fields from transformers' ``Qwen3Config``."""
    cfg = Qwen3Config(hidden_size=H, num_hidden_layers=1, vocab_size=V).to_dict()
    cfg |= {
        "architectures": ["DFlashDraftModel"],
        "block_size": 16,
        "dflash_config": {"mask_token_id": 3, "target_layer_ids": [1, 3]},
    }
    return _write(root / "dflash", cfg, {"fc.weight": torch.zeros(H, 2 * H), "norm.weight": torch.ones(H)})


def mtp_nextn(root: Path) -> Path:
    """An exported NextN layer (``DeepseekV3ForCausalLMNextN``, sglang ``models/deepseek_nextn.py``)."""
    cfg = DeepseekV3Config(hidden_size=H, num_hidden_layers=1, vocab_size=V).to_dict()
    cfg["architectures"] = ["DeepseekV3ForCausalLMNextN"]
    return _write(root / "nextn", cfg, {"model.eh_proj.weight": torch.zeros(H, 2 * H)})


def mtp_builtin(root: Path) -> Path:
    """A DeepSeek-V3 target with its MTP layer (``num_nextn_predict_layers: 1``) given as the draft."""
    cfg = DeepseekV3Config(hidden_size=H, num_hidden_layers=2, vocab_size=V, num_nextn_predict_layers=1).to_dict()
    cfg["architectures"] = ["DeepseekV3ForCausalLM"]
    return _write(root / "mtp", cfg, {"model.norm.weight": torch.ones(H)})


#: builder, the layout key it must be detected as, the algorithm that serves it
CASES = {
    "sglang-eagle3": (sglang_eagle3, "EAGLE3"),
    "sglang-eagle3-multilayer": (sglang_eagle3_multilayer, "EAGLE3"),
    "sglang-eagle31": (sglang_eagle31, "EAGLE3"),
    "sglang-eagle3-layers0": (modelopt_eagle3, "EAGLE3"),
    "kimi-eagle3-mla": (kimi_eagle3_mla, "EAGLE3"),
    "kimi-eagle31-mla": (kimi_eagle31_mla, "EAGLE3"),
    "speculators-eagle3": (speculators_eagle3, "EAGLE3"),
    "speculators-eagle": (speculators_eagle, "EAGLE"),
    "eagle-repo-eagle3": (eagle_repo_eagle3, "EAGLE3"),
    "eagle-repo-eagle": (eagle_repo_eagle, "EAGLE"),
    "sglang-eagle": (sglang_eagle, "EAGLE"),
    "automodel-eagle3": (automodel_eagle3, "EAGLE3"),
    "automodel-eagle": (automodel_eagle, "EAGLE"),
    "peagle": (peagle, "EAGLE3"),
    "dflash": (dflash, "DFLASH"),
    "mtp-nextn": (mtp_nextn, "NEXTN"),
    "mtp-builtin": (mtp_builtin, "NEXTN"),
}


def _kind_finding(report):
    found = [f for f in report.findings if f.code == "draft-kind"]
    assert len(found) == 1 and found[0].severity == INFO, report.format()
    return found[0]


def test_every_layout_of_the_table_has_a_fixture():
    assert set(CASES) | {"eagle1-name-eagle3-fc"} == set(D.BY_KEY)


@pytest.mark.parametrize("key", CASES)
def test_each_layout_is_detected_and_the_doctor_names_it_with_the_0_5_9_verdict(tmp_path, key):
    build, algo = CASES[key]
    draft = build(tmp_path)
    layout = D.BY_KEY[key]
    r = doctor(draft=draft, speculative_algorithm=algo, sglang_version="0.5.9", with_patches=False)
    assert r.facts["draft_kind"]["key"] == key and r.facts["draft_kind"]["layout"] == layout.name, r.format()
    f = _kind_finding(r)
    v = D.verdict(layout, "0.5.9")
    assert f.what == f"the draft: kind {layout.kind}, layout {layout.name}; {v.text}"
    not_served = "draft-kind-not-served" in r.codes(ERROR)
    assert not_served == (v.status != D.SERVED and layout.owned_by("0.5.9") is None), r.format()
    if not_served:
        assert next(x for x in r.findings if x.code == "draft-kind-not-served").fix == layout.fix
    assert "internal-error" not in r.codes(), r.format()


@pytest.mark.parametrize("key", CASES)
def test_the_guard_and_the_doctor_answer_eagle3_alike(tmp_path, key):
    """One rule: the algorithm guard (from the files) and the doctor (from what it read) call exactly the EAGLE-3
    kinds EAGLE-3 (a P-EAGLE or DFlash draft is not refused as "an EAGLE-3 draft under EAGLE")."""
    build, _ = CASES[key]
    draft = build(tmp_path)
    eagle3 = D.BY_KEY[key].kind in D.EAGLE3_KINDS
    assert (eagle3_draft_evidence(draft) is not None) == eagle3
    r = doctor(draft=draft, speculative_algorithm="EAGLE", sglang_version="0.5.9", with_patches=False)
    assert ("algorithm-eagle-with-eagle3-draft" in r.codes(ERROR)) == eagle3, r.format()


@pytest.mark.parametrize(
    "key, before, first",
    [
        ("dflash", "0.5.10.post1", "0.5.11"),
        ("kimi-eagle3-mla", "0.5.11", "0.5.12"),
        ("kimi-eagle31-mla", "0.5.12", "0.5.13"),  # 0.5.12's class ignores the norms: draft-config-ignored says so
        ("sglang-eagle3-multilayer", "0.5.11", "0.5.12"),
        ("eagle-repo-eagle3", "0.5.23", None),
        ("peagle", "0.5.23", None),
    ],
)
def test_the_verdict_changes_at_the_first_release_that_serves_the_layout(tmp_path, key, before, first):
    build, algo = CASES[key]
    draft = build(tmp_path)
    layout = D.BY_KEY[key]
    old = doctor(draft=draft, speculative_algorithm=algo, sglang_version=before, with_patches=False)
    unserved = layout.owned_by(before) or "draft-kind-not-served"
    assert unserved in old.codes(ERROR), old.format()
    kind = _kind_finding(old)
    assert f"not served by sglang {before}" in kind.what
    assert (f"sglang {first} is the first release" if first else "no release through 0.5.23") in kind.what
    if first is not None:
        new = doctor(draft=draft, speculative_algorithm=algo, sglang_version=first, with_patches=False)
        assert unserved not in new.codes(), new.format()
        assert f"served by sglang {first} (--speculative-algorithm {algo})" in _kind_finding(new).what


def test_a_layout_another_finding_owns_is_not_reported_twice(tmp_path):
    """speculators on stock 0.5.9: draft-speculators-format is the error; the kind note says convert."""
    r = doctor(draft=speculators_eagle3(tmp_path), sglang_version="0.5.9", with_patches=False)
    assert "draft-speculators-format" in r.codes(ERROR) and "draft-kind-not-served" not in r.codes(), r.format()
    assert "not served by sglang 0.5.9 as it is" in _kind_finding(r).what
    assert D.verdict(D.BY_KEY["speculators-eagle3"], "0.5.9").status == D.CONVERT


def test_under_eagle3_patches_the_layouts_it_serves_are_served(tmp_path):
    r = doctor(draft=modelopt_eagle3(tmp_path), sglang_version="0.5.9", with_patches=True)
    assert "served under eagle3-patches on sglang 0.5.9 (eagle3_draft_strict_loading)" in _kind_finding(r).what
    stock = D.verdict(D.BY_KEY["sglang-eagle3-layers0"], "0.5.11")
    assert stock.status == D.NOT_SERVED and "sglang 0.5.12 is the first release" in stock.text


@pytest.mark.parametrize(
    "key, wrong, right",
    [("dflash", "EAGLE3", "DFLASH"), ("mtp-nextn", "EAGLE3", "NEXTN"), ("mtp-builtin", "EAGLE3", "EAGLE")],
)
def test_an_algorithm_that_does_not_serve_the_kind_is_an_error_naming_the_right_one(tmp_path, key, wrong, right):
    build, _ = CASES[key]
    draft = build(tmp_path)
    r = doctor(draft=draft, speculative_algorithm=wrong, sglang_version="0.5.23", with_patches=False)
    f = next((x for x in r.findings if x.code == "draft-kind-algorithm"), None)
    assert f is not None and f.severity == ERROR and f.found == wrong, r.format()
    assert right in f.expected.split(" or ")
    ok = doctor(draft=draft, speculative_algorithm=right, sglang_version="0.5.23", with_patches=False)
    assert "draft-kind-algorithm" not in ok.codes(), ok.format()


@pytest.mark.parametrize(
    "key, not_key",
    [
        ("sglang-eagle3", "sglang-eagle"),  # an EAGLE-3 draft is not called EAGLE-1
        ("sglang-eagle", "sglang-eagle3"),
        ("eagle-repo-eagle3", "eagle-repo-eagle"),  # same architecture name; fc 3 x hidden against 2 x hidden
        ("speculators-eagle3", "speculators-eagle"),
        ("peagle", "automodel-eagle3"),  # same architecture name; parallel_drafting
        ("sglang-eagle3-layers0", "sglang-eagle3"),  # same config; layers.0.* names
    ],
)
def test_neighbouring_layouts_are_told_apart(tmp_path, key, not_key):
    for one, other in ((key, not_key), (not_key, key)):
        r = doctor(draft=CASES[one][0](tmp_path / one), sglang_version="0.5.9", with_patches=False)
        assert r.facts["draft_kind"]["key"] == one != other, r.format()


def test_a_target_without_mtp_layers_is_no_draft_kind(tiny):
    cfg = json.loads((tiny["kimi_k25"] / "config.json").read_text())
    assert D.classify(cfg) is None
    r = doctor(draft=tiny["kimi_k25"], sglang_version="0.5.9", with_patches=False)
    assert "draft-kind" not in r.codes() and "draft_kind" not in r.facts


def test_an_eagle1_class_name_on_an_eagle3_fc_needs_the_eagle3_class(tmp_path):
    cfg = tm.eagle3_draft_config() | {"architectures": ["LlamaForCausalLMEagle"]}
    del cfg["eagle_config"]
    found = D.classify(cfg, {"fc.weight": (H, 3 * H)})
    assert found is not None and found.layout.key == "eagle1-name-eagle3-fc" and found.is_eagle3
    assert D.classify(cfg, {"fc.weight": (H, 2 * H)}).layout.key == "sglang-eagle"


def test_a_hostile_architecture_name_is_shown_bounded(tmp_path):
    cfg = tm.eagle3_draft_config() | {"architectures": ["LlamaForCausalLMEagle3" + "x" * 10_000]}
    r = doctor(draft=_write(tmp_path / "d", cfg, _eagle3_tensors()), sglang_version="0.5.9", with_patches=False)
    found = _kind_finding(r).found
    assert len(found) < 200
    shown = repr(cfg["architectures"])  # shown to its first 80 characters
    assert found.endswith(f"architectures {shown[:80]}"), found


def test_the_table_in_the_docs_is_generated_from_the_layouts():
    page = (Path(__file__).resolve().parents[2] / "docs" / "checkpoints.md").read_text(encoding="utf-8")
    assert D.layouts_table() in page


def test_the_table_in_the_docs_has_one_row_per_layout_with_its_verdicts():
    """The generated block is exactly the table (not only its header), one row per layout, in the table's order,
    each row's release columns the verdicts a user gets from the doctor."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "checkpoints.md").read_text(encoding="utf-8")
    block = page.split("<!-- BEGIN draft kinds:", 1)[1].split("\n", 1)[1].split("<!-- END draft kinds -->")[0]
    assert block.strip() == D.layouts_table()
    rows = block.strip().splitlines()[2:]
    assert len(rows) == len(D.LAYOUTS)
    shown = {D.SERVED: "served", D.CONVERT: "after convert", D.NOT_SERVED: "not served"}
    for row, lay in zip(rows, D.LAYOUTS, strict=True):
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert cells[:3] == [lay.kind, lay.name, lay.detected_by], row
        assert cells[3:5] == [shown[D.verdict(lay, "0.5.9").status], shown[D.verdict(lay, "0.5.23").status]], row
    dflash = next(r for r in rows if r.startswith("| DFlash |"))
    assert "| not served | served | 0.5.11 (DFLASH) | as stock |" in dflash


def test_the_shared_table_and_the_answers_cannot_be_changed_by_a_caller():
    """LAYOUTS is one module-level table every caller (doctor, guard, docs) reads: nobody may edit it in place."""
    import dataclasses

    lay = D.BY_KEY["sglang-eagle3"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        lay.served_from = None
    found = D.classify(tm.eagle3_draft_config())
    with pytest.raises(dataclasses.FrozenInstanceError):
        found.layout = D.BY_KEY["peagle"]
    v = D.verdict(lay, "0.5.9")
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.status = D.NOT_SERVED
    assert D.verdict(lay, "0.5.9").status == D.SERVED


def _key(config: dict, tensors: dict | None = None) -> str | None:
    found = D.classify(config, tensors)
    return None if found is None else found.layout.key


@pytest.mark.parametrize("field", ["fc_norm", "use_aux_norm", "norm_output"])
@pytest.mark.parametrize("where", ["top", "eagle_config"])
def test_each_eagle31_field_alone_makes_an_eagle31_draft(field, where):
    """Any one of EAGLE-3.1's fields set true (at the top or in eagle_config) is EAGLE-3.1; set false it is not."""
    for value, key in ((True, "sglang-eagle31"), (False, "sglang-eagle3")):
        cfg = tm.eagle3_draft_config()
        if where == "top":
            cfg[field] = value
        else:
            cfg["eagle_config"] = cfg["eagle_config"] | {field: value}
        found = D.classify(cfg)
        assert found is not None and found.layout.key == key, (field, where, value)
        if value:
            assert found.evidence.endswith(f", {field} true") and found.kind == D.KIND_EAGLE31


@pytest.mark.parametrize(
    "config, key",
    [
        ({"speculators_model_type": "eagle"}, "speculators-eagle"),  # the model type without its architecture
        ({"architectures": ["EagleSpeculator"]}, "speculators-eagle"),  # the architecture without the model type
        ({"architectures": ["LlamaForCausalLM"], "transformer_layer_config": _llama()}, "speculators-eagle3"),
        ({"architectures": ["Eagle3DraftModel"]}, "speculators-eagle3"),
        ({"architectures": ["Eagle3Speculator"]}, "speculators-eagle3"),
        ({"architectures": ["Qwen3ForCausalLM"], "dflash_config": {"mask_token_id": 3}}, "dflash"),
        ({"architectures": ["DFlashDraftModel", "Qwen3ForCausalLM"]}, "dflash"),
        ({"architectures": ["LlamaEagle3DraftModel", "LlamaForCausalLM"]}, "automodel-eagle3"),
        ({"architectures": ["LlamaEagleDraftModel", "LlamaForCausalLM"]}, "automodel-eagle"),
        ({"architectures": ["DeepseekV3ForCausalLMNextN", "DeepseekV3ForCausalLM"]}, "mtp-nextn"),
        ({"architectures": ["MiMoMTP"]}, "mtp-nextn"),  # sglang models/mimo_mtp.py
        ({"architectures": ["LlamaForCausalLM", "LlamaForCausalLMEagle"]}, "sglang-eagle"),
        ({"architectures": [], "hidden_size": H}, None),
        ({"hidden_size": H, "num_hidden_layers": 2}, None),
    ],
)
def test_a_config_with_only_one_mark_or_a_mixture_of_architectures_is_classified_by_its_mark(config, key):
    """Hostile configs: one mark of a layout is enough, and one layout's architecture among others names it."""
    assert _key(config) == key


def test_a_target_whose_mtp_layer_count_is_zero_is_no_draft_kind(tmp_path):
    cfg = DeepseekV3Config(hidden_size=H, num_hidden_layers=2, vocab_size=V, num_nextn_predict_layers=0).to_dict()
    cfg["architectures"] = ["DeepseekV3ForCausalLM"]
    assert D.classify(cfg) is None
    r = doctor(draft=_write(tmp_path / "t", cfg, {"model.norm.weight": torch.ones(H)}), sglang_version="0.5.9")
    assert "draft-kind" not in r.codes() and "draft_kind" not in r.facts


def test_the_fc_width_is_shown_as_states_times_hidden(tmp_path):
    """The doctor's draft-kind note says how many hidden states fc takes and the hidden size it read."""
    r = doctor(draft=eagle_repo_eagle3(tmp_path), sglang_version="0.5.9", with_patches=False)
    assert _kind_finding(r).found == f"fc.weight takes {3 * H} = 3 x hidden ({H}) inputs"


def test_an_fc_under_model_is_read_as_fc():
    cfg = _llama(architectures=["LlamaForCausalLM"])
    found = D.classify(cfg, {"model.fc.weight": (H, 4 * H)})
    assert found is not None and found.layout.key == "eagle-repo-eagle3"
    assert found.evidence == f"fc.weight takes {4 * H} = 4 x hidden ({H}) inputs"
    assert _key(cfg, {"model.fc.weight": (H, 2 * H)}) == "eagle-repo-eagle"


def test_a_finding_owns_an_unserved_layout_from_its_first_release_on():
    """The EAGLE-3.1 MLA draft: from 0.5.12 (the MLA class exists) draft-config-ignored reports it unserved; before,
    nothing owns it (draft-kind-not-served says it); a layout with no owner is never owned."""
    e31 = next(lay for lay in D.LAYOUTS if lay.key == "kimi-eagle31-mla")
    assert [e31.owned_by(v) for v in ("0.5.11", "0.5.12", "0.5.12.post1", "0.5.13")] == [
        None,
        "draft-config-ignored",
        "draft-config-ignored",
        "draft-config-ignored",
    ]
    assert all(lay.owned_by("0.5.23") is None for lay in D.LAYOUTS if lay.owner is None)


@pytest.mark.parametrize("flag", D.EAGLE31_FIELDS)
def test_one_eagle31_field_set_makes_an_mla_draft_eagle31(flag):
    cfg = {"architectures": [MLA_DRAFT_ARCH], flag: True}
    assert D.classify(cfg).layout.key == "kimi-eagle31-mla"
    assert D.classify({"architectures": [MLA_DRAFT_ARCH], flag: False}).layout.key == "kimi-eagle3-mla"
