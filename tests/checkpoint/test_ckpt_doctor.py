"""The doctor: a correct setup passes; every fault class is named (exit 1); bad files never crash it."""

from __future__ import annotations

import json

import pytest
import torch

from eagle3_patches.checkpoint import releases
from eagle3_patches.checkpoint.layer_ids import CONVENTION_KEY
from eagle3_patches.diagnostic import ERROR, INFO, WARNING
from eagle3_patches.doctor import MAX_FINDINGS_PER_CODE, doctor
from eagle3_patches.testing import tiny_models as tm

#: a release without the CUDA-graph order bug and with the Kimi delegation: isolates draft faults
CLEAN = "0.5.11"


def run(target, draft, version=CLEAN, **kw):
    return doctor(target, draft, sglang_version=version, **kw)


def assert_error(report, code):
    assert code in report.codes(ERROR), report.format()
    assert report.exit_code == 1
    assert "internal-error" not in report.codes(), report.format()


def assert_clean(report):
    assert report.ok, report.format()
    assert "internal-error" not in report.codes()


# ------------------------------------------------------------------ correct setups
def test_correct_tiny_setup_passes(tiny):
    r = run(tiny["deepseek_v3"], tiny["draft"])
    assert_clean(r)
    assert not r.warnings, r.format()
    assert r.facts["capture"]["captured_outputs"] == [1, 2, 3]


def test_correct_kimi_setup_passes_with_patches_on_059(tiny):
    r = run(tiny["kimi_k25"], tiny["draft"], "0.5.9", with_patches=True)
    assert_clean(r)
    assert {"kimi-k25-delegation", "cuda-graph-capture-order"} <= set(r.codes(INFO))


def test_cli_passes_correct_setup(cli, tiny):
    rc, out, err = cli("doctor", "--target", tiny["deepseek_v3"], "--draft", tiny["draft"], "--sglang-version", CLEAN)
    assert rc == 0, out + err
    assert "OK: 0 error(s)" in out


def test_cli_json(cli, tiny):
    rc, out, _ = cli(
        "doctor", "--json", "--target", tiny["deepseek_v3"], "--draft", tiny["draft"], "--sglang-version", CLEAN
    )
    data = json.loads(out)
    assert rc == 0 and data["ok"] is True and data["exit_code"] == 0
    assert all({"severity", "code", "what", "where", "fix"} <= set(f) for f in data["findings"])
    assert data["facts"]["sglang_version"] == CLEAN


# ------------------------------------------------------------------ algorithm
def test_eagle_algorithm_with_eagle3_draft(cli, tiny):
    r = run(tiny["deepseek_v3"], tiny["draft"], speculative_algorithm="EAGLE")
    assert_error(r, "algorithm-eagle-with-eagle3-draft")
    f = next(f for f in r.errors if f.code == "algorithm-eagle-with-eagle3-draft")
    assert "--speculative-algorithm EAGLE3" in f.fix
    rc, out, _ = cli(
        "doctor",
        "--target",
        tiny["deepseek_v3"],
        "--draft",
        tiny["draft"],
        "--sglang-version",
        CLEAN,
        "--",
        "--speculative-algorithm",
        "EAGLE",
    )
    assert rc == 1 and "--speculative-algorithm EAGLE3" in out


def test_nextn_with_eagle3_draft_too(tiny):
    assert_error(
        run(tiny["deepseek_v3"], tiny["draft"], speculative_algorithm="NEXTN"), "algorithm-eagle-with-eagle3-draft"
    )


def test_launch_without_algorithm_warns(tiny):
    r = run(tiny["deepseek_v3"], tiny["draft"], launch=["--tp", "1"])
    assert "no-speculation" in r.codes(WARNING)


# ------------------------------------------------------------------ aux layer ids
def test_aux_ids_missing(make_draft, tiny, DELETE):
    d = make_draft(config={"eagle_config": {"eagle_aux_hidden_state_layer_ids": DELETE}})
    r = run(tiny["deepseek_v3"], d)
    assert_error(r, "aux-ids-missing")
    assert "[2, 3, 3]" in r.errors[0].what or "before layers" in r.errors[0].what


def test_aux_ids_at_top_level_are_ignored_by_sglang(make_draft, tiny, DELETE):
    d = make_draft(
        config={
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": DELETE},
            "eagle_aux_hidden_state_layer_ids": [1, 2, 3],
        }
    )
    assert_error(run(tiny["deepseek_v3"], d), "aux-ids-ignored")


@pytest.mark.parametrize(
    "ids, what",
    [
        ((1, 2, 5), "ids [5] make sglang 0.5.11 capture before layers [6], which a 6-layer target never reaches"),
        ((2, 3, 6), "ids [6] make sglang 0.5.11 capture before layers [7], which a 6-layer target never reaches"),
        ((-1, 2, 3), "capture before layer 0, where residual is None"),
    ],
)
def test_aux_ids_out_of_range(make_draft, tiny, ids, what):
    # 6 layers: output-of-layer ids 0..4 are capturable on 0.5.9-0.5.12; 5 needs "before layer 6"; -1 -> before layer 0
    d = make_draft(spec=tm.TinyDraftSpec(aux_ids=ids))
    r = run(tiny["deepseek_v3"], d)
    assert_error(r, "aux-ids-out-of-range")
    f = next(f for f in r.errors if f.code == "aux-ids-out-of-range")
    assert what in f.what and f.expected == "output-of-layer ids in 0..4", r.format()


def test_aux_ids_in_range_edges(make_draft, tiny):
    d = make_draft(spec=tm.TinyDraftSpec(aux_ids=(0, 2, 4)))
    assert_clean(run(tiny["deepseek_v3"], d))


def test_aux_ids_duplicate(make_draft, tiny):
    d = make_draft(spec=tm.TinyDraftSpec(aux_ids=(1, 2, 2)))
    assert_error(run(tiny["deepseek_v3"], d), "aux-ids-duplicate")


def test_aux_ids_unsorted(make_draft, tiny):
    d = make_draft(spec=tm.TinyDraftSpec(aux_ids=(3, 1, 2)))
    assert_error(run(tiny["deepseek_v3"], d), "aux-ids-unsorted")


def test_aux_ids_meaning_changed_in_0513(make_draft, tiny):
    # stated output-of-layer ids [2,3,4]: 0.5.12 captures outputs 2,3,4; 0.5.13 uses them as-is -> outputs 1,2,3
    d = make_draft(
        spec=tm.TinyDraftSpec(aux_ids=(2, 3, 4)), config={"eagle_config": {CONVENTION_KEY: "output-of-layer"}}
    )
    assert_clean(run(tiny["deepseek_v3"], d, "0.5.12"))
    r = run(tiny["deepseek_v3"], d, "0.5.13")
    assert_error(r, "aux-ids-convention")
    f = next(f for f in r.errors if f.code == "aux-ids-convention")
    assert "[1, 2, 3]" in f.what and "[2, 3, 4]" in f.what
    assert "the draft config states the output-of-layer convention" in f.what
    assert f.found == "[2, 3, 4] (output-of-layer)"  # the ids as the config states them, and its convention
    assert "[3, 4, 5]" in f.fix and "input-of-layer" in f.fix  # what to write for 0.5.13


@pytest.mark.parametrize("with_target", [True, False])
def test_aux_ids_that_0513_cannot_express(make_draft, tiny, with_target):
    """Stated input-of-layer ids [1, 2, 3] (the outputs of layers 0, 1, 2): 0.5.13 adds 1 to a list whose first id
    is 1 (the outputs of 1, 2, 3), and no list it reads can mean the output of layer 0 first: the finding says
    so, with the target or from the draft alone."""
    d = make_draft(
        spec=tm.TinyDraftSpec(aux_ids=(1, 2, 3)), config={"eagle_config": {CONVENTION_KEY: "input-of-layer"}}
    )
    r = run(tiny["deepseek_v3"] if with_target else None, d, "0.5.13")
    assert_error(r, "aux-ids-convention")
    f = next(f for f in r.errors if f.code == "aux-ids-convention")
    assert "capture the outputs of layers [1, 2, 3]" in f.what and "the outputs of layers [0, 1, 2]" in f.what
    assert f.fix == "serve this draft on sglang <= 0.5.12, or retrain it on other layers"


def test_aux_ids_meaning_the_embeddings_on_a_known_target(make_draft, tiny):
    """Stated input-of-layer ids [0, 2, 3] (speculators' meaning: id 0 = the embeddings) on 0.5.9, which adds 1:
    the outputs of layers 0, 2, 3 are captured instead of -1, 1, 2; without a target to bound the ids the doctor
    says nothing of them."""
    d = make_draft(
        spec=tm.TinyDraftSpec(aux_ids=(0, 2, 3)), config={"eagle_config": {CONVENTION_KEY: "input-of-layer"}}
    )
    r = run(tiny["deepseek_v3"], d, "0.5.9")
    assert_error(r, "aux-ids-convention")
    assert "the outputs of layers [-1, 1, 2]" in next(f for f in r.errors if f.code == "aux-ids-convention").what
    assert "aux-ids-convention" not in run(None, d, "0.5.9").codes()


def test_aux_ids_first_id_one_keeps_plus_one_in_0513(make_draft, tiny):
    # the tiny draft's [1,2,3]: 0.5.13 still adds +1 because the first id is 1
    d = make_draft(config={"eagle_config": {CONVENTION_KEY: "output-of-layer"}})
    assert_clean(run(tiny["deepseek_v3"], d, "0.5.13"))


def test_aux_ids_unstated_convention_only_warns(make_draft, tiny):
    d = make_draft(spec=tm.TinyDraftSpec(aux_ids=(2, 3, 4)))
    r = run(tiny["deepseek_v3"], d, "0.5.13")
    assert "aux-ids-convention" in r.codes(WARNING) and r.ok
    f = next(f for f in r.findings if f.code == "aux-ids-convention")
    assert "the draft config is assumed to use the output-of-layer convention" in f.what


@pytest.mark.parametrize(
    "stated, environment, severity",
    [
        (True, None, INFO),  # the patch reads the recorded convention: fixed
        (False, None, WARNING),  # nothing recorded: sglang's rule stands, the warning stays
        (False, "output-of-layer", INFO),  # the environment names the convention
    ],
)
def test_aux_ids_convention_under_the_patch(make_draft, tiny, monkeypatch, stated, environment, severity):
    """On 0.5.13 with eagle3-patches, the ids' meaning is fixed only where the patch knows the convention."""
    from eagle3_patches import settings

    if environment:
        monkeypatch.setenv("EAGLE3_PATCHES_LAYER_ID_CONVENTION", environment)
    settings.reload()
    config = {"eagle_config": {CONVENTION_KEY: "output-of-layer"}} if stated else None
    d = make_draft(spec=tm.TinyDraftSpec(aux_ids=(2, 3, 4)), config=config)
    r = run(tiny["deepseek_v3"], d, "0.5.13", with_patches=True)
    assert [f.severity for f in r.findings if f.code == "aux-ids-convention"] == [severity], r.format()


def test_aux_ids_stated_input_of_layer_on_059(make_draft, tiny):
    d = make_draft(
        spec=tm.TinyDraftSpec(aux_ids=(2, 3, 4)), config={"eagle_config": {CONVENTION_KEY: "input-of-layer"}}
    )
    r = run(tiny["deepseek_v3"], d)
    assert_error(r, "aux-ids-convention")


def test_aux_disabled(make_draft, tiny):
    d = make_draft(config={"eagle_config": {"use_aux_hidden_state": False}})
    assert_error(run(tiny["deepseek_v3"], d), "aux-disabled")


@pytest.mark.parametrize("ids", [(1, 2, 3, 4), (1, 3)])
def test_aux_ids_count_on_059(make_draft, tiny, ids):
    """Before 0.5.12 fc is built for exactly 3 states: four ids or two are refused there, not from 0.5.12."""
    d = make_draft(spec=tm.TinyDraftSpec(aux_ids=ids))
    r = run(tiny["deepseek_v3"], d, "0.5.11")
    assert_error(r, "aux-ids-count")
    assert f"the draft lists {len(ids)} ids" in next(f for f in r.errors if f.code == "aux-ids-count").what
    assert "aux-ids-count" not in run(tiny["deepseek_v3"], d, "0.5.12").codes()


# ------------------------------------------------------------------ widths and sizes
@pytest.mark.parametrize("width, states", [(128, "2 states"), (160, "2.50 x hidden"), (256, "4 states")])
def test_fc_width(make_draft, tiny, width, states):
    """An fc.weight narrower or wider than the 3 x 64 the target delivers: the finding says how many of the
    target's states it takes, and which config list sets the 3."""

    def resize_fc(t):
        fc = t["fc.weight"]
        t["fc.weight"] = torch.cat([fc, fc], dim=1)[:, :width].contiguous()

    d = make_draft(tensors=resize_fc)
    r = run(tiny["deepseek_v3"], d)
    assert_error(r, "fc-width")
    finding = next(f for f in r.errors if f.code == "fc-width")
    assert finding.found == f"[{tm.HIDDEN}, {width}] ({states})"
    assert (
        finding.expected
        == f"[{tm.HIDDEN}, {3 * tm.HIDDEN}] (len(eagle_aux_hidden_state_layer_ids) = 3 x target hidden {tm.HIDDEN})"
    )
    assert finding.where.endswith("fc.weight")


def test_draft_hidden_vs_target_hidden(make_draft, tiny):
    d = make_draft(spec=tm.TinyDraftSpec(hidden=32, target_hidden=64))
    assert_error(run(tiny["deepseek_v3"], d), "hidden-mismatch")


def test_target_hidden_size_field(make_draft, tiny):
    d = make_draft(config={"target_hidden_size": 48})
    assert_error(run(tiny["deepseek_v3"], d), "target-hidden-size")


def test_vocab_mismatch(make_draft, tiny):
    d = make_draft(config={"vocab_size": 2048})
    assert_error(run(tiny["deepseek_v3"], d), "vocab-mismatch")


def test_draft_vocab_size_vs_d2t_length(make_draft, tiny):
    def short_d2t(t):
        t["d2t"] = t["d2t"][:200].contiguous()

    r = run(tiny["deepseek_v3"], make_draft(tensors=short_d2t))
    assert_error(r, "d2t-length")
    assert "draft_vocab_size=256" in next(f for f in r.errors if f.code == "d2t-length").what


def test_draft_vocab_size_vs_lm_head(make_draft, tiny):
    r = run(tiny["deepseek_v3"], make_draft(config={"draft_vocab_size": 200}))
    assert_error(r, "tensor-shape")


# ------------------------------------------------------------------ d2t
def _hot():
    return tm.hot_token_ids(tm.VOCAB, tm.DRAFT_VOCAB)


def _dup(d2t, hot):
    d2t = d2t.clone()
    d2t[1] = hot[0] - 1  # draft tokens 0 and 1 both map to target hot[0]
    return d2t


@pytest.mark.parametrize(
    "make_d2t, words",
    [
        (lambda hot: hot.clone(), "absolute target ids"),
        (lambda hot: hot - 2 * torch.arange(len(hot)), "arange subtracted twice"),
        (lambda hot: (hot - torch.arange(len(hot))) + 5000, "outside the target vocabulary"),
        (lambda hot: _dup(hot - torch.arange(len(hot)), hot), "already used"),
    ],
)
def test_d2t_invalid(make_draft, tiny, make_d2t, words):
    def bad(t):
        t["d2t"] = make_d2t(_hot()).to(torch.int64)

    r = run(tiny["deepseek_v3"], make_draft(tensors=bad))
    assert_error(r, "d2t-invalid")
    assert words in next(f for f in r.errors if f.code == "d2t-invalid").what


def test_d2t_float(make_draft, tiny):
    def bad(t):
        t["d2t"] = t["d2t"].float()

    assert_error(run(tiny["deepseek_v3"], make_draft(tensors=bad)), "d2t-invalid")


def test_d2t_missing(make_draft, tiny):
    assert_error(
        run(tiny["deepseek_v3"], make_draft(tensors=lambda t: {k: v for k, v in t.items() if k != "d2t"})),
        "d2t-missing",
    )


def test_full_vocab_draft_without_d2t_is_fine(make_draft, tiny):
    d = make_draft(spec=tm.TinyDraftSpec(draft_vocab=tm.VOCAB))
    assert_clean(run(tiny["deepseek_v3"], d))


def test_t2d_inconsistent_warns(make_draft, tiny):
    def bad(t):
        t["t2d"] = torch.roll(t["t2d"], 1)

    r = run(tiny["deepseek_v3"], make_draft(tensors=bad))
    assert "t2d-invalid" in r.codes(WARNING)


# ------------------------------------------------------------------ key naming
def _speculators_names(t):
    return {k.replace("midlayer.", "layers.0."): v for k, v in t.items()}


def test_layers0_names_on_059_stock(make_draft, tiny):
    d = make_draft(tensors=_speculators_names)
    r = run(tiny["deepseek_v3"], d, "0.5.9", launch=["--speculative-algorithm", "EAGLE3", "--disable-cuda-graph"])
    assert_error(r, "keys-speculators-names")
    assert "random init" in next(f for f in r.errors if f.code == "keys-speculators-names").what


def test_layers0_names_loaded_natively_from_0512_or_with_patches(make_draft, tiny):
    d = make_draft(tensors=_speculators_names)
    assert "keys-speculators-names" in run(tiny["deepseek_v3"], d, "0.5.12").codes(INFO)
    assert "keys-speculators-names" in run(tiny["deepseek_v3"], d, "0.5.9", with_patches=True).codes(INFO)


def test_layers0_names_found_lists_four_of_them(make_draft, tiny):
    d = make_draft(tensors=_speculators_names)
    f = next(f for f in run(tiny["deepseek_v3"], d, "0.5.9").errors if f.code == "keys-speculators-names")
    shown = f.found.removesuffix(" ...").split(", ")
    assert len(shown) == 4 and all(n.startswith("layers.0.") for n in shown) and f.found.endswith(" ..."), f.found
    n = sum(k.startswith("midlayer.") for k in tm.eagle3_draft_tensors(tm.TinyDraftSpec()))
    assert n > 4 and f.what.startswith(f"{n} tensor(s) are named layers.0.*"), f.what  # the count is of all of them


def test_layers0_names_note_under_the_patch_says_they_are_mapped(make_draft, tiny):
    d = make_draft(tensors=_speculators_names)
    note = next(
        f
        for f in run(tiny["deepseek_v3"], d, "0.5.9", with_patches=True).findings
        if f.code == "keys-speculators-names"
    )
    n = sum(k.startswith("midlayer.") for k in tm.eagle3_draft_tensors(tm.TinyDraftSpec()))
    assert note.what == (
        f"{n} tensor(s) are named layers.0.* (speculators' naming); eagle3-patches' strict loading "
        "maps them onto midlayer.*"
    ), note.what


@pytest.mark.parametrize("fields", [["num_attention_heads"], ["num_attention_heads", "num_key_value_heads"]])
def test_a_draft_config_without_its_head_count_is_reported_not_crashed(make_draft, tiny, fields):
    d = make_draft()
    cfg = json.loads((d / "config.json").read_text())
    for field in fields:
        cfg.pop(field)
    cfg["head_dim"] = tm.HIDDEN // 4
    (d / "config.json").write_text(json.dumps(cfg))
    r = run(tiny["deepseek_v3"], d)
    assert "draft-config-field" in r.codes() and "internal-error" not in r.codes(), r.format()


def test_a_draft_shard_without_tensors_misses_every_parameter(make_draft, tiny):
    from safetensors.torch import save_file

    d = make_draft()
    save_file({}, str(d / "model.safetensors"))
    f = next(f for f in run(tiny["deepseek_v3"], d).errors if f.code == "keys-missing")
    assert "fc.weight" in f.found and "midlayer.self_attn.q_proj.weight" in f.found, f.found


def test_a_tied_draft_needs_no_lm_head_of_its_own(tiny, tmp_path):
    """tie_word_embeddings: sglang's head is the embedding (taken from the target), whatever draft_vocab_size says."""
    spec = tm.TinyDraftSpec(draft_vocab=tm.VOCAB, extra_config={"tie_word_embeddings": True})
    t = tm.eagle3_draft_tensors(spec)
    t.pop("lm_head.weight")
    r = run(tiny["deepseek_v3"], tm.build_eagle3_draft(tmp_path / "tied", spec, tensors=t))
    assert_clean(r)
    assert "draft-tied-embeddings" in r.codes()


def test_unknown_keys_found_lists_six_of_them(make_draft, tiny):
    stray = [f"extra_{i}.weight" for i in range(7)]
    r = run(tiny["deepseek_v3"], make_draft(tensors=lambda t: t.update({n: torch.ones(4) for n in stray})))
    f = next(f for f in r.errors if f.code == "keys-unknown")
    assert f.what.startswith("7 tensor(s)"), f.what
    shown = f.found.removesuffix(" ...").split(", ")
    assert len(shown) == 6 and set(shown) <= set(stray) and f.found.endswith(" ..."), f.found


def test_unknown_keys(make_draft, tiny):
    def extra(t):
        t["input_norm.weight"] = torch.ones(192, dtype=torch.bfloat16)

    r = run(tiny["deepseek_v3"], make_draft(tensors=extra))
    assert_error(r, "keys-unknown")
    f = next(f for f in r.errors if f.code == "keys-unknown")
    assert "input_norm.weight" in f.found and "norm_before_fc" in f.fix


def test_missing_tensor(make_draft, tiny):
    r = run(
        tiny["deepseek_v3"],
        make_draft(tensors=lambda t: {k: v for k, v in t.items() if k != "midlayer.mlp.down_proj.weight"}),
    )
    assert_error(r, "keys-missing")
    assert "midlayer.mlp.down_proj.weight" in next(f for f in r.errors if f.code == "keys-missing").found


@pytest.mark.parametrize("n_missing", [8, 9])
def test_missing_tensors_listed_up_to_eight(make_draft, tiny, n_missing):
    layer = [
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
        "input_layernorm",
        "post_attention_layernorm",
    ]
    gone = [f"midlayer.{n}.weight" for n in layer[:n_missing]]
    r = run(tiny["deepseek_v3"], make_draft(tensors=lambda t: {k: v for k, v in t.items() if k not in gone}))
    f = next(f for f in r.errors if f.code == "keys-missing")
    assert f.what.startswith(f"{n_missing} parameter(s) are missing"), f.what
    shown = f.found.removesuffix(" ...").split(", ")
    assert len(shown) == 8 and set(shown) <= set(gone)
    assert f.found.endswith(" ...") == (n_missing > 8)


@pytest.mark.parametrize(
    "proj",
    ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj"],
)
def test_wrong_tensor_shape(make_draft, tiny, proj):
    name = f"midlayer.{proj}.weight"

    def bad(t):
        t[name] = t[name][:, :16].contiguous()

    r = run(tiny["deepseek_v3"], make_draft(tensors=bad))
    assert_error(r, "tensor-shape")
    assert any(name in f.what or name in f.found for f in r.errors if f.code == "tensor-shape"), r.format()


def test_speculators_format_given_to_doctor(make_draft, tiny):
    d = make_draft(speculators=True)
    r = run(tiny["deepseek_v3"], d)
    assert_error(r, "draft-speculators-format")
    assert "eagle3-patches convert" in next(f for f in r.errors if f.code == "draft-speculators-format").fix
    assert r.codes(ERROR) == ["draft-speculators-format"], r.format()  # everything else about it is fine


def test_speculators_unsupported_norms(make_draft, tiny, tmp_path):
    from eagle3_patches.convert import ConvertError, convert

    d = make_draft(speculators=True, config={"norm_before_residual": True})
    for with_patches in (False, True):  # no sglang runs it: refused at start under the patches too
        r = run(tiny["deepseek_v3"], d, with_patches=with_patches)
        assert_error(r, "draft-unsupported-architecture")
    with pytest.raises(ConvertError) as info:
        convert(d, tmp_path / "out", progress=False)
    f = next(f for f in r.errors if f.code == "draft-unsupported-architecture")
    # the same message; the release it names: the judged one (the doctor), the newest (the converter)
    assert f.what.split(" does not read")[1] == info.value.what.split(" does not read")[1]
    assert (f.found, f.expected, f.fix) == (
        info.value.found,
        info.value.expected,
        info.value.fix,
    )


# ------------------------------------------------------------------ speculators drafts served as they are
def test_a_speculators_draft_with_one_aux_id_is_noted_with_the_id_it_is_handed_as(setup):
    r = setup("one", spec=tm.TinyDraftSpec(aux_ids=(2,)), speculators=True, with_patches=True, version="0.5.9")
    f = next(f for f in r.findings if f.code == "draft-speculators-format")
    handed = "aux ids [3] (speculators' meaning) are handed to sglang 0.5.9 as [2] (the outputs of layers [2])"
    assert f.severity == INFO and handed in f.what


def test_speculators_draft_served_directly_under_the_patches(tiny, tmp_path):
    """The real speculators library's output: a note (speculators_draft_config reads it), nothing else to fix."""
    d = tm.build_speculators_fixture(tmp_path)
    for version in ("0.5.9", "0.5.12", "0.5.23"):
        r = run(tiny["kimi_k25"], d, version, with_patches=True)
        if version == "0.5.12":
            # Kimi-K2.5 serves images there, and its draft's prefill reads wrong rows for them: refused whatever the
            # draft (tests/patches/test_eagle3_image_draft_rows.py)
            assert r.codes(ERROR) == ["eagle3-image-draft-rows"], r.format()
        else:
            assert_clean(r)
        f = next(f for f in r.findings if f.code == "draft-speculators-format")
        assert f.severity == INFO and "speculators_draft_config" in f.what and "outputs of layers [1, 2, 3]" in f.what
    assert "handed to sglang 0.5.23 as [2, 3, 4]" in f.what  # sglang >= 0.5.13 reads input-of-layer ids
    assert_error(run(tiny["kimi_k25"], d, "0.5.9"), "draft-speculators-format")  # stock: cannot read it


@pytest.mark.parametrize(
    "disabled, version, severity",
    [
        ("speculators_draft_config", "0.5.9", ERROR),
        ("speculators_draft_config", "0.5.12", ERROR),
        ("eagle3_draft_strict_loading", "0.5.9", ERROR),  # layers.0.* would be dropped: refused at start
        ("eagle3_draft_strict_loading", "0.5.12", INFO),  # 0.5.12 maps layers.0.* itself
        ("all", "0.5.12", ERROR),
    ],
)
def test_speculators_draft_with_a_patch_disabled(tiny, make_draft, monkeypatch, disabled, version, severity):
    from eagle3_patches import settings

    monkeypatch.setenv("EAGLE3_PATCHES_DISABLE", disabled)
    settings.reload()
    r = run(tiny["kimi_k25"], make_draft(speculators=True), version, with_patches=True)
    assert [f.severity for f in r.findings if f.code == "draft-speculators-format"] == [severity], r.format()


def test_sharded_draft(make_draft, tiny):
    assert_clean(run(tiny["deepseek_v3"], make_draft(shards=3)))


# ------------------------------------------------------------------ dtypes
@pytest.mark.parametrize("edit", [{"torch_dtype": "float32"}, {"torch_dtype": None}])
def test_float32_or_unstated_draft_dtype(make_draft, tiny, edit):
    r = run(tiny["deepseek_v3"], make_draft(config=edit))
    assert_error(r, "dtype-mismatch")
    assert "float16" in next(f for f in r.errors if f.code == "dtype-mismatch").what


def test_dtype_flag_fixes_it(make_draft, tiny):
    r = run(
        tiny["deepseek_v3"],
        make_draft(config={"torch_dtype": "float32"}),
        launch=["--speculative-algorithm", "EAGLE3", "--dtype", "bfloat16"],
    )
    assert "dtype-mismatch" not in r.codes()


def _transformers_loads(tmp_path, fields: dict) -> bool:
    from transformers import AutoConfig

    d = tmp_path / "transformers-config"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64, **fields}))
    try:
        AutoConfig.from_pretrained(str(d))
    except AttributeError:
        return False
    return True


STATED_DTYPES = [
    {"torch_dtype": "bfloat16"},
    {"torch_dtype": "half"},
    {"dtype": "float32"},
    {"torch_dtype": "double"},
    {"torch_dtype": "BFloat16"},
    {"torch_dtype": "torch.bfloat16"},
    {"dtype": "FLOAT16"},
    {"torch_dtype": "bf16"},
    {"dtype": "bfloat16", "torch_dtype": "BFloat16"},  # transformers keeps dtype, and never looks torch_dtype up
    {"dtype": "Float32", "torch_dtype": "float32"},
]


@pytest.mark.parametrize("fields", STATED_DTYPES, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
def test_a_config_dtype_transformers_refuses_is_an_error_on_either_side(make_draft, make_target, tmp_path, fields):
    """The doctor refuses exactly the dtype strings the installed transformers stops loading a config at."""
    loads = _transformers_loads(tmp_path, fields)
    base = {"torch_dtype": None, "dtype": None}
    draft_side = run(make_target(config={"torch_dtype": "bfloat16"}), make_draft(config={**base, **fields}))
    target_side = run(make_target(config={**base, **fields}, name="t2"), make_draft(config={"torch_dtype": "bfloat16"}))
    for r, side, cfg in ((draft_side, "draft", "draft/config.json"), (target_side, "target", "t2/config.json")):
        found = [f for f in r.errors if f.code == "config-dtype"]
        assert bool(found) is not loads, (fields, r.format())
        if found:
            (f,) = found
            key = "dtype" if fields.get("dtype") is not None else "torch_dtype"
            assert f.where.endswith(f"{cfg}: {key}") and f.found == repr(fields[key]) and side in f.what
            close = fields[key].removeprefix("torch.").lower()
            assert f.fix == f'write "{key}": "{close if close in ("bfloat16", "float16", "float32") else "bfloat16"}"'
            assert "dtype-mismatch" not in r.codes()  # one error for one fault


def test_a_config_dtype_that_is_no_string_is_an_error(make_draft):
    f = _one(run(None, make_draft(config={"torch_dtype": ["bfloat16"] * 100})), "config-dtype")
    assert f.severity == ERROR and f.found == repr(["bfloat16"] * 100)[:80]
    assert "takes the value for a torch dtype" in f.what
    assert f.fix == 'write "torch_dtype": "bfloat16"'


def test_the_draft_s_dtype_error_says_it_stops_the_server_after_the_target_has_loaded(make_draft, make_target):
    r = run(make_target(config={"torch_dtype": "BFloat16"}), make_draft(config={"torch_dtype": "BFloat16"}))
    draft, target = sorted((f for f in r.errors if f.code == "config-dtype"), key=lambda f: "target" in f.what)
    assert draft.what.endswith(" (the draft loads after the target)") and "draft's" in draft.what
    assert not target.what.endswith("(the draft loads after the target)") and "target's" in target.what


def test_a_multimodal_target_s_own_dtype_is_named_at_the_top_of_its_config(make_draft, make_target):
    r = run(make_target("kimi_k25", config={"torch_dtype": "BFloat16"}), make_draft())
    (f,) = [f for f in r.errors if f.code == "config-dtype"]
    assert f.where.endswith("config.json: torch_dtype")  # not text_config.torch_dtype


@pytest.mark.parametrize(("flag", "runs"), [("half", "float16"), ("float", "float32"), ("bfloat16", "bfloat16")])
def test_the_dtype_flag_is_read_as_sglang_s_choices_name_it(make_draft, make_target, flag, runs):
    r = run(make_target(config={"torch_dtype": "bfloat16"}), make_draft(), launch=f"--dtype {flag}")
    assert r.facts["draft_dtype"]["dtype"] == runs


def test_a_multimodal_target_s_text_config_dtype_is_checked(make_draft, make_target):
    r = run(make_target("kimi_k25", config={"text_config": {"torch_dtype": "torch.bfloat16"}}), make_draft())
    (f,) = [f for f in r.errors if f.code == "config-dtype"]
    assert f.where.endswith("config.json: text_config.torch_dtype") and "target" in f.what


def test_a_draft_config_without_its_head_count_is_one_error_not_a_shape_error_per_projection(make_draft):
    """The attention projections' shapes need the head count: unknown, they are not judged (the missing field is
    the finding), while the shapes that do not need it still are."""
    drop = ("num_attention_heads", "num_key_value_heads")
    r = run(None, make_draft(config=lambda cfg: {k: v for k, v in cfg.items() if k not in drop}))
    assert "draft-config-field" in r.codes(ERROR)
    assert not [f for f in r.findings if f.code == "tensor-shape"], r.format()


def test_integer_weight_dtype(make_draft, tiny):
    def bad(t):
        t["norm.weight"] = t["norm.weight"].to(torch.int16)

    assert_error(run(tiny["deepseek_v3"], make_draft(tensors=bad)), "tensor-dtype")


# ------------------------------------------------------------------ target and release
def test_kimi_wrapper_on_059_without_patches(tiny):
    r = run(
        tiny["kimi_k25"], tiny["draft"], "0.5.9", launch=["--speculative-algorithm", "EAGLE3", "--disable-cuda-graph"]
    )
    assert_error(r, "kimi-k25-delegation")
    assert "eagle3-patches run" in next(f for f in r.errors if f.code == "kimi-k25-delegation").fix
    assert "kimi-k25-delegation" not in run(tiny["kimi_k25"], tiny["draft"], "0.5.10").codes()


def test_kimi_wrapper_on_058(tiny):
    assert_error(run(tiny["kimi_k25"], tiny["draft"], "0.5.8", with_patches=True), "kimi-k25-unsupported")


def test_tp_with_allreduce_fusion(tiny):
    # DeepseekV3ForCausalLM: sglang turns the fusion on by itself (sm90/sm100, single node)
    r = run(tiny["deepseek_v3"], tiny["draft"], tp=2)
    assert_error(r, "tp-allreduce-fusion")
    assert "tp-allreduce-fusion" not in run(tiny["deepseek_v3"], tiny["draft"], "0.5.14", tp=2).codes()
    assert "tp-allreduce-fusion" in run(tiny["deepseek_v3"], tiny["draft"], tp=2, with_patches=True).codes(INFO)
    # dp-attention keeps sglang from turning it on; the explicit flag turns it on anyway
    flags = ["--speculative-algorithm", "EAGLE3", "--tp", "2"]
    assert (
        "tp-allreduce-fusion"
        not in run(tiny["deepseek_v3"], tiny["draft"], launch=flags + ["--enable-dp-attention"]).codes()
    )
    r = run(
        tiny["deepseek_v3"],
        tiny["draft"],
        launch=flags + ["--enable-dp-attention", "--enable-flashinfer-allreduce-fusion"],
    )
    assert_error(r, "tp-allreduce-fusion")


def test_tp_allreduce_fusion_names_who_turned_it_on(tiny):
    """The finding points at the flag the user passed, or at --tp-size when sglang turns the fusion on by itself,
    and its fix fits: drop the flag, or (0.5.9 has no flag to turn the automatic fusion off) the patch."""
    flags = ["--speculative-algorithm", "EAGLE3", "--tp", "2"]
    explicit = next(
        f
        for f in run(
            tiny["kimi_k25"],
            tiny["draft"],
            launch=flags + ["--enable-dp-attention", "--enable-flashinfer-allreduce-fusion"],
        ).errors
        if f.code == "tp-allreduce-fusion"
    )
    assert (explicit.where, explicit.found) == (
        "--enable-flashinfer-allreduce-fusion",
        "--enable-flashinfer-allreduce-fusion",
    )
    assert explicit.fix.endswith("; or drop --enable-flashinfer-allreduce-fusion"), explicit.fix
    auto = next(f for f in run(tiny["kimi_k25"], tiny["draft"], launch=flags).errors if f.code == "tp-allreduce-fusion")
    assert auto.where == "--tp-size"
    assert auto.found.startswith("sglang turns it on by itself for KimiK25ForConditionalGeneration on sm90/sm100"), (
        auto.found
    )
    assert auto.fix.endswith("(0.5.9 has no flag to turn the automatic fusion off)"), auto.fix


def test_tp_allreduce_fusion_follows_the_releases_list(make_target, tiny):
    """sglang 0.5.11 added Qwen3-Next to the models it turns the fusion on for: a TP 2 EAGLE3 launch of one is
    flagged there, not on 0.5.10 (the fusion stays off); the explicit flag is flagged on both."""
    target = make_target(config={"architectures": ["Qwen3NextForCausalLM"]})
    assert "tp-allreduce-fusion" in run(target, tiny["draft"], "0.5.11", tp=2).codes(ERROR)
    assert "tp-allreduce-fusion" not in run(target, tiny["draft"], "0.5.10", tp=2).codes()
    flags = ["--speculative-algorithm", "EAGLE3", "--tp", "2", "--enable-flashinfer-allreduce-fusion"]
    assert "tp-allreduce-fusion" in run(target, tiny["draft"], "0.5.10", launch=flags).codes(ERROR)


@pytest.mark.parametrize(
    "launch",
    [
        ["--tp", "2"],  # no speculation: nothing is captured mid-model
        [
            "--speculative-algorithm",
            "EAGLE3",
            "--tp",
            "2",
            "--moe-a2a-backend",
            "deepep",
        ],  # sglang leaves the fusion off
        ["--speculative-algorithm", "EAGLE3", "--tp", "2", "--nnodes", "2"],  # so it does across nodes
    ],
)
def test_no_tp_allreduce_fusion_finding_where_nothing_breaks(tiny, launch):
    assert "tp-allreduce-fusion" not in run(tiny["deepseek_v3"], tiny["draft"], launch=launch).codes()


def test_two_batch_overlap(cli, tiny):
    rc, out, _ = cli(
        "doctor",
        "--sglang-version",
        CLEAN,
        "--",
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        tiny["deepseek_v3"],
        "--speculative-draft-model-path",
        tiny["draft"],
        "--speculative-algorithm",
        "EAGLE3",
        "--enable-two-batch-overlap",
    )
    assert rc == 1 and "[two-batch-overlap]" in out


def test_pipeline_parallel(tiny):
    assert_error(
        run(tiny["deepseek_v3"], tiny["draft"], launch="--speculative-algorithm EAGLE3 --pp-size 2"),
        "pipeline-parallel",
    )
    assert_error(run(tiny["deepseek_v3"], tiny["draft"], pp=2), "pipeline-parallel")


@pytest.mark.parametrize("flags", ["--enable-two-batch-overlap", "--pp-size 2"])
def test_parallel_modes_judged_only_where_eagle3_capture_runs(tiny, flags):
    """Not for the converter's check of its output (checkpoints only), nor where no aux capture runs (STANDALONE)."""
    for algorithm, checkpoint_only in (("EAGLE3", True), ("STANDALONE", False)):
        r = run(
            tiny["deepseek_v3"],
            tiny["draft"],
            launch=f"--speculative-algorithm {algorithm} {flags}",
            checkpoint_only=checkpoint_only,
        )
        assert not {"two-batch-overlap", "pipeline-parallel"} & set(r.codes()), r.format()


def test_cuda_graph_capture_order(tiny):
    r = run(tiny["deepseek_v3"], tiny["draft"], "0.5.9")
    assert_error(r, "cuda-graph-capture-order")
    ok = run(
        tiny["deepseek_v3"],
        tiny["draft"],
        "0.5.9",
        launch=["--speculative-algorithm", "EAGLE3", "--disable-cuda-graph"],
    )
    assert_clean(ok)
    assert "cuda-graph-capture-order" in run(tiny["deepseek_v3"], tiny["draft"], "0.5.9", with_patches=True).codes(INFO)


def test_cuda_graph_defaults_equal_configured(make_draft, make_target, tiny):
    # 12 layers: defaults [2, 6, 9] = configured [1, 5, 8] + 1 -> nothing to report
    t = make_target(config={"num_hidden_layers": 12})
    d = make_draft(spec=tm.TinyDraftSpec(aux_ids=(1, 5, 8)))
    assert "cuda-graph-capture-order" not in run(t, d, "0.5.9").codes()


def test_cuda_graph_capture_order_fires_whichever_side_the_configured_layers_lie(make_draft, tiny):
    # above the 6-layer defaults [2, 3, 3] (the draft of tiny["draft"]) and below them: [0, 1, 2] + 1
    low = make_draft("low", spec=tm.TinyDraftSpec(aux_ids=(0, 1, 2)))
    for draft in (tiny["draft"], low):
        r = run(tiny["deepseek_v3"], draft, "0.5.9")
        assert_error(r, "cuda-graph-capture-order")
        assert "graphs: before layers [2, 3]" in next(f for f in r.errors if f.code == "cuda-graph-capture-order").found


def test_cuda_graph_capture_order_silent_where_graphs_capture_what_eager_does(make_draft, make_target, tiny, DELETE):
    """Each case differs from the firing one (tiny DeepSeek-V3 + aux ids [1, 2, 3] on 0.5.9) in one thing."""
    eagle1 = make_draft(
        "eagle1", config={"architectures": ["LlamaForCausalLMEagle"], "eagle_config": {"use_aux_hidden_state": DELETE}}
    )
    cases = {
        "only the checkpoints judged": run(tiny["deepseek_v3"], tiny["draft"], "0.5.9", checkpoint_only=True),
        "STANDALONE: no aux capture at all": run(
            tiny["deepseek_v3"], tiny["draft"], "0.5.9", launch=["--speculative-algorithm", "STANDALONE"]
        ),
        "the draft names no ids (the defaults both ways)": run(
            tiny["deepseek_v3"],
            make_draft("defaults", config={"eagle_config": {"eagle_aux_hidden_state_layer_ids": DELETE}}),
            "0.5.9",
        ),
        "a speculators draft stock 0.5.9 cannot read (that error first)": run(
            tiny["deepseek_v3"], make_draft("spec", speculators=True), "0.5.9"
        ),
        "an EAGLE-1 draft (not an EAGLE-3 one)": run(tiny["deepseek_v3"], eagle1, "0.5.9"),
        "the target's layer count unknown": run(
            make_target(config={"num_hidden_layers": DELETE}), tiny["draft"], "0.5.9"
        ),
    }
    for why, r in cases.items():
        assert "cuda-graph-capture-order" not in r.codes(), f"{why}: {r.format()}"
        assert "internal-error" not in r.codes(), f"{why}: {r.format()}"


def test_wrapped_launch_command_means_patches(tiny):
    cmd = (
        "EAGLE3_PATCHES_ENABLE=x eagle3-patches run -- python3 -m sglang.launch_server --model-path "
        f"{tiny['kimi_k25']} "
        f"--speculative-algorithm EAGLE3 --speculative-draft-model-path {tiny['draft']} --mem-fraction-static 0.8"
    )
    r = doctor(launch=cmd, sglang_version="0.5.9")
    assert r.facts["with_patches"] is True
    assert_clean(r)


def test_path_differs_from_launch(tiny):
    r = run(
        tiny["deepseek_v3"],
        tiny["draft"],
        launch=["--speculative-algorithm", "EAGLE3", "--model-path", str(tiny["kimi_k25"])],
    )
    assert "path-differs-from-launch" in r.codes(WARNING)


# ------------------------------------------------------------------ unreadable inputs never crash
def _draft_copy(make_draft):
    return make_draft("broken")


def test_truncated_safetensors(make_draft, tiny, cli):
    d = _draft_copy(make_draft)
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[:5000])
    r = run(tiny["deepseek_v3"], d)
    assert_error(r, "safetensors-header")
    rc, out, err = cli("doctor", "--target", tiny["deepseek_v3"], "--draft", d, "--sglang-version", CLEAN)
    assert rc == 1 and "Traceback" not in out + err and "truncated" in out


def test_truncated_data_region(make_draft, tiny):
    d = _draft_copy(make_draft)
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-10])
    r = run(tiny["deepseek_v3"], d)
    assert_error(r, "safetensors-header")
    assert "keys-missing" not in r.codes()  # an unreadable shard is not "missing tensors"


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda b: (2**40).to_bytes(8, "little") + b[8:],  # implausible length
        lambda b: b[:8] + b"\xff\xfe" + b[10:],  # not UTF-8
        lambda b: b[:8] + b"[" + b[9:],  # not JSON
        lambda b: b[:3],  # shorter than the length prefix
        lambda b: b"",
    ],
)
def test_corrupted_safetensors_header(make_draft, tiny, corrupt):
    d = _draft_copy(make_draft)
    f = d / "model.safetensors"
    f.write_bytes(corrupt(f.read_bytes()))
    assert_error(run(tiny["deepseek_v3"], d), "safetensors-header")


def test_corrupted_target_shard(tmp_path, tiny):
    t = tmp_path / "t"
    t.mkdir()
    (t / "config.json").write_text((tiny["deepseek_v3"] / "config.json").read_text())
    (t / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    assert_error(run(t, tiny["draft"]), "safetensors-header")


def test_missing_config_json(make_draft, tiny, cli):
    d = _draft_copy(make_draft)
    (d / "config.json").unlink()
    r = run(tiny["deepseek_v3"], d)
    assert_error(r, "config-json")
    rc, out, err = cli("doctor", "--target", tiny["deepseek_v3"], "--draft", d)
    assert rc == 1 and "no config.json" in out and "Traceback" not in out + err


@pytest.mark.parametrize("text", ["{", "[1, 2]", "", "\x00\x01", '{"hidden_size": "big"}', "null"])
def test_malformed_config_json(make_draft, tiny, text):
    d = _draft_copy(make_draft)
    (d / "config.json").write_text(text)
    r = run(tiny["deepseek_v3"], d)
    assert r.exit_code == 1 and "internal-error" not in r.codes(), r.format()


def test_malformed_target_config(make_target, tiny):
    t = make_target(config={"num_hidden_layers": "sixty-one"})
    r = run(t, tiny["draft"])
    assert_error(r, "target-config-field")


def test_directory_that_is_not_a_checkpoint(tmp_path, tiny, cli):
    (tmp_path / "notes.txt").write_text("hello")
    r = run(tmp_path, tiny["draft"])
    assert_error(r, "not-a-checkpoint")
    rc, out, err = cli("doctor", "--target", tmp_path, "--draft", tiny["draft"])
    assert rc == 1 and "is not a checkpoint" in out and "Traceback" not in out + err


def test_nonexistent_path_and_file_path(tmp_path, tiny):
    assert_error(run(tmp_path / "nope", tiny["draft"]), "not-a-checkpoint")
    assert_error(run(tiny["deepseek_v3"], tiny["draft"] / "model.safetensors"), "not-a-checkpoint")
    # a config.json path is accepted as its directory
    assert_clean(run(tiny["deepseek_v3"] / "config.json", tiny["draft"]))


def test_index_naming_a_missing_shard(make_draft, tiny):
    d = make_draft("sharded", shards=2)
    (d / "model-00002-of-00002.safetensors").unlink()
    assert_error(run(tiny["deepseek_v3"], d), "safetensors-index")


def test_malformed_index(make_draft, tiny):
    d = make_draft("sharded", shards=2)
    (d / "model.safetensors.index.json").write_text('{"weight_map": {"fc.weight": "../../etc/passwd"}}')
    assert_error(run(tiny["deepseek_v3"], d), "safetensors-index")


# ------------------------------------------------------------------ usage
@pytest.mark.parametrize(
    "argv",
    [
        ["doctor"],
        ["doctor", "--target", "x", "--sglang-version", "not.a.version!"],
        ["doctor", "--target", "x", "--tp", "0"],
        ["doctor", "--target", "x", "--speculative-algorithm", "MEDUSA"],
        ["doctor", "--target", "x", "--command", "vllm serve x"],
        ["doctor", "--target", "x", "--command", "python -m sglang.launch_server", "--", "--tp", "2"],
        ["doctor", "--", "--tp", "two"],
    ],
)
def test_usage_errors_exit_2(cli, argv):
    rc, out, err = cli(*argv)
    assert rc == 2, out + err
    assert "Traceback" not in out + err


def test_the_default_check_reads_every_target_header(tiny):
    r = run(tiny["deepseek_v3"], tiny["draft"])
    assert_clean(r)
    assert r.facts["target_headers_read"].startswith("1 of 1")


def test_report_text_has_severity_what_where_fix(tiny):
    text = run(tiny["deepseek_v3"], tiny["draft"], speculative_algorithm="EAGLE").format()
    assert "ERROR   [algorithm-eagle-with-eagle3-draft]" in text
    assert "where:" in text and "fix:" in text and "FAIL: 1 error(s)" in text


def test_raise_for_errors_gives_a_config_error(tiny):
    from eagle3_patches.errors import Eagle3ConfigError

    with pytest.raises(Eagle3ConfigError, match="EAGLE3|--speculative-algorithm"):
        run(tiny["deepseek_v3"], tiny["draft"], speculative_algorithm="EAGLE").raise_for_errors()


# ------------------------------------------------------------------ quantized drafts (strict loading's rule)
@pytest.mark.parametrize("kind", ["fp8", "w8a8-fp8", "w4a16"])
def test_quantized_drafts_pass_as_sglang_loads_them(tiny, tmp_path, kind):
    """The layouts sglang's quantization methods load (tests/patches/test_eagle3_draft_strict_loading.py loads
    the same files through sglang): their scales and packed weights are not unknown keys, a packed projection
    is not missing its weight."""
    from eagle3_patches.testing.quantized_drafts import build_quantized_draft

    r = run(tiny["deepseek_v3"], build_quantized_draft(tmp_path / kind, kind))
    assert not {"keys-unknown", "keys-missing", "tensor-dtype"} & set(r.codes()), r.format()
    assert_clean(r)


def test_kv_scales_in_their_checkpoint_spellings_are_not_unknown_keys(tiny, tmp_path):
    t = tm.eagle3_draft_tensors(tm.TinyDraftSpec())
    t["midlayer.self_attn.k_proj.k_scale"] = torch.tensor(0.125)
    t["midlayer.self_attn.v_proj.v_scale"] = torch.tensor(0.25)
    r = run(tiny["deepseek_v3"], tm.build_eagle3_draft(tmp_path / "kv", tensors=t))
    assert_clean(r)


#: what quantizers write next to a projection's weight: fp8 (sglang's Fp8Config: weight_scale, input_scale; the
#: block-quantized DeepSeek layout: weight_scale_inv) and compressed-tensors (weight_packed, weight_shape, the
#: asymmetric weight_zero_point, GPTQ's act-order weight_g_idx)
QUANTIZER_SUFFIXES = [
    "weight_scale",
    "weight_scale_inv",
    "input_scale",
    "weight_packed",
    "weight_shape",
    "weight_zero_point",
    "weight_g_idx",
]
#: kv-cache scales as checkpoints spell them (sglang's maybe_remap_kv_scale_name: modelopt, compressed-tensors, quark)
KV_SCALE_SPELLINGS = [
    "self_attn.k_scale",
    "self_attn.v_scale",
    "self_attn.kv_scale",
    "self_attn.k_proj.k_scale",
    "self_attn.v_proj.v_scale",
    "self_attn.q_proj.output_scale",
    "self_attn.k_proj.output_scale",
    "self_attn.v_proj.output_scale",
    "self_attn.prob_output_scale",
]


def test_every_quantizer_and_kv_scale_spelling_is_a_known_tensor(tiny, tmp_path):
    """A quantized draft may carry any of them: none is reported as a key sglang would drop."""
    from eagle3_patches.testing.quantized_drafts import QUANT_TENSORS, build_quantized_draft

    t = QUANT_TENSORS["fp8"](tm.eagle3_draft_tensors(tm.TinyDraftSpec()))
    for proj in ("self_attn.q_proj", "mlp.up_proj"):
        t.update(
            {
                f"midlayer.{proj}.{suffix}": torch.tensor(1.0)
                for suffix in QUANTIZER_SUFFIXES
                if f"midlayer.{proj}.{suffix}" not in t
            }
        )
    t.update({f"midlayer.{name}": torch.tensor(1.0) for name in KV_SCALE_SPELLINGS})
    r = run(tiny["deepseek_v3"], build_quantized_draft(tmp_path / "every-spelling", "fp8", tensors=t))
    assert "keys-unknown" not in r.codes(), r.format()


def _fused(t, bad_rows=0):
    """q/k/v and gate/up stored fused, as sglang's own state dict names them (``bad_rows``: rows cut off qkv)."""
    m = "midlayer."
    qkv = torch.cat([t.pop(f"{m}self_attn.{p}_proj.weight") for p in "qkv"])
    t[m + "self_attn.qkv_proj.weight"] = qkv[: len(qkv) - bad_rows].contiguous()
    t[m + "mlp.gate_up_proj.weight"] = torch.cat([t.pop(f"{m}mlp.{p}_proj.weight") for p in ("gate", "up")])


def test_pre_fused_projections_pass_as_sglang_loads_them(make_draft, tiny):
    """tests/patches/test_eagle3_draft_strict_loading.py loads such a draft through sglang, stock and patched."""
    assert_clean(run(tiny["deepseek_v3"], make_draft(tensors=_fused)))


def test_pre_fused_projection_of_the_wrong_shape(make_draft, tiny):
    r = run(tiny["deepseek_v3"], make_draft(tensors=lambda t: _fused(t, bad_rows=8)))
    assert_error(r, "tensor-shape")
    assert any("qkv_proj" in f.what + f.found for f in r.errors if f.code == "tensor-shape"), r.format()


def test_quantization_names_without_a_quantization_config_are_unknown(tiny, tmp_path):
    """sglang builds no scale parameters for a draft that says it is not quantized: it would drop them."""
    t = tm.eagle3_draft_tensors(tm.TinyDraftSpec())
    t["midlayer.self_attn.q_proj.weight_scale"] = torch.tensor(1.0)
    r = run(tiny["deepseek_v3"], tm.build_eagle3_draft(tmp_path / "stray-scale", tensors=t))
    assert_error(r, "keys-unknown")
    assert "q_proj.weight_scale" in next(f for f in r.errors if f.code == "keys-unknown").found


def test_a_quantized_draft_missing_a_projection_is_still_refused(tiny, tmp_path):
    from eagle3_patches.testing.quantized_drafts import QUANT_TENSORS, build_quantized_draft

    t = QUANT_TENSORS["w4a16"](tm.eagle3_draft_tensors(tm.TinyDraftSpec()))
    for suffix in ("weight_packed", "weight_scale", "weight_shape"):
        t.pop(f"midlayer.mlp.down_proj.{suffix}")
    r = run(tiny["deepseek_v3"], build_quantized_draft(tmp_path / "w4a16-missing", "w4a16", tensors=t))
    assert_error(r, "keys-missing")
    assert "down_proj.weight" in next(f for f in r.errors if f.code == "keys-missing").found


# ------------------------------------------------------------------ findings each check must and must not make
def _one(report, code):
    found = [f for f in report.findings if f.code == code]
    assert len(found) == 1, report.format()
    return found[0]


def _without(key):
    return lambda cfg: {k: v for k, v in cfg.items() if k != key}


_MODEL = lambda cfg: {**_without("eagle_config")(cfg), "architectures": ["LlamaForCausalLM"]}  # noqa: E731 - a plain llama
_EAGLE1 = lambda cfg: {**_without("eagle_config")(cfg), "architectures": ["LlamaForCausalLMEagle"]}  # noqa: E731


def _eagle1_fc(t):  # EAGLE-1/2's fc takes [embedding, hidden]: 2 x hidden, not 3
    t["fc.weight"] = t["fc.weight"][:, : 2 * tm.HIDDEN].contiguous()


def _embed(t):
    t["embed_tokens.weight"] = torch.ones(tm.VOCAB, tm.HIDDEN, dtype=torch.bfloat16)


#: code, severity, then the draft (config edit, tensor edit, spec) and run arguments that fire it and the ones one step
#: away that must not
CHECKS = {
    "draft-num-layers": (ERROR, dict(config={"num_hidden_layers": 2}), dict(config={"num_hidden_layers": 1})),
    "draft-config-field": (ERROR, dict(config=_without("model_type")), dict(config={"model_type": "llama"})),
    "draft-architecture": (WARNING, dict(config={"architectures": ["MyEagle3Draft"]}), dict()),
    "draft-not-eagle3": (WARNING, dict(config=_MODEL), dict(config=_EAGLE1)),
    "algorithm-eagle3-with-non-eagle3-draft": (
        ERROR,
        dict(config=_EAGLE1, tensors=_eagle1_fc),
        dict(config=_MODEL),  # a plain llama whose fc takes 3 x hidden: the EAGLE repository's EAGLE-3 layout
    ),
    "hidden-mismatch": (ERROR, dict(spec=tm.TinyDraftSpec(hidden=2 * tm.HIDDEN)), dict()),
    "t2d-missing": (WARNING, dict(tensors=lambda t: t.pop("t2d")), dict(spec=tm.TinyDraftSpec(draft_vocab=tm.VOCAB))),
    "embed-from-target": (INFO, dict(), dict(tensors=_embed)),
    "dtype-float32-draft": (WARNING, dict(config={"torch_dtype": "float32"}, target=None), dict(target=None)),
    # sglang's auto rule runs a float32 draft in float16: fine with a float16 target
    "dtype-mismatch": (
        ERROR,
        dict(config={"torch_dtype": "float32"}),
        dict(config={"torch_dtype": "float32"}, target={"torch_dtype": "float16"}),
    ),
    "config-dtype": (ERROR, dict(config={"torch_dtype": "BFloat16"}), dict(config={"torch_dtype": "bfloat16"})),
    "aux-ids-capture": (INFO, dict(), dict(target=None)),
    "aux-ids-convention-assumed": (INFO, dict(), dict(config={"eagle_config": {CONVENTION_KEY: "output-of-layer"}})),
    "target-hidden-size": (
        ERROR,
        dict(config={"target_hidden_size": 2 * tm.HIDDEN}),
        dict(config={"target_hidden_size": tm.HIDDEN}),
    ),
    "tensor-dtype-cast": (
        INFO,
        dict(tensors=lambda t: t.update({k: v.float() for k, v in t.items() if v.is_floating_point()})),
        dict(),
    ),
    "algorithm-not-eagle": (INFO, dict(speculative_algorithm="STANDALONE"), dict(speculative_algorithm="EAGLE3")),
    "sglang-version-unknown": (
        INFO,
        dict(
            version=".".join(map(str, (*releases.NEWEST_CHECKED.release[:2], releases.NEWEST_CHECKED.release[2] + 1)))
        ),
        dict(version=str(releases.NEWEST_CHECKED)),
    ),
    "aux-ids-invalid": (ERROR, dict(config={"eagle_config": {"eagle_aux_hidden_state_layer_ids": []}}), dict()),
    "draft-vocab-missing": (WARNING, dict(config=_without("draft_vocab_size")), dict()),
}


@pytest.fixture
def setup(make_draft, make_target, tiny):
    """``setup(name, config=, tensors=, spec=, target=edit|None, version=, **doctor_kw)`` -> report."""

    def go(name, config=None, tensors=None, spec=tm.TinyDraftSpec(), speculators=False, target="", version=CLEAN, **kw):
        t = None if target is None else make_target(config=target, name=f"t-{name}") if target else tiny["deepseek_v3"]
        return run(
            t, make_draft(name, spec=spec, config=config, tensors=tensors, speculators=speculators), version, **kw
        )

    return go


@pytest.mark.parametrize("code", CHECKS)
def test_each_check_fires_on_its_fault_only(setup, code):
    severity, fire, silent = CHECKS[code]
    r = setup("fire", **fire)
    assert code in r.codes(severity) and "internal-error" not in r.codes(), r.format()
    r = setup("silent", **silent)
    assert code not in r.codes() and "internal-error" not in r.codes(), r.format()


@pytest.mark.parametrize(
    "spec, tp, found",
    [
        (tm.TinyDraftSpec(), 8, "num_attention_heads 4"),  # 4 heads over 8 ranks
        (tm.TinyDraftSpec(), 4, None),
        (tm.TinyDraftSpec(num_heads=6, num_kv_heads=3), 2, "num_key_value_heads 3"),
        (tm.TinyDraftSpec(num_heads=6, num_kv_heads=2), 2, None),
        (
            tm.TinyDraftSpec(num_heads=6, num_kv_heads=3, intermediate_size=96),
            6,
            None,
        ),  # fewer kv heads than ranks: replicated
        (tm.TinyDraftSpec(intermediate_size=129), 2, "intermediate_size 129"),
        (tm.TinyDraftSpec(intermediate_size=129), 1, None),
    ],
)
def test_tp_draft_split(setup, spec, tp, found):
    r = setup("d", spec=spec, tp=tp)
    if found is None:
        assert "tp-draft-split" not in r.codes() and "internal-error" not in r.codes(), r.format()
        return
    f = _one(r, "tp-draft-split")
    assert (f.severity, f.found, f.expected) == (ERROR, found, f"divisible by {tp}"), r.format()
    assert f.what == f"the draft cannot be split over tp {tp}" and f.where.endswith("config.json")


@pytest.mark.parametrize(
    "edit, fires",
    [
        ({"vocab_size": tm.VOCAB + 1}, True),  # more tokens than the embedding has rows
        ({"vocab_size": tm.VOCAB - 1}, False),  # a padded embedding is fine
        ({"hidden_size": tm.HIDDEN // 2}, True),
        ({"hidden_size": tm.HIDDEN * 2}, True),
    ],
)
def test_target_config_against_its_embedding_and_head(make_target, edit, fires):
    cfg = {"vocab_size": tm.VOCAB, "hidden_size": tm.HIDDEN, **edit}
    r = run(make_target(config=edit), None)
    bad = [f for f in r.findings if f.code == "target-config-vs-weights"]
    if not fires:
        assert not bad, r.format()
        return
    assert {f.where.rsplit(": ", 1)[1] for f in bad} == {"model.embed_tokens.weight", "lm_head.weight"}, r.format()
    assert {(f.severity, f.found, f.expected) for f in bad} == {
        (ERROR, str([tm.VOCAB, tm.HIDDEN]), f"[{cfg['vocab_size']}, {cfg['hidden_size']}] (vocab_size, hidden_size)")
    }


def test_target_architecture_note_points_at_the_top_level_of_a_wrapper(make_target):
    t = make_target("kimi_k25", config={"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava"})
    f = _one(run(t, None), "target-architecture")
    assert f.severity == INFO and f.where == f"{t / 'config.json'}: architectures"


@pytest.mark.parametrize("algorithm", ["STANDALONE", "NGRAM"])
def test_algorithms_without_eagle3_checks_are_noted(tiny, algorithm):
    f = _one(run(tiny["deepseek_v3"], tiny["draft"], speculative_algorithm=algorithm), "algorithm-not-eagle")
    assert f.severity == INFO and f.what.startswith(f"--speculative-algorithm {algorithm}:")


def test_nothing_to_check():
    r = doctor(sglang_version=CLEAN)
    assert r.codes(ERROR) == ["nothing-to-check"] and r.exit_code == 1, r.format()


@pytest.mark.parametrize("n", [MAX_FINDINGS_PER_CODE, MAX_FINDINGS_PER_CODE + 1])
def test_findings_of_one_code_are_listed_up_to_the_cap_then_counted(setup, n):
    """Each integer tensor is a tensor-dtype error; past the cap one summary says how many more there are."""
    r = setup(
        "ints", tensors=lambda t: t.update({f"extra_{i}.weight": torch.ones(4, dtype=torch.int16) for i in range(n)})
    )
    listed = [f for f in r.findings if f.code == "tensor-dtype"]
    assert len(listed) == min(n, MAX_FINDINGS_PER_CODE) + (n > MAX_FINDINGS_PER_CODE), r.format()
    summary = [f for f in listed if "more [tensor-dtype]" in f.what]
    assert [f.what for f in summary] == (
        [f"{n - MAX_FINDINGS_PER_CODE} more [tensor-dtype] finding(s) like the above are not listed"]
        if n > MAX_FINDINGS_PER_CODE
        else []
    )
    assert all(f.severity == ERROR for f in listed)


def _resize(name, rows=None, cols=None):
    def edit(t):
        t[name] = torch.ones(rows or t[name].shape[0], cols or t[name].shape[1], dtype=torch.bfloat16)

    return edit


@pytest.mark.parametrize(
    "tensors, name, asserts, fix",
    [
        (
            _resize("lm_head.weight", rows=tm.DRAFT_VOCAB // 2),
            "lm_head.weight",
            True,
            "draft_vocab_size must equal the rows of lm_head.weight",
        ),
        (
            _resize("midlayer.self_attn.q_proj.weight", cols=tm.HIDDEN),
            "midlayer.self_attn.q_proj.weight",
            True,
            "the config.json does not belong to these weights (hidden_size, heads, head_dim, intermediate_size)",
        ),
        (
            lambda t: _resize("embed_tokens.weight", cols=tm.HIDDEN // 2)(_embed(t) or t),
            "embed_tokens.weight",
            False,
            "the config.json does not belong to these weights (hidden_size, heads, head_dim, intermediate_size)",
        ),
    ],
)
def test_tensor_shape_finding_says_whether_sglang_asserts_and_what_to_fix(setup, tensors, name, asserts, fix):
    f = _one(setup("d", tensors=tensors), "tensor-shape")
    assert f.what == f"{name} has the wrong shape for the draft config" + (
        " (sglang's loader asserts on it at start)" if asserts else ""
    )
    assert f.fix == fix and f.where.endswith(f": {name}")


def test_a_t2d_of_the_wrong_shape_only_warns(setup):
    r = setup("d", tensors=lambda t: t.update(t2d=t["t2d"][: tm.VOCAB // 2].contiguous()))
    assert r.ok and r.codes(WARNING) == ["t2d-invalid"], r.format()
    f = _one(r, "t2d-invalid")
    assert (f.found, f.expected) == (f"BOOL [{tm.VOCAB // 2}]", f"BOOL [{tm.VOCAB}]")


@pytest.mark.parametrize(
    "config, draft_vocab",
    [
        (None, tm.DRAFT_VOCAB),
        (_without("draft_vocab_size"), tm.VOCAB),  # no draft_vocab_size: sglang's draft vocabulary is vocab_size
    ],
)
def test_a_two_dimensional_d2t_is_invalid(setup, config, draft_vocab):
    f = _one(
        setup("d", config=config, tensors=lambda t: t.update(d2t=t["d2t"].reshape(2, -1).contiguous())), "d2t-invalid"
    )
    assert f.severity == ERROR and (f.found, f.expected) == (f"I64 [2, {tm.DRAFT_VOCAB // 2}]", f"I64 [{draft_vocab}]")


@pytest.mark.parametrize(
    "shape, what, expected",
    [
        (
            [tm.HIDDEN * 3 * tm.HIDDEN],
            "fc.weight is not a matrix",
            f"[{tm.HIDDEN}, {len(tm.DRAFT_AUX_IDS)} x {tm.HIDDEN}]",
        ),
        (
            [tm.HIDDEN // 2, 3 * tm.HIDDEN],
            "fc.weight's output width is not the draft's hidden size",
            f"[{tm.HIDDEN}, {3 * tm.HIDDEN}]",
        ),
        (
            [tm.HIDDEN, 3 * tm.HIDDEN, 1],
            "fc.weight is not a matrix",
            f"[{tm.HIDDEN}, {len(tm.DRAFT_AUX_IDS)} x {tm.HIDDEN}]",
        ),
        (
            [2 * tm.HIDDEN, 3 * tm.HIDDEN],
            "fc.weight's output width is not the draft's hidden size",
            f"[{tm.HIDDEN}, {3 * tm.HIDDEN}]",
        ),
    ],
)
def test_fc_shape(setup, shape, what, expected):
    r = setup("d", tensors=lambda t: t.update({"fc.weight": torch.ones(*shape, dtype=torch.bfloat16)}))
    f = next(f for f in r.findings if f.code == "tensor-shape" and f.where.endswith(": fc.weight"))
    assert (f.severity, f.what, f.found, f.expected) == (ERROR, what, str(shape), expected)
    assert "internal-error" not in r.codes(), r.format()


def test_aux_ids_missing_names_the_defaults_sglang_captures(setup):
    from eagle3_patches.checkpoint.layer_ids import default_capture_points

    before = default_capture_points(tm.NUM_LAYERS)
    cfg = {"eagle_config": {"use_aux_hidden_state": True}}
    f = _one(setup("d", config=lambda c: {**c, **cfg}), "aux-ids-missing")
    assert f.what.endswith(f"(before layers {before} = the outputs of layers {[p - 1 for p in before]})"), f.what
    f = _one(setup("no-target", config=lambda c: {**c, **cfg}, target=None), "aux-ids-missing")
    assert f.what.endswith("[2, n//2, n-3] (before those layers)"), f.what


@pytest.mark.parametrize("top_output, in_range", [(tm.NUM_LAYERS - 2, True), (tm.NUM_LAYERS - 1, False)])
def test_speculators_ids_against_the_target(setup, top_output, in_range):
    """speculators' id i is the output of layer i - 1; sglang captures outputs 0..n-2 (ids 1..n-1)."""
    spec = tm.TinyDraftSpec(aux_ids=(0, 1, top_output))
    r = setup("d", spec=spec, speculators=True, with_patches=True)
    assert "internal-error" not in r.codes(), r.format()
    n = tm.NUM_LAYERS
    if in_range:
        f = _one(r, "aux-ids-capture")
        assert f.severity == INFO and f.what.startswith(
            f"ids {[i + 1 for i in spec.aux_ids]} (speculators' meaning) are the outputs "
            f"of layers {list(spec.aux_ids)} of {n}"
        ), f.what
        assert "aux-ids-out-of-range" not in r.codes()
    else:
        f = _one(r, "aux-ids-out-of-range")
        assert (
            f.severity == ERROR and f.expected == f"ids in 1..{n - 1}" and f.found == str([i + 1 for i in spec.aux_ids])
        )
    assert not {"aux-ids-capture", "aux-ids-out-of-range"} & set(
        setup("alone", spec=spec, speculators=True, target=None).codes()
    )


def test_draft_tensors_under_model_prefix_load_as_sglang_strips_it(setup):
    """sglang strips a leading ``model.`` from draft names, but ``model.lm_head.weight`` is not lm_head.weight."""
    r = setup("prefixed", tensors=lambda t: {(k if k == "lm_head.weight" else f"model.{k}"): v for k, v in t.items()})
    assert_clean(r)
    assert not {"keys-unknown", "keys-missing"} & set(r.codes()), r.format()
    r = setup("head", tensors=lambda t: {f"model.{k}": v for k, v in t.items()})
    assert _one(r, "keys-unknown").found == "model.lm_head.weight" and _one(r, "keys-missing").found == "lm_head.weight"


def test_report_text_shows_the_setup_the_checkpoints_and_every_finding(tiny, make_draft, make_target):
    d = make_draft(config={"eagle_config": {CONVENTION_KEY: "output-of-layer"}})
    r = run(tiny["deepseek_v3"], d)
    lines = r.format().splitlines()
    assert lines[1].endswith(", stock sglang or eagle3-patches (the same verdict either way)"), lines[1]
    assert run(tiny["deepseek_v3"], d, with_patches=True).format().splitlines()[1].endswith(", with eagle3-patches")
    stock = run(tiny["deepseek_v3"], d, with_patches=False).format().splitlines()[1]
    assert stock.endswith(", stock sglang (no eagle3-patches)")
    assert lines[2] == (
        f"  target: {tiny['deepseek_v3']} (DeepseekV3ForCausalLM, {tm.NUM_LAYERS} layers, hidden {tm.HIDDEN}, "
        f"vocab {tm.VOCAB}, dtype bfloat16)"
    )
    assert lines[3] == (
        f"  draft:  {d} (sglang-eagle3 format, LlamaForCausalLMEagle3, hidden {tm.HIDDEN}, draft vocab "
        f"{tm.DRAFT_VOCAB}, "
        f"aux ids {list(tm.DRAFT_AUX_IDS)} (output-of-layer))"
    )
    assert (r.facts["target_path"], r.facts["draft_path"]) == (str(tiny["deepseek_v3"]), str(d))
    # a note is printed (unless hidden), each field on its own line under the finding, 8 columns in
    note = _one(r, "embed-from-target")
    at = lines.index(f"info    [embed-from-target] {note.what}")
    assert lines[at + 1] == f"{' ' * 8}{'where:':<10}{note.where}"
    assert lines[-2:] == [
        "",
        f"OK: 0 error(s), 0 warning(s), {len(r.findings)} note(s). Read {lines[-1].split(' Read ')[1]}",
    ]
    assert r.format(show_info=False).splitlines()[-3:-1] == [lines[3], ""]  # nothing shown: one blank line, not two
    hidden = run(tiny["deepseek_v3"], d, speculative_algorithm="EAGLE").format(show_info=False)
    assert "[algorithm-eagle-with-eagle3-draft]" in hidden and "[embed-from-target]" not in hidden, hidden
    # no draft: no draft line, no draft path; a draft without ids says so
    r = run(tiny["deepseek_v3"], None)
    assert "draft_path" not in r.facts and not any(line.startswith("  draft:") for line in r.format().splitlines())
    no_ids = make_draft("no-ids", config=lambda c: {**c, "eagle_config": {"use_aux_hidden_state": True}})
    assert run(None, no_ids).facts["draft"].endswith(", no aux ids)")
    assert (
        run(make_target(config=_without("architectures")), None)
        .facts["target"]
        .endswith(f" (deepseek_v3, {tm.NUM_LAYERS} layers, hidden {tm.HIDDEN}, vocab {tm.VOCAB}, dtype bfloat16)")
    )


def test_report_summary_line_reads_bytes_in_human_units(tiny):
    r = run(tiny["deepseek_v3"], tiny["draft"])
    r.facts["seconds"] = 0.5
    for n, shown in [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KB"),
        (1536, "1.5 KB"),
        (1024**2, "1.0 MB"),
        (1024**3, "1.0 GB"),
        (5 * 1024**4, "5120.0 GB"),
    ]:
        r.facts["bytes_read"] = n
        assert r.format().endswith(f"note(s). Read {shown} in 0.50 s."), (n, r.format().splitlines()[-1])


def test_the_time_taken_is_kept_to_a_tenth_of_a_millisecond(tiny, monkeypatch):
    """``facts["seconds"]`` (the JSON report's) is the doctor's own wall time, rounded to 0.1 ms."""
    import types

    from eagle3_patches.doctor import run as doctor_module

    clock = iter([100.0, 100.123456])
    monkeypatch.setattr(doctor_module, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    r = run(tiny["deepseek_v3"], tiny["draft"])
    assert r.facts["seconds"] == 0.1235
    assert r.format().endswith(" in 0.12 s.")


@pytest.mark.parametrize("installed", [None, CLEAN])
def test_the_release_checked_when_none_is_given(tiny, monkeypatch, installed):
    import eagle3_patches.doctor.run as doctor_run

    monkeypatch.setattr(
        doctor_run, "installed_sglang_version", lambda: None if installed is None else releases.parse_version(installed)
    )
    r = doctor(tiny["deepseek_v3"], tiny["draft"])
    assert r.facts["sglang_version"] == str(releases.PINNED if installed is None else installed)
    notes = [f.what for f in r.findings if f.code == "sglang-version-assumed"]
    assert notes == (
        [f"sglang is not installed here; checking against {releases.PINNED}"] if installed is None else []
    ), r.format()


def test_raise_for_errors_counts_the_other_errors(make_draft, tiny):
    from eagle3_patches.errors import Eagle3ConfigError

    r = run(tiny["deepseek_v3"], make_draft(config={"num_hidden_layers": 2}), speculative_algorithm="EAGLE")
    assert len(r.errors) >= 2, r.format()
    with pytest.raises(Eagle3ConfigError) as info:
        r.raise_for_errors()
    assert info.value.diagnostic.what == (
        f"{r.errors[0].what} (and {len(r.errors) - 1} more error(s): run `eagle3-patches doctor` for all)"
    )


def _pickle_only(tmp_path, checkpoint):
    """``checkpoint``'s config beside four (empty) pickle shards and nothing else; returns (dir, their names)."""
    d = tmp_path / "pickled"
    d.mkdir()
    (d / "config.json").write_text((checkpoint / "config.json").read_text())
    names = [f"pytorch_model-{i}.bin" for i in range(4)]
    for n in names:
        (d / n).write_bytes(b"")
    return d, names


def test_weight_files_the_doctor_cannot_use(make_draft, tiny, tmp_path):
    from safetensors.torch import save_file

    # a target with only pickle weights: the first 3 are named
    t, names = _pickle_only(tmp_path, tiny["deepseek_v3"])
    f = _one(run(t, None), "target-no-safetensors")
    assert f.severity == WARNING and f.found == ", ".join(sorted(names)[:3])
    # a draft tensor in two shards
    d = make_draft("dup")
    save_file({"norm.weight": torch.ones(tm.HIDDEN, dtype=torch.bfloat16)}, str(d / "extra.safetensors"))
    f = _one(run(tiny["deepseek_v3"], d), "duplicate-tensor")
    assert (f.severity, f.what) == (ERROR, "tensor norm.weight is stored in two shards")
    assert sorted(f.found.split(", ")) == ["extra.safetensors", "model.safetensors"]
    # a draft index naming a tensor its shard does not hold
    d = make_draft("index", shards=2)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    index["weight_map"]["norm.weight"] = next(
        f for f in index["weight_map"].values() if f != index["weight_map"]["norm.weight"]
    )
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    f = _one(run(tiny["deepseek_v3"], d), "safetensors-index")
    assert (f.severity, f.found) == (ERROR, "norm.weight") and f.what.startswith("1 tensor(s) in the draft's index")


def test_an_implausibly_large_d2t_is_not_read(setup):
    from eagle3_patches.doctor.draft_checks import MAX_MAP_BYTES

    n = MAX_MAP_BYTES // 8 + 1  # int64 entries: one past the limit
    f = _one(setup("d", tensors=lambda t: t.update(d2t=torch.zeros(n, dtype=torch.int64))), "d2t-invalid")
    assert (
        f.severity == ERROR and f.what == f"d2t is implausibly large ({8 * n} bytes); not read" and f.found == str([n])
    )


# ---- mutation survivors (fifth session)
def _target_with(tmp_path, name, tensors, config=None, shards=1):
    """A target checkpoint: the tiny DeepSeek-V3 config (``config``: keys to set) and only ``tensors``, in
    ``shards`` shards named by an index (``shards`` > 1)."""
    from safetensors.torch import save_file

    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**tm.TinyTargetSpec().text_config(), **(config or {})}))
    names = sorted(tensors)
    if shards == 1:
        save_file({k: tensors[k] for k in names}, str(d / "model.safetensors"))
        return d
    weight_map = {}
    for i in range(shards):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: tensors[k] for k in names[i::shards]}, str(d / fname))
        weight_map.update({k: fname for k in names[i::shards]})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return d


def _embed_and_head(embed=(tm.VOCAB, tm.HIDDEN), head=(tm.VOCAB, tm.HIDDEN)):
    return {
        "model.embed_tokens.weight": torch.ones(*embed, dtype=torch.bfloat16),
        "lm_head.weight": torch.ones(*head, dtype=torch.bfloat16),
    }


def test_path_differs_from_launch_whichever_way_the_paths_sort(tiny):
    for checked, named in ((tiny["deepseek_v3"], tiny["kimi_k25"]), (tiny["kimi_k25"], tiny["deepseek_v3"])):
        r = run(checked, tiny["draft"], launch=["--speculative-algorithm", "EAGLE3", "--model-path", str(named)])
        f = _one(r, "path-differs-from-launch")
        assert (f.severity, f.where, f.found, f.expected) == (WARNING, "--model-path", str(named), str(checked))
        assert f.what == "the target checked is not the one the launch command names"
        assert r.facts["target_path"] == str(checked)
    r = run(
        tiny["deepseek_v3"],
        tiny["draft"],
        launch=["--speculative-algorithm", "EAGLE3", "--model-path", str(tiny["deepseek_v3"])],
    )
    assert "path-differs-from-launch" not in r.codes(), r.format()


@pytest.mark.parametrize("embed", [(tm.VOCAB * tm.HIDDEN,), (tm.VOCAB, tm.HIDDEN, 1)])
def test_a_target_embedding_that_is_not_a_matrix(tmp_path, embed):
    t = _target_with(tmp_path, "t", _embed_and_head(embed=embed))
    r = run(t, None)
    f = _one(r, "target-config-vs-weights")
    assert (f.severity, f.found, f.where) == (
        ERROR,
        str(list(embed)),
        f"{t / 'model.safetensors'}: model.embed_tokens.weight",
    )
    assert f.what == "the target's model.embed_tokens.weight does not match its config"
    assert "internal-error" not in r.codes(), r.format()


@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16, torch.float32])
def test_a_t2d_that_is_not_a_bool_mask_only_warns(setup, dtype):
    r = setup("d", tensors=lambda t: t.update(t2d=t["t2d"].to(dtype)))
    assert r.ok and r.codes(WARNING) == ["t2d-invalid"], r.format()
    f = _one(r, "t2d-invalid")
    shown = {torch.uint8: "U8", torch.bfloat16: "BF16", torch.float32: "F32"}[dtype]
    assert (f.what, f.found, f.expected) == (
        "t2d is not a bool mask over the target vocabulary",
        f"{shown} [{tm.VOCAB}]",
        f"BOOL [{tm.VOCAB}]",
    )
    assert "tensor-dtype-cast" not in r.codes()  # the map is not one of the weights cast at load


def test_a_t2d_longer_than_the_target_vocabulary_only_warns(setup):
    r = setup("d", tensors=lambda t: t.update(t2d=torch.cat([t["t2d"], torch.zeros(8, dtype=torch.bool)])))
    f = _one(r, "t2d-invalid")
    assert (f.severity, f.found, f.expected) == (WARNING, f"BOOL [{tm.VOCAB + 8}]", f"BOOL [{tm.VOCAB}]")


def test_a_t2d_marking_one_token_more_than_d2t_maps_to(setup):
    def extra(t):
        spare = int((~t["t2d"]).nonzero()[0])
        t["t2d"][spare] = True

    f = _one(setup("d", tensors=extra), "t2d-invalid")
    assert f.severity == WARNING and f.what.startswith("t2d does not mark exactly the target ids that d2t maps to")
    assert (f.found, f.expected) == (
        f"{tm.DRAFT_VOCAB + 1} marked, {tm.DRAFT_VOCAB} of d2t's targets marked",
        f"{tm.DRAFT_VOCAB} marked, all of d2t's targets",
    )


def test_a_scalar_d2t_is_invalid(setup):
    f = _one(setup("d", tensors=lambda t: t.update(d2t=torch.tensor(0, dtype=torch.int64))), "d2t-invalid")
    assert (f.severity, f.found, f.expected) == (ERROR, "I64 []", f"I64 [{tm.DRAFT_VOCAB}]")
    assert f.what == "d2t is I64 [], expected a 1-D integer tensor of offsets"


def test_a_short_d2t_is_one_length_error_not_a_shape_one(setup):
    r = setup("d", tensors=lambda t: t.update(d2t=t["d2t"][:200].contiguous()))
    assert r.codes(ERROR) == ["d2t-length"], r.format()


@pytest.mark.parametrize(
    "draft_dtype, target_dtype, draft_why",
    [
        ("float32", "bfloat16", "config dtype float32 -> float16 (sglang's auto rule)"),
        ("float", "bfloat16", "config dtype float -> float16 (sglang's auto rule)"),  # the config's own word
        (None, "bfloat16", "no dtype in config -> float32 -> float16 (sglang's auto rule)"),
        ("bfloat16", "float16", "config dtype bfloat16"),
    ],
)
def test_dtype_mismatch_says_what_each_side_runs_in_and_why(setup, DELETE, draft_dtype, target_dtype, draft_why):
    ddt = "float16" if draft_dtype != "bfloat16" else "bfloat16"
    r = setup("d", config={"torch_dtype": draft_dtype if draft_dtype else DELETE}, target={"torch_dtype": target_dtype})
    f = _one(r, "dtype-mismatch")
    assert f.severity == ERROR and f.what.startswith(
        f"the draft would run in {ddt} but the target's aux hidden states are {target_dtype}"
    )
    assert (f.found, f.expected) == (
        f"draft: {draft_why}; target: config dtype {target_dtype}",
        f"the draft running in {target_dtype}",
    )
    assert (
        f.fix == f'set "torch_dtype": "{target_dtype}" in the draft config.json (or launch with --dtype {target_dtype})'
    )


@pytest.mark.parametrize("draft_dtype", ["float32", "float"])
def test_a_float32_draft_runs_in_float16_as_a_float16_target_does(setup, draft_dtype):
    r = setup("d", config={"torch_dtype": draft_dtype}, target={"torch_dtype": "float16"})
    assert "dtype-mismatch" not in r.codes(), r.format()


@pytest.mark.parametrize(
    "config, launch, warns",
    [
        ({"torch_dtype": "float32"}, None, True),
        ({"torch_dtype": "float"}, None, True),
        ({"torch_dtype": None}, None, True),  # no dtype: sglang's auto rule reads float32
        ({"torch_dtype": "float16"}, None, False),  # stated float16: no guess about the target
        ({"torch_dtype": "float32"}, ["--speculative-algorithm", "EAGLE3", "--dtype", "bfloat16"], False),
    ],
)
def test_a_float32_draft_without_a_target_warns_unless_its_dtype_is_stated_or_forced(setup, config, launch, warns):
    r = setup("d", config=config, target=None, launch=launch)
    if not warns:
        assert "dtype-float32-draft" not in r.codes(), r.format()
        return
    f = _one(r, "dtype-float32-draft")
    why = (
        f"config dtype {config['torch_dtype']} -> float16 (sglang's auto rule)"
        if config["torch_dtype"]
        else "no dtype in config -> float32 -> float16 (sglang's auto rule)"
    )
    assert (f.severity, f.what) == (
        WARNING,
        f"sglang runs this draft in float16 ({why}); with a bfloat16 target the fc raises a dtype error",
    )


def test_bfloat16_weights_of_a_float16_draft_are_cast_at_load(setup):
    f = _one(setup("d", config={"torch_dtype": "float16"}, target=None), "tensor-dtype-cast")
    assert (f.severity, f.what) == (INFO, "draft weights are stored as BF16 and cast to float16 at load")


def test_integer_weights_are_a_dtype_error_not_a_cast(setup):
    r = setup("d", tensors=lambda t: t.update({"norm.weight": t["norm.weight"].to(torch.int16)}))
    f = _one(r, "tensor-dtype")
    assert (f.severity, f.found) == (ERROR, "I16") and f.what.startswith(
        "norm.weight is stored as I16, not a floating-point dtype"
    )
    assert "tensor-dtype-cast" not in r.codes(), r.format()


def test_a_float_d2t_is_invalid_not_a_weight_cast_at_load(setup):
    r = setup("d", tensors=lambda t: t.update(d2t=t["d2t"].float()))
    assert r.codes(ERROR) == ["d2t-invalid"] and "tensor-dtype-cast" not in r.codes(), r.format()


def test_a_draft_vocab_smaller_than_the_targets(setup):
    f = _one(setup("d", config={"vocab_size": tm.VOCAB // 2}), "vocab-mismatch")
    assert (f.severity, f.found, f.expected) == (ERROR, f"draft {tm.VOCAB // 2}", f"target {tm.VOCAB}")


def test_draft_vocab_size_larger_than_vocab_size(setup):
    f = _one(setup("d", config={"draft_vocab_size": 2 * tm.VOCAB}), "draft-vocab-size")
    assert (f.severity, f.what, f.found, f.expected) == (
        ERROR,
        "draft_vocab_size is larger than vocab_size",
        str(2 * tm.VOCAB),
        f"<= {tm.VOCAB}",
    )
    assert f.where.endswith("config.json: draft_vocab_size")
    assert "draft-vocab-size" not in setup("same", config={"draft_vocab_size": tm.VOCAB}).codes()


def test_a_draft_with_no_decoder_layer(setup):
    f = _one(setup("d", config={"num_hidden_layers": 0}), "draft-num-layers")
    assert (f.severity, f.found, f.expected) == (ERROR, "0", "1")


@pytest.mark.parametrize(
    "algorithm, fires", [("EAGLE", True), ("EAGLE3", True), ("NEXTN", True), ("STANDALONE", False)]
)
def test_kimi_k25_on_058_for_every_algorithm_that_loads_the_target_as_eagle_does(tiny, algorithm, fires):
    r = run(tiny["kimi_k25"], tiny["draft"], "0.5.8", speculative_algorithm=algorithm, with_patches=True)
    if not fires:
        assert "kimi-k25-unsupported" not in r.codes(), r.format()
        return
    f = _one(r, "kimi-k25-unsupported")
    assert f.severity == ERROR and f.what.startswith("sglang 0.5.8 has no KimiK25ForConditionalGeneration")
    assert f.where == f"{tiny['kimi_k25'] / 'config.json'}: architectures"  # the wrapper's own list, not text_config's
    assert f.found == "['KimiK25ForConditionalGeneration']"


def test_check_draft_leaves_the_server_setup_out(tiny):
    from eagle3_patches.doctor import check_draft

    # on 0.5.9 doctor() also reports the CUDA-graph capture order and the Kimi delegation: the launch, not the
    # checkpoints
    assert {"cuda-graph-capture-order", "kimi-k25-delegation"} <= set(
        run(tiny["kimi_k25"], tiny["draft"], "0.5.9").codes(ERROR)
    )
    r = check_draft(tiny["draft"], target=tiny["kimi_k25"], sglang_version="0.5.9")
    assert_clean(r)
    assert not {"cuda-graph-capture-order", "kimi-k25-delegation"} & set(r.codes()), r.format()


def test_launch_args_given_parsed_mean_what_the_flags_say(tiny):
    from eagle3_patches.checkpoint.launch_args import parse_launch_args

    flags = ["--tp", "1", "--model-path", str(tiny["deepseek_v3"])]
    for launch in (flags, parse_launch_args(flags)):
        r = doctor(None, tiny["draft"], sglang_version=CLEAN, launch=launch)
        f = _one(r, "no-speculation")  # flags without --speculative-algorithm: sglang does not speculate
        assert f.severity == WARNING and r.facts["algorithm_source"] == "launch flags (none given)"
        assert r.facts["target_path"] == str(tiny["deepseek_v3"])


@pytest.mark.parametrize("side", ["target", "draft"])
def test_one_checkpoint_alone_is_something_to_check(tiny, side):
    r = run(tiny["deepseek_v3"], None) if side == "target" else run(None, tiny["draft"])
    assert_clean(r)
    assert "nothing-to-check" not in r.codes(), r.format()


@pytest.mark.parametrize(
    "architectures, shown", [(["LlavaForConditionalGeneration"], "LlavaForConditionalGeneration"), (None, "?")]
)
def test_target_architecture_note_names_the_architecture(make_target, DELETE, architectures, shown):
    t = make_target(config={"architectures": architectures or DELETE, "model_type": "llava"})
    f = _one(run(t, None), "target-architecture")
    assert f.what == (
        f"target architecture {shown} is not in the DeepSeek-V3 family; capture rules are checked as "
        "sglang's DeepseekV2ForCausalLM applies them"
    )


def test_speculators_id_zero_is_the_embeddings_which_sglang_cannot_capture(setup):
    spec = tm.TinyDraftSpec(aux_ids=(-1, 1, 2))  # speculators ids [0, 2, 3]: id 0 = the embeddings
    f = _one(setup("d", spec=spec, speculators=True, with_patches=True), "aux-ids-out-of-range")
    n = tm.NUM_LAYERS
    assert f.severity == ERROR and f.found == "[0, 2, 3]" and f.expected == f"ids in 1..{n - 1}"
    assert f.what == (
        f"speculators ids [0] (HF hidden_states index) have no capture point in sglang on a {n}-layer "
        f"target (valid 1..{n - 1})"
    )


def test_target_shards_missing_from_the_index_are_listed_up_to_five(tmp_path):
    """Seven shards named, the first six missing: the finding counts six and names five; the last shard is
    still read.
    """
    tensors = {f"extra_{i}.weight": torch.ones(4, dtype=torch.bfloat16) for i in range(5)}
    tensors.update(_embed_and_head(embed=(tm.VOCAB, tm.HIDDEN // 2)))
    t = _target_with(tmp_path, "t", tensors, shards=7)
    shards = sorted(p.name for p in t.glob("*.safetensors"))
    for name in shards[:6]:
        (t / name).unlink()
    r = run(t, None)
    f = _one(r, "safetensors-index")
    assert (f.severity, f.what, f.where) == (
        ERROR,
        "6 shard(s) named by the target's index are missing",
        str(t / "model.safetensors.index.json"),
    )
    assert f.found == ", ".join(shards[:5]) and f.fix == "finish the download"
    assert r.facts["target_headers_read"] == "1 of 7 shard header(s), 1 tensors"
    bad = _one(r, "target-config-vs-weights")  # the shard that is there is still checked
    assert bad.where == f"{t / shards[6]}: model.embed_tokens.weight"


@pytest.mark.parametrize("n_moved", [6, 1])
def test_target_index_naming_tensors_its_shards_do_not_hold(tmp_path, n_moved):
    tensors = {f"extra_{i}.weight": torch.ones(4, dtype=torch.bfloat16) for i in range(10)}
    tensors.update(_embed_and_head())
    t = _target_with(tmp_path, "t", tensors, shards=2)
    index = json.loads((t / "model.safetensors.index.json").read_text())
    first, second = sorted(set(index["weight_map"].values()))
    moved = [n for n, f in index["weight_map"].items() if f == first][:n_moved]
    index["weight_map"].update({n: second for n in moved})
    (t / "model.safetensors.index.json").write_text(json.dumps(index))
    r = run(t, None)
    f = _one(r, "safetensors-index")
    assert (f.severity, f.what) == (ERROR, f"{n_moved} tensor(s) in the target's index are not in the shard it names")
    shown = f.found.split(", ")
    assert len(shown) == min(n_moved, 5) and set(shown) <= set(moved), f.found
    assert f.fix == "re-download the index and shards together"
    assert_clean(run(_target_with(tmp_path, "whole", tensors, shards=2), None))


def test_the_target_embedding_checked_is_the_models_own(tmp_path):
    """DeepSeek-V3's MTP layer has an embed_tokens.weight of its own, and a name can merely end in the word: only
    model.embed_tokens.weight and lm_head.weight are held against the config."""
    tensors = _embed_and_head()
    tensors["model.layers.6.embed_tokens.weight"] = torch.ones(tm.VOCAB // 2, tm.HIDDEN, dtype=torch.bfloat16)
    tensors["model.aux_embed_tokens.weight"] = torch.ones(4, 4, dtype=torch.bfloat16)
    tensors["vision_lm_head.weight"] = torch.ones(4, 4, dtype=torch.bfloat16)
    r = run(_target_with(tmp_path, "t", tensors), None)
    assert "target-config-vs-weights" not in r.codes(), r.format()
    assert_clean(r)


def test_a_target_or_draft_directory_with_a_config_but_no_weights(tmp_path, tiny):
    for role, src in (("target", tiny["deepseek_v3"]), ("draft", tiny["draft"])):
        d = tmp_path / role
        d.mkdir()
        (d / "config.json").write_text((src / "config.json").read_text())
        r = run(d, None) if role == "target" else run(None, d)
        f = _one(r, "not-a-checkpoint")
        assert (f.severity, f.what, f.where) == (ERROR, f"the {role} directory holds no *.safetensors weights", str(d))
        assert f.fix == f"pass the directory that holds the {role}'s weights"


def test_a_draft_with_only_pickle_weights(tmp_path, tiny):
    d, names = _pickle_only(tmp_path, tiny["draft"])
    f = _one(run(tiny["deepseek_v3"], d), "draft-no-safetensors")
    assert (f.severity, f.found) == (ERROR, ", ".join(sorted(names)[:3]))
    assert f.fix == "save the draft with safetensors (save_pretrained(safe_serialization=True))"
    assert "not-a-checkpoint" not in run(tiny["deepseek_v3"], d).codes()


def test_two_names_for_one_draft_parameter(setup):
    """layers.0.* (speculators' naming) next to midlayer.*: one finding, and every other tensor is still checked."""
    r = setup(
        "d", tensors=lambda t: t.update({"layers.0.hidden_norm.weight": t["midlayer.hidden_norm.weight"].clone()})
    )
    f = _one(r, "duplicate-tensor")
    assert (f.severity, f.what) == (
        ERROR,
        "tensors layers.0.hidden_norm.weight and midlayer.hidden_norm.weight load into the same parameter",
    )
    assert f.fix == "keep one of them"
    assert not {"keys-missing", "tensor-shape"} & set(r.codes()), r.format()


def test_a_readable_draft_shard_without_tensors_is_still_judged(make_draft, tiny):
    from safetensors.torch import save_file

    d = make_draft()
    save_file({}, str(d / "model.safetensors"))
    r = run(tiny["deepseek_v3"], d)
    assert "embed-from-target" in r.codes(INFO), r.format()  # the checks of its tensors ran, on none


def test_an_unreadable_draft_shard_is_one_finding_not_a_list_of_absent_tensors(make_draft, tiny):
    d = make_draft()
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[:5000])
    r = run(tiny["deepseek_v3"], d)
    assert "safetensors-header" in r.codes(ERROR), r.format()
    assert not {"embed-from-target", "keys-missing", "t2d-missing"} & set(r.codes()), r.format()


def test_report_setup_line_names_the_algorithm_and_tp(tiny):
    r = run(tiny["deepseek_v3"], tiny["draft"], tp=4, with_patches=False)
    assert r.format().splitlines()[1] == (
        f"  setup:  sglang {CLEAN} (--sglang-version), --speculative-algorithm EAGLE3 (assumed), "
        "tp 4, stock sglang (no eagle3-patches)"
    )
    r = run(tiny["deepseek_v3"], tiny["draft"], launch=["--tp", "2"], with_patches=False)
    assert (
        r.format().splitlines()[1]
        == f"  setup:  sglang {CLEAN} (--sglang-version), tp 2, stock sglang (no eagle3-patches)"
    )


def test_report_lists_errors_then_warnings_then_notes(make_draft, tiny):
    """Findings are made in check order (a note on the release first, then a warning on the paths, then errors):
    the report, text and JSON, leads with the errors."""
    newer = ".".join(map(str, (*releases.NEWEST_CHECKED.release[:2], releases.NEWEST_CHECKED.release[2] + 1)))
    r = run(
        tiny["deepseek_v3"],
        make_draft(config={"num_hidden_layers": 0}),  # an error on every release
        newer,
        launch=["--speculative-algorithm", "EAGLE3", "--model-path", str(tiny["kimi_k25"])],
    )
    made = [f.severity for f in r.findings]
    assert made.index(INFO) < made.index(WARNING) < made.index(ERROR), r.format()  # the order they were made in
    shown = [
        line.split(" [", 1)[0].strip()
        for line in r.format().splitlines()
        if line.startswith(("ERROR", "WARNING", "info"))
    ]
    want = ["ERROR"] * len(r.errors) + ["WARNING"] * len(r.warnings) + ["info"] * len(r.by_severity(INFO))
    assert shown == want, r.format()
    assert [f["severity"] for f in json.loads(r.to_json())["findings"]] == sorted(
        made, key=[ERROR, WARNING, INFO].index
    )
    lines = r.format().splitlines()
    assert lines[4] == "" and lines[5].startswith("ERROR   ["), (
        lines
    )  # one blank line between the header and the findings


def test_cli_json_is_indented(cli, tiny):
    rc, out, _ = cli(
        "doctor", "--json", "--target", tiny["deepseek_v3"], "--draft", tiny["draft"], "--sglang-version", CLEAN
    )
    assert rc == 0 and out.splitlines()[:2] == ["{", '  "ok": true,'], out[:200]


def test_a_check_that_crashes_is_an_internal_error_finding_not_a_traceback(tiny, monkeypatch):
    import eagle3_patches.doctor.run as doctor_module

    def crash(ctx):
        raise KeyError("hidden_size")

    monkeypatch.setattr(doctor_module, "check_sizes", crash)
    r = run(tiny["deepseek_v3"], tiny["draft"])
    f = _one(r, "internal-error")
    assert (f.severity, f.what) == (ERROR, "the doctor's sizes check could not finish: KeyError: 'hidden_size'")
    assert f.fix == "this is a bug in eagle3-patches; please report it with the --json output"
    assert "aux-ids-capture" in r.codes(INFO)  # the checks after it still ran


def test_the_doctor_reads_the_draft_config_header_and_maps_only(make_draft):
    """The bytes it reports: the draft's config.json, its shard header, and the d2t / t2d data (docs/security.md)."""
    d = make_draft()
    shard = (d / "model.safetensors").read_bytes()
    header = 8 + int.from_bytes(shard[:8], "little")
    maps = 8 * tm.DRAFT_VOCAB + tm.VOCAB  # int64 d2t, bool t2d
    r = run(None, d)
    assert r.facts["bytes_read"] == (d / "config.json").stat().st_size + header + maps, r.facts


def test_a_d2t_the_safetensors_library_cannot_read(setup, monkeypatch):
    import safetensors

    real = safetensors.safe_open

    class DataUnreadable:  # the header reads fine; the tensor data does not
        def __init__(self, *a, **kw):
            self.inner = real(*a, **kw)

        def __enter__(self):
            self.opened = self.inner.__enter__()
            return self

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)

        def __getattr__(self, name):
            return getattr(self.opened, name)

        def get_tensor(self, name):
            raise OSError("Input/output error")

    monkeypatch.setattr(safetensors, "safe_open", DataUnreadable)
    r = setup("d")
    f = _one(r, "d2t-invalid")
    assert (f.severity, f.what, f.found, f.fix) == (
        ERROR,
        "d2t cannot be read",
        "OSError: Input/output error",
        "re-export it",
    )
    assert f.where.endswith("model.safetensors: d2t") and "internal-error" not in r.codes(), r.format()


def _sparse_draft_with_d2t_of(path, entries):
    """The tiny draft with a d2t of ``entries`` int64 zeros, its data a hole in a sparse file (no disk, no write)."""
    tensors = tm.eagle3_draft_tensors(tm.TinyDraftSpec())
    tensors.pop("d2t")
    path.mkdir()
    (path / "config.json").write_text(json.dumps(tm.eagle3_draft_config(tm.TinyDraftSpec())))
    header, blobs, at = {}, [], 0
    names = {torch.bfloat16: "BF16", torch.bool: "BOOL"}
    for name, t in sorted(tensors.items()):
        raw = t.contiguous().view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    header["d2t"] = {"dtype": "I64", "shape": [entries], "data_offsets": [at, at + 8 * entries]}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path / "model.safetensors", "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(blobs))
        f.truncate(8 + len(text) + at + 8 * entries)
    return path


@pytest.mark.parametrize("extra, read", [(0, True), (1, False)])
def test_d2t_of_64_mib_is_read_and_one_entry_more_is_not(tmp_path, tiny, extra, read):
    entries = (64 << 20) // 8 + extra  # docs/security.md: d2t and t2d are read up to 64 MB each
    r = run(tiny["deepseek_v3"], _sparse_draft_with_d2t_of(tmp_path / "d", entries))
    if read:
        f = _one(r, "d2t-length")  # read, and judged: one entry per draft token
        assert f.what.startswith(
            f"d2t has {entries} entries but the draft config says draft_vocab_size={tm.DRAFT_VOCAB}"
        ), f.what
        assert "d2t-invalid" not in r.codes(), r.format()
    else:
        f = _one(r, "d2t-invalid")
        assert f.what == f"d2t is implausibly large ({8 * entries} bytes); not read" and f.found == str([entries])
        assert "d2t-length" not in r.codes(), r.format()


def test_a_report_closed_again_does_not_repeat_its_summary():
    from eagle3_patches.doctor import Report

    r = Report()
    for i in range(MAX_FINDINGS_PER_CODE + 2):
        r.add(WARNING, "w", f"finding {i}")
    r.close()
    r.close()
    assert [f.what for f in r.findings][MAX_FINDINGS_PER_CODE:] == [
        "2 more [w] finding(s) like the above are not listed"
    ]


def test_draft_index_naming_tensors_its_shards_do_not_hold_lists_five(make_draft, tiny):
    d = make_draft("index", shards=2)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    first, second = sorted(set(index["weight_map"].values()))
    moved = [n for n, f in index["weight_map"].items() if f == first][:6]
    index["weight_map"].update({n: second for n in moved})
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    f = _one(run(tiny["deepseek_v3"], d), "safetensors-index")
    assert (f.severity, f.what) == (ERROR, "6 tensor(s) in the draft's index are not in the shard it names")
    shown = f.found.split(", ")
    assert len(shown) == 5 and set(shown) <= set(moved), f.found


@pytest.mark.parametrize("kept", [1, 2])
def test_tensors_of_the_shards_that_read_are_judged_when_another_shard_does_not(make_draft, tiny, kept):
    """A shard that cannot be read is reported, and the tensors of the shards that could be read are still judged:
    a wrong shape among them is named, whether they hold one tensor or more."""

    def keep(t):
        out = {"norm.weight": torch.ones(7, dtype=torch.bfloat16)}  # the draft's hidden is tm.HIDDEN
        if kept == 2:
            out["fc.weight"] = t["fc.weight"]
        return out

    d = make_draft("broken-shard", tensors=keep)
    (d / "zz-broken.safetensors").write_bytes(b"\0\0\0")  # too short to hold a header
    r = run(tiny["deepseek_v3"], d)
    assert "safetensors-header" in r.codes(ERROR), r.format()
    shape = [f for f in r.errors if f.code == "tensor-shape"]
    assert [f.what.split(" ")[0] for f in shape] == ["norm.weight"], r.format()


# ------------------------------------------------------------------ eagle3_draft_norms' rule (draft-config-ignored)
#: each field eagle3_draft_norms backports -> (a draft config edit setting it, the last release that never reads it)
NORM_FIELDS = {
    "fc_norm": ({"fc_norm": True}, "0.5.11"),
    "use_aux_norm": ({"use_aux_norm": True}, "0.5.11"),
    "norm_output": ({"norm_output": True}, "0.5.11"),
    "norm_before_fc": ({"norm_before_fc": True}, "0.5.16"),
    "eagle_config.norm_before_fc": ({"eagle_config": {"norm_before_fc": True}}, "0.5.16"),
}


def _ignored(report):
    return [f for f in report.findings if f.code == "draft-config-ignored"]


def _norms_doctor(tiny, draft, version, **kw):
    return doctor(tiny["kimi_k25"], draft, sglang_version=version, launch=["--speculative-algorithm", "EAGLE3"], **kw)


@pytest.mark.parametrize("name", list(NORM_FIELDS))
def test_each_backported_norm_field_is_an_error_on_stock_and_a_note_under_the_backport(make_draft, tiny, name):
    """On a release below the first that reads it: stock serves the draft without the norm (one error naming the
    field); under eagle3-patches the backport reads it (one note naming eagle3_draft_norms, nothing refused)."""
    edit, release = NORM_FIELDS[name]
    d = make_draft(name.replace(".", "-"), config=edit)
    (f,) = _ignored(_norms_doctor(tiny, d, release, with_patches=False))
    assert f.severity == ERROR and f.where == f"{d / 'config.json'}: {name}", f
    assert f"which sglang {release}'s LlamaForCausalLMEagle3 never reads" in f.what
    (f,) = _ignored(_norms_doctor(tiny, d, release, with_patches=True))
    assert f.severity == INFO and f.where == f"{d / 'config.json'}: {name}", f
    assert f.what.endswith("fixed by eagle3-patches' eagle3_draft_norms (the launch runs under it)"), f.what


def test_with_the_backport_switched_off_only_the_start_check_reports_the_field(make_draft, tiny, monkeypatch):
    """EAGLE3_PATCHES_DISABLE=eagle3_draft_norms: one error, eagle3_draft_config_fields' refusal at start (the
    backport's own rule says nothing)."""
    from eagle3_patches import settings

    monkeypatch.setenv("EAGLE3_PATCHES_DISABLE", "eagle3_draft_norms")
    settings.reload()
    try:
        r = _norms_doctor(tiny, make_draft(config={"fc_norm": True}), "0.5.9", with_patches=True)
    finally:
        monkeypatch.delenv("EAGLE3_PATCHES_DISABLE")
        settings.reload()
    (f,) = _ignored(r)
    assert f.severity == ERROR and f.what.endswith("eagle3-patches (eagle3_draft_config_fields) refuses this at start")


def test_a_release_below_the_backports_range_reports_the_field_once(make_draft, tiny):
    """sglang 0.5.7 (below eagle3_draft_norms' range, 0.5.8 up): the field is reported once, as an error with or
    without eagle3-patches (no backport there)."""
    d = make_draft(config={"fc_norm": True})
    for with_patches in (False, True):
        (f,) = _ignored(_norms_doctor(tiny, d, "0.5.7", with_patches=with_patches))
        assert f.severity == ERROR and "fixed by" not in f.what and "refuses" not in f.what, f


def test_the_norm_fields_are_no_finding_where_the_rule_does_not_judge_them(make_draft, tiny):
    """No draft-config-ignored: the converter's check of the checkpoints alone (checkpoint_only), a speculators
    draft (its options are the converter's refusals), and a draft that sets none of the fields."""
    fields = {"fc_norm": True, "norm_output": True, "norm_before_fc": True}
    d = make_draft("eagle3", config=fields)
    assert _ignored(_norms_doctor(tiny, d, "0.5.9", with_patches=False, checkpoint_only=True)) == []
    spec = make_draft("speculators", speculators=True, config=fields)
    for with_patches in (False, True):
        assert _ignored(_norms_doctor(tiny, spec, "0.5.9", with_patches=with_patches)) == []
    assert _ignored(_norms_doctor(tiny, make_draft("plain"), "0.5.9", with_patches=False)) == []
    for name, layout in (("repo", _MODEL), ("eagle1", _EAGLE1)):  # the formats that sort before sglang's
        other = make_draft(name, config=lambda c, layout=layout: {**layout(c), **fields})
        assert _ignored(_norms_doctor(tiny, other, "0.5.9", with_patches=True)) == [], name
