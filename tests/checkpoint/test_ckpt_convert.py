"""The speculators -> SGLang converter, byte level: names, bytes, config, sharding, atomicity, refusals."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from eagle3_patches import convert as convert_mod
from eagle3_patches.checkpoint import conversion_plan
from eagle3_patches.checkpoint.layer_ids import CONVENTION_KEY
from eagle3_patches.checkpoint.safetensors_header import read_header
from eagle3_patches.convert import ConvertError, convert
from eagle3_patches.doctor import doctor
from eagle3_patches.testing import tiny_models as tm


def _bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _all_tensors(path: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _tree_digest(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir()) if p.is_file()}


def _leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if ".eagle3-" in p.name]


# ------------------------------------------------------------------ round trip
def test_round_trip_matches_the_sglang_draft_bit_for_bit(tiny, tmp_path):
    src = tiny["speculators_draft"]
    before = _tree_digest(src)
    res = convert(src, tmp_path / "out", sglang_version="0.5.9", progress=False)
    assert _tree_digest(src) == before  # SRC untouched
    got, want = _all_tensors(res.dst), _all_tensors(tiny["draft"])
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape, name
        assert _bytes(got[name]) == _bytes(want[name]), name
    assert got["d2t"].dtype == torch.int64 and got["t2d"].dtype == torch.bool  # offsets and mask kept
    # config: the SGLang draft's config, plus the recorded convention and provenance
    cfg = json.loads((res.dst / "config.json").read_text())
    ref = tm.eagle3_draft_config()
    for key in (
        "architectures",
        "model_type",
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "num_hidden_layers",
        "vocab_size",
        "draft_vocab_size",
        "target_hidden_size",
        "rope_theta",
        "rope_scaling",
        "rms_norm_eps",
        "tie_word_embeddings",
        "torch_dtype",
        "hidden_act",
    ):
        assert cfg[key] == ref[key], key
    ec = cfg["eagle_config"]
    assert ec["eagle_aux_hidden_state_layer_ids"] == list(tm.DRAFT_AUX_IDS)  # speculators [2,3,4] -> [1,2,3]
    assert ec["use_aux_hidden_state"] is True and ec[CONVENTION_KEY] == "output-of-layer"
    assert cfg["eagle3_patches_converted_from"]["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in tm.DRAFT_AUX_IDS]
    assert "auto_map" not in cfg and "speculators_model_type" not in cfg
    text = (res.dst / "config.json").read_text()  # as transformers' save_pretrained writes a config: sorted keys
    assert text == json.dumps(cfg, indent=2, sort_keys=True) + "\n"
    # the doctor's draft checks ran on the result and pass; the full doctor agrees with the target
    assert res.report is not None and res.report.ok
    assert doctor(tiny["deepseek_v3"], res.dst, sglang_version="0.5.11").ok
    assert not _leftovers(tmp_path)


def test_converts_what_the_real_speculators_library_wrote(tiny, tmp_path):
    """speculators 0.9.0's own save_pretrained output (trained draft, bf16, embed_tokens, target_hidden_size null)."""
    src = tm.build_speculators_fixture(tmp_path)
    res = convert(src, tmp_path / "out", target=tiny["kimi_k25"], progress=False)
    cfg = json.loads((res.dst / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["model_type"] == "llama"
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == list(tm.DRAFT_AUX_IDS)  # speculators' [2, 3, 4]
    assert cfg["target_hidden_size"] == tm.HIDDEN  # null in speculators: fc's in-width / 3
    assert cfg["torch_dtype"] == "bfloat16" and cfg["rope_theta"] == 10000.0 and cfg["rope_scaling"] is None
    assert cfg["eagle3_patches_converted_from"]["speculators_version"] == "0.9.0"
    assert not (res.dst / "config.py").exists()
    got, want = _all_tensors(res.dst), _all_tensors(src)
    assert sorted(got) == sorted(n.replace("layers.0.", "midlayer.") for n in want)  # embed_tokens, d2t, t2d kept
    assert all(_bytes(got[n.replace("layers.0.", "midlayer.")]) == _bytes(t) for n, t in want.items())
    assert res.report.ok, res.report.format()
    # the fixture is the trained draft (tools/make_speculators_fixture.py), as speculators 0.9.0 saved it
    assert json.loads((src / "config.json").read_text())["speculators_version"] == "0.9.0"
    trained = load_file(str(tm.TRAINED_DRAFT_TENSORS))
    for name, t in trained.items():
        saved = want[name.replace("midlayer.", "layers.0.")]
        assert torch.equal(saved, t if t.dtype in (torch.int64, torch.bool) else t.to(torch.bfloat16)), name


@pytest.mark.parametrize(
    "release, ids, convention",
    [
        (None, [1, 2, 3], "output-of-layer"),  # the converter: this library's convention
        ("0.5.9", [1, 2, 3], "output-of-layer"),  # speculators_draft_config: the release's own reading
        ("0.5.12", [1, 2, 3], "output-of-layer"),
        ("0.5.13", [2, 3, 4], "input-of-layer"),
        ("0.5.23", [2, 3, 4], "input-of-layer"),
    ],
)
def test_build_config_writes_ids_in_the_releases_convention(release, ids, convention):
    cfg = conversion_plan.build_config(tm.speculators_config(), {}, release=release)
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == ids
    assert cfg["eagle_config"][CONVENTION_KEY] == convention


def test_served_sglang_config_reads_only_local_speculators_drafts(tiny, make_draft, tmp_path):
    """What speculators_draft_config hands sglang: None (transformers reads it as always) unless a local
    speculators draft; the converter's refusal for one it cannot serve."""
    served = conversion_plan.served_sglang_config
    assert served(tiny["draft"], "0.5.9") is None  # SGLang format
    assert served(tiny["deepseek_v3"], "0.5.9") is None  # a target
    assert served("org/some-draft", "0.5.9") is None  # a hub id: left to sglang
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "config.json").symlink_to(tiny["speculators_draft"] / "config.json")  # a link out: not read
    assert served(linked, "0.5.9") is None
    cfg = served(tiny["speculators_draft"], "0.5.13")
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in tm.DRAFT_AUX_IDS]
    with pytest.raises(ConvertError, match="norm_output=true"):
        served(make_draft("bad", speculators=True, config={"norm_output": True}), "0.5.9")


def test_output_headers_are_aligned_and_verified(tiny, tmp_path):
    res = convert(tiny["speculators_draft"], tmp_path / "out", progress=False)
    assert not (res.dst / "model.safetensors.index.json").exists()  # one shard: no index, as transformers writes it
    assert res.files == [res.dst / "model.safetensors"]  # what the result (and `convert --json`) lists
    h = read_header(res.dst / "model.safetensors")
    assert h.metadata == {"format": "pt"} and h.data_start % 8 == 0
    for t in h.tensors.values():
        itemsize = {"BF16": 2, "I64": 8, "BOOL": 1}[t.dtype]
        assert t.start % itemsize == 0, t


def test_sharded_input_and_output(make_draft, tiny, tmp_path):
    src = make_draft("spec-sharded", speculators=True, shards=3)
    assert len(list(src.glob("*.safetensors"))) == 3
    res = convert(src, tmp_path / "out", max_shard_size="40KB", progress=False)
    files = sorted(res.dst.glob("*.safetensors"))
    assert len(files) > 2 and all(f.stat().st_size <= 40_000 + 4096 or len(read_header(f).tensors) == 1 for f in files)
    n = len(files)
    assert [f.name for f in files] == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]  # HF names
    index = json.loads((res.dst / "model.safetensors.index.json").read_text())
    got = _all_tensors(res.dst)
    assert set(index["weight_map"]) == set(got)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in got.values())
    for name, fname in index["weight_map"].items():
        with safe_open(str(res.dst / fname), "pt") as f:
            assert name in f.keys()
    want = _all_tensors(tiny["draft"])
    assert {n: _bytes(t) for n, t in got.items()} == {n: _bytes(t) for n, t in want.items()}
    assert doctor(tiny["deepseek_v3"], res.dst, sglang_version="0.5.11").ok


def test_two_output_shards_are_indexed(tiny, tmp_path):
    """Two shards are listed in model.safetensors.index.json (as transformers writes them): sglang finds
    every tensor.
    """
    res = convert(tiny["speculators_draft"], tmp_path / "out", max_shard_size="100KB", progress=False)
    assert [p.name for p in res.files] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    index = json.loads((res.dst / "model.safetensors.index.json").read_text())
    got = _all_tensors(res.dst)
    assert set(index["weight_map"]) == set(got) == set(_all_tensors(tiny["draft"]))
    assert set(index["weight_map"].values()) == {p.name for p in res.files}
    assert doctor(tiny["deepseek_v3"], res.dst, sglang_version="0.5.11").ok


def test_the_report_names_dst_not_the_temporary_directory(tiny, tmp_path):
    """The doctor's checks run on the temporary directory before the rename; the report the user reads
    (and `convert --json` prints) names DST in its findings and facts."""
    dst = tmp_path / "out"
    res = convert(tiny["speculators_draft"], dst, target=tiny["deepseek_v3"], sglang_version="0.5.9", progress=False)
    assert res.report.findings and all(f.where.startswith(str(dst)) for f in res.report.findings)
    assert res.report.facts["draft_path"] == str(dst) and res.report.facts["draft"].startswith(f"{dst} (")
    assert ".eagle3-" not in res.report.to_json()
    assert (res.report.facts["sglang_version"], res.report.facts["sglang_version_source"]) == (
        "0.5.9",
        "--sglang-version",
    )


def test_keeps_embed_tokens_unless_asked(make_draft, tmp_path):
    def with_embed(t):
        t["embed_tokens.weight"] = torch.randn(tm.VOCAB, tm.HIDDEN, generator=torch.Generator().manual_seed(3)).to(
            torch.bfloat16
        )

    src = make_draft("with-embed", speculators=True, tensors=with_embed)
    kept = convert(src, tmp_path / "kept", progress=False)
    assert "embed_tokens.weight" in _all_tensors(kept.dst)
    dropped = convert(src, tmp_path / "dropped", drop_embed_tokens=True, progress=False)
    assert "embed_tokens.weight" not in _all_tensors(dropped.dst) and dropped.dropped == ["embed_tokens.weight"]


def test_rope_parameters_become_rope_scaling(make_draft, tmp_path):
    def yarn(cfg):
        cfg["transformer_layer_config"]["rope_parameters"] = {
            "rope_theta": 50000.0,
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 512,
        }

    res = convert(make_draft("yarn", speculators=True, config=yarn), tmp_path / "out", progress=False)
    assert res.config["rope_theta"] == 50000.0
    assert res.config["rope_scaling"] == {
        "rope_type": "yarn",
        "type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 512,
    }


def test_null_target_hidden_size_comes_from_fc(make_draft, tmp_path):
    res = convert(
        make_draft("null-th", speculators=True, config={"target_hidden_size": None}), tmp_path / "out", progress=False
    )
    assert res.config["target_hidden_size"] == tm.HIDDEN


def test_aux_ids_are_bounded_where_no_target_says_how_deep(make_draft, tmp_path, DELETE):
    from eagle3_patches.checkpoint.layer_ids import MAX_LAYERS

    src = make_draft("no-ids", speculators=True, config={"eagle_aux_hidden_state_layer_ids": DELETE})
    res = convert(src, tmp_path / "deep", aux_layer_ids=[2, 3, MAX_LAYERS], progress=False)
    assert res.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, MAX_LAYERS - 1]
    with pytest.raises(ConvertError, match="not layer numbers"):
        convert(src, tmp_path / "deeper", aux_layer_ids=[2, 3, MAX_LAYERS + 1], progress=False)
    assert not (tmp_path / "deeper").exists()
    security = (Path(__file__).parents[2] / "docs" / "security.md").read_text()
    assert f"converter layer ids in 1..{MAX_LAYERS} without `--target`" in security  # the bound users are told


def test_aux_ids_override_and_target_range(make_draft, tiny, tmp_path, DELETE):
    src = make_draft("no-ids", speculators=True, config={"eagle_aux_hidden_state_layer_ids": DELETE})
    with pytest.raises(ConvertError, match="names no aux layer ids"):
        convert(src, tmp_path / "a", progress=False)
    res = convert(src, tmp_path / "b", aux_layer_ids=[2, 3, 5], progress=False)
    assert res.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 4]
    # id 6 on a 6-layer target is the final state: no capture point in sglang
    with pytest.raises(ConvertError, match="no capture point"):
        convert(src, tmp_path / "c", aux_layer_ids=[2, 3, 6], target=tiny["deepseek_v3"], progress=False)
    with pytest.raises(ConvertError, match="embeddings"):
        convert(src, tmp_path / "d", aux_layer_ids=[0, 3, 4], progress=False)
    assert not (tmp_path / "a").exists() and not (tmp_path / "c").exists() and not _leftovers(tmp_path)


def test_copies_tokenizer_but_never_config_py_or_pickles(make_draft, tmp_path):
    src = make_draft("extras", speculators=True)
    (src / "config.py").write_text("raise SystemExit('never executed')\n")
    (src / "tokenizer.json").write_text("{}")
    (src / "training_args.bin").write_bytes(b"\x80\x04not really a pickle")
    res = convert(src, tmp_path / "out", progress=False)
    names = {p.name for p in res.dst.iterdir()}
    assert "tokenizer.json" in names and "config.py" not in names and "training_args.bin" not in names


def test_progress_callback(tiny, tmp_path):
    seen = []
    res = convert(tiny["speculators_draft"], tmp_path / "out", progress=lambda done, total: seen.append((done, total)))
    assert seen and seen[-1][0] == seen[-1][1] == res.bytes_copied


# ------------------------------------------------------------------ destination safety
def test_refuses_existing_dst_unless_force(tiny, tmp_path):
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "keep.txt").write_text("mine")
    with pytest.raises(ConvertError, match="already exists"):
        convert(tiny["speculators_draft"], dst, progress=False)
    assert (dst / "keep.txt").read_text() == "mine"
    convert(tiny["speculators_draft"], dst, force=True, progress=False)
    assert not (dst / "keep.txt").exists() and (dst / "model.safetensors").is_file()
    assert not _leftovers(tmp_path)


@pytest.mark.parametrize("where", ["same", "inside", "parent"])
def test_never_writes_into_src(make_draft, where):
    src = make_draft("src", speculators=True)
    before = _tree_digest(src)
    dst = {"same": src, "inside": src / "out", "parent": src.parent}[where]
    with pytest.raises(ConvertError, match="overlaps the source"):
        convert(src, dst, force=True, progress=False)
    assert _tree_digest(src) == before


@pytest.mark.parametrize("exc, raised", [(KeyboardInterrupt, KeyboardInterrupt), (OSError, ConvertError)])
def test_interrupted_run_leaves_no_dst(tiny, tmp_path, monkeypatch, exc, raised):
    calls = []
    real = convert_mod._copy_range

    def flaky(*a, **kw):
        calls.append(1)
        if len(calls) == 5:
            raise exc("interrupted")
        return real(*a, **kw)

    monkeypatch.setattr(convert_mod, "_copy_range", flaky)
    with pytest.raises(raised) as err:  # an OSError becomes a what / where / fix message
        convert(tiny["speculators_draft"], tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists() and not _leftovers(tmp_path)
    if raised is ConvertError:  # an OSError without an errno: the general fix, not one for a known errno
        assert err.value.fix == "check DST and its parent directory" and err.value.found == "OSError [errno None]"


@pytest.mark.parametrize("run_doctor", [True, False])
def test_a_shard_that_does_not_read_back_is_refused(tiny, tmp_path, monkeypatch, run_doctor):
    """A write that loses bytes while reporting success (a failing network or FUSE filesystem): the converter
    re-reads each shard it wrote, refuses naming it, and leaves no DST behind (with or without the doctor)."""
    real = convert_mod._copy_range

    def lossy(src_fd, offset, length, dst_fd, progress):
        real(src_fd, offset, max(length - 1, 1), dst_fd, progress)

    monkeypatch.setattr(convert_mod, "_copy_range", lossy)
    with pytest.raises(ConvertError, match="the written shard does not read back") as err:
        convert(tiny["speculators_draft"], tmp_path / "out", progress=False, run_doctor=run_doctor)
    assert "model.safetensors" in err.value.where
    assert not (tmp_path / "out").exists() and not _leftovers(tmp_path)


def test_a_shard_whose_header_differs_from_the_plan_is_refused(tiny, tmp_path, monkeypatch):
    """A shard that reads back but whose header says other shapes than planned (here every matrix transposed)
    is refused, naming the shard, how many tensors differ and the first three, planned and written."""
    real = convert_mod.encode_header

    def transposed(entries, metadata=None):
        return real([(n, d, tuple(reversed(tuple(s)))) for n, d, s in entries], metadata)

    monkeypatch.setattr(convert_mod, "encode_header", transposed)
    with pytest.raises(ConvertError, match="the written shard's header does not match the plan") as err:
        convert(tiny["speculators_draft"], tmp_path / "out", progress=False)
    assert err.value.where.endswith("model.safetensors")
    shapes = {n: t.shape for n, t in read_header(tiny["draft"] / "model.safetensors").tensors.items()}
    differ = sorted(n for n, s in shapes.items() if tuple(reversed(s)) != s)
    assert len(differ) > 3
    found = err.value.found
    assert found.startswith(f"{len(differ)} tensor(s) differ; ")
    quoted = found.split("; ")[1:]
    assert [q.split(":")[0] for q in quoted] == differ[:3]
    for q, name in zip(quoted, differ):
        assert f"planned ('BF16', {shapes[name]}," in q and f"written ('BF16', {tuple(reversed(shapes[name]))}," in q
    assert not (tmp_path / "out").exists() and not _leftovers(tmp_path)


@pytest.mark.parametrize("metadata", [{"format": "np"}, {"format": "tf"}, {}])
def test_a_shard_not_marked_format_pt_is_refused(tiny, tmp_path, monkeypatch, metadata):
    """transformers reads a safetensors file's `format` metadata; a shard that does not say `pt` is refused."""
    real = convert_mod.encode_header
    monkeypatch.setattr(convert_mod, "encode_header", lambda entries, _metadata=None: real(entries, metadata))
    with pytest.raises(ConvertError, match="does not say format pt") as err:
        convert(tiny["speculators_draft"], tmp_path / "out", progress=False)
    assert err.value.where.endswith("model.safetensors") and err.value.found == str(metadata)
    assert not (tmp_path / "out").exists() and not _leftovers(tmp_path)


def test_a_dst_name_too_long_for_the_temporary_directory_is_refused(tiny, tmp_path):
    """DST is written beside itself under a longer temporary name first; a name that leaves no room for it is
    refused as a destination that cannot be created, with the fix."""
    dst = tmp_path / ("d" * 240)
    with pytest.raises(ConvertError, match="cannot create the destination") as err:
        convert(tiny["speculators_draft"], dst, progress=False)
    assert err.value.fix == "choose a shorter DST" and err.value.where == str(dst)
    assert not dst.exists() and not _leftovers(tmp_path)


def test_interrupted_forced_run_keeps_the_old_dst(tiny, tmp_path, monkeypatch):
    dst = tmp_path / "out"
    convert(tiny["speculators_draft"], dst, progress=False)
    before = _tree_digest(dst)

    def boom(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(convert_mod, "_copy_range", boom)
    with pytest.raises(KeyboardInterrupt):
        convert(tiny["speculators_draft"], dst, force=True, progress=False)
    assert _tree_digest(dst) == before and not _leftovers(tmp_path)


# ------------------------------------------------------------------ refusals
@pytest.mark.parametrize(
    "edit, tensors, needle",
    [
        ({"norm_before_fc": True}, None, "lacks tensors every EAGLE-3 draft needs"),  # carried: its weight is needed
        ({"fc_norm": True}, None, "fc_norm.0.weight, fc_norm.1.weight, fc_norm.2.weight"),
        ({"norm_before_residual": True}, None, "norm_before_residual=true (no sglang release up to 0.5.23 reads it)"),
        (lambda c: {k: v for k, v in c.items() if k != "norm_before_residual"}, None, "vLLM reads it as true"),
        (
            None,
            lambda t: t.update({"input_norm.weight": torch.ones(3 * tm.HIDDEN, dtype=torch.bfloat16)}),
            "norm_before_fc (input_norm.weight present, the field not set)",
        ),
        ({"transformer_layer_config": {"model_type": "qwen3"}}, None, "not a llama layer"),
        ({"transformer_layer_config": {"model_type": "gemma"}}, None, "not a llama layer"),  # sorts before llama
        (None, lambda t: t.update({"layers.0.self_attn.q_norm.weight": torch.ones(16, dtype=torch.bfloat16)}), "qwen3"),
        (None, lambda t: t.update({"verifier_head.weight": torch.ones(4, dtype=torch.bfloat16)}), "no place"),
        (None, lambda t: t.pop("layers.0.mlp.down_proj.weight"), "midlayer.mlp.down_proj.weight"),
        (None, lambda t: t.update(d2t=t["d2t"] + torch.arange(tm.DRAFT_VOCAB)), "absolute target ids"),
    ],
)
def test_refuses_what_sglang_cannot_serve(make_draft, tmp_path, edit, tensors, needle):
    src = make_draft("bad", speculators=True, config=edit, tensors=tensors)
    with pytest.raises(ConvertError) as info:
        convert(src, tmp_path / "out", progress=False)
    assert needle in str(info.value)
    assert not (tmp_path / "out").exists() and not _leftovers(tmp_path)


def test_refuses_pickle_only_source(tmp_path):
    src = tmp_path / "pickled"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(tm.speculators_config()))
    (src / "pytorch_model.bin").write_bytes(b"\x80\x04 would be unpickled by torch.load")
    with pytest.raises(ConvertError, match="never loads pickles"):
        convert(src, tmp_path / "out", progress=False)


def test_refuses_sglang_format_source(tiny, tmp_path):
    with pytest.raises(ConvertError, match="already in SGLang format"):
        convert(tiny["draft"], tmp_path / "out", progress=False)


def test_refuses_unreadable_source(make_draft, tmp_path):
    src = make_draft("trunc", speculators=True)
    f = src / "model.safetensors"
    f.write_bytes(f.read_bytes()[:100])
    from eagle3_patches.errors import Eagle3ConfigError

    with pytest.raises(Eagle3ConfigError, match="truncated"):
        convert(src, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ CLI
def test_cli_convert(cli, tiny, tmp_path):
    rc, out, err = cli("convert", tiny["speculators_draft"], tmp_path / "out", "--no-progress")
    assert rc == 0, out + err
    assert "aux layer ids [2, 3, 4]" in out and "-> [1, 2, 3]" in out
    rc, out, err = cli("convert", tiny["speculators_draft"], tmp_path / "out")
    assert rc == 1 and "already exists" in err and "--force" in err and "Traceback" not in out + err
    rc, out, err = cli("convert", tiny["speculators_draft"], tmp_path / "out2", "--max-shard-size", "lots")
    assert rc == 2
    rc, out, err = cli("convert", tiny["speculators_draft"], tmp_path / "out3", "--json", "--target", tiny["kimi_k25"])
    assert rc == 0 and json.loads(out)["doctor"]["ok"] is True


# ------------------------------------------------------------------ sizes, shard limits, DST's parents and debris
@pytest.mark.parametrize("text", ["5GB", "500MB", "1.5GB", "40KB", "2TB", " 7 mb "])
def test_decimal_sizes_read_as_the_hub_reads_them(text):
    """``--max-shard-size`` takes what ``save_pretrained(max_shard_size=...)`` takes, with the same bytes."""
    from huggingface_hub.serialization._base import parse_size_to_int

    assert convert_mod.parse_size(text) == parse_size_to_int(text)


@pytest.mark.parametrize(
    "text, power", [("123", 0), ("123B", 0), ("123KiB", 1), ("123MiB", 2), ("123GiB", 3), ("123TiB", 4)]
)
def test_binary_and_plain_sizes(text, power):
    assert convert_mod.parse_size(text) == 123 * 1024**power


def test_the_default_shard_size_is_the_hubs():
    from huggingface_hub.serialization._base import MAX_SHARD_SIZE, parse_size_to_int

    assert convert_mod.DEFAULT_MAX_SHARD_SIZE == parse_size_to_int(MAX_SHARD_SIZE)


def test_shards_are_filled_up_to_the_limit_and_never_past_it(tiny, tmp_path):
    """For limits one byte under what two tensors take together: no shard of several tensors exceeds
    the limit, and no shard could have taken the next shard's first tensor (shards are filled in order)."""
    from eagle3_patches.checkpoint.conversion_plan import plan_conversion

    nbytes = {i.out: i.src.nbytes for i in plan_conversion(tiny["speculators_draft"]).items}
    seen = []
    for k, f in enumerate(
        sorted({a + b + d for a, b in zip(nbytes.values(), list(nbytes.values())[1:]) for d in (-1,)})
    ):
        res = convert(
            tiny["speculators_draft"], tmp_path / f"out{k}", max_shard_size=f, progress=False, run_doctor=False
        )
        shards = [list(read_header(p).tensors) for p in res.files]
        assert sorted(n for s in shards for n in s) == sorted(nbytes)
        for s in shards:
            assert len(s) == 1 or sum(nbytes[n] for n in s) <= f, (s, f)
        for s, nxt in zip(shards, shards[1:]):
            assert sum(nbytes[n] for n in s) + nbytes[nxt[0]] > f, (s, nxt, f)
        seen.append(len(shards))
    assert max(seen) > 2  # the limits did split the draft


@pytest.mark.parametrize("kind", ["file", "link-to-dir"])
def test_force_replaces_a_file_or_a_link_and_leaves_nothing_behind(tiny, tmp_path, kind):
    """``--force`` on a DST that is a file, or a link to a directory: DST becomes the draft, the link's target
    is untouched, and nothing is left beside DST."""
    dst = tmp_path / "out"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("mine")
    if kind == "file":
        dst.write_text("old")
    else:
        dst.symlink_to(elsewhere, target_is_directory=True)
    convert(tiny["speculators_draft"], dst, force=True, progress=False)
    assert dst.is_dir() and not dst.is_symlink() and (dst / "model.safetensors").is_file()
    assert (elsewhere / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "out"]


def test_a_forced_run_whose_final_rename_fails_puts_the_old_dst_back(tiny, tmp_path, monkeypatch):
    dst = tmp_path / "out"
    convert(tiny["speculators_draft"], dst, progress=False)
    before = _tree_digest(dst)
    real = convert_mod.os.rename

    def rename(a, b, *args, **kw):
        if ".eagle3-convert-" in Path(a).name and Path(b) == dst:
            raise OSError(28, "No space left on device")
        return real(a, b, *args, **kw)

    monkeypatch.setattr(convert_mod.os, "rename", rename)
    with pytest.raises(ConvertError, match="cannot write the converted draft") as err:
        convert(tiny["speculators_draft"], dst, force=True, progress=False)
    assert err.value.fix == "free space or choose a DST on another filesystem"
    monkeypatch.undo()
    assert _tree_digest(dst) == before and not _leftovers(tmp_path)


def test_missing_parents_of_dst_are_created_and_removed_again_on_failure(tiny, make_draft, tmp_path):
    dst = tmp_path / "a" / "b" / "out"
    res = convert(tiny["speculators_draft"], dst, progress=False)
    assert (res.dst / "model.safetensors").is_file()
    bad = make_draft(
        "bad", speculators=True, tensors=lambda t: t.update({"fc.weight": t["fc.weight"][:, :8].contiguous()})
    )
    with pytest.raises(ConvertError):
        convert(bad, tmp_path / "x" / "y" / "out", progress=False)
    assert not (tmp_path / "x").exists()


def test_debris_of_dead_runs_on_this_dst_is_removed_and_the_rest_kept(tiny, tmp_path, monkeypatch):
    """Every temporary directory a dead run left for DST goes, whatever else the parent holds (unrelated files,
    another DST's debris, a file with a debris name, an entry that vanishes while listed)."""
    dst = tmp_path / "out"
    for i in range(30):
        (tmp_path / f"unrelated-{i:02d}").write_text("x")
    dead = [tmp_path / f".out.eagle3-convert-{os.getpid()}-0-{i:08x}" for i in range(3)]  # token 0: not this process
    for d in dead:
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"partial")
    other = tmp_path / f".other.eagle3-convert-{os.getpid()}-0-0000000a"
    other.mkdir()
    later = tmp_path / f".zzz.eagle3-convert-{os.getpid()}-0-0000000d"  # another DST whose name sorts after "out"
    later.mkdir()
    plain = tmp_path / f".out.eagle3-convert-{os.getpid()}-0-0000000b"
    plain.write_text("a file, not a run's directory")
    vanished = f".out.eagle3-convert-{os.getpid()}-0-0000000c"
    real_lstat = convert_mod.os.lstat

    def lstat(path, *a, **kw):
        if Path(path).name == vanished:
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real_lstat(path, *a, **kw)

    real_listdir = convert_mod.os.listdir
    # the vanishing entry and the plain file first: every later entry is still looked at
    monkeypatch.setattr(
        convert_mod.os,
        "listdir",
        lambda p: (
            [vanished, plain.name, *(n for n in real_listdir(p) if n != plain.name)]
            if Path(p) == tmp_path
            else real_listdir(p)
        ),
    )
    monkeypatch.setattr(convert_mod.os, "lstat", lstat)
    res = convert(tiny["speculators_draft"], dst, progress=False)
    monkeypatch.undo()
    assert sorted(res.cleaned) == sorted(f"removed {d.name}, left by a killed run (pid {os.getpid()})" for d in dead)
    assert not any(d.exists() for d in dead) and other.is_dir() and later.is_dir() and plain.is_file()
    assert len(list(tmp_path.glob("unrelated-*"))) == 30


def test_the_first_broken_shard_of_the_source_is_named(make_draft, tmp_path):
    src = make_draft("two-bad", speculators=True, shards=3)
    shards = sorted(src.glob("*.safetensors"))
    for f in shards[:2]:
        f.write_bytes(f.read_bytes()[:100])
    from eagle3_patches.errors import Eagle3ConfigError

    with pytest.raises(Eagle3ConfigError) as err:
        convert(src, tmp_path / "out", progress=False)
    assert shards[0].name in str(err.value) and shards[1].name not in str(err.value)


def test_debris_whose_pid_now_names_another_process_is_removed(tiny, tmp_path):
    """A killed run's pid, reused by a live process since: its start time differs, so the debris still goes."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # named by the live child's pid, with the token this (older) process has: an owner that is gone
        debris = tmp_path / f".out.eagle3-convert-{child.pid}-{convert_mod._process_token(os.getpid())}-00000001"
        debris.mkdir()
        res = convert(tiny["speculators_draft"], tmp_path / "out", progress=False)
    finally:
        child.kill()
        child.wait()
    assert res.cleaned == [f"removed {debris.name}, left by a killed run (pid {child.pid})"] and not debris.exists()


def test_unknown_source_tensors_are_listed_eight_at_most(make_draft, tmp_path):
    extra = [f"extra_{i}.weight" for i in range(10)]
    src = make_draft(
        "extra", speculators=True, tensors=lambda t: t.update({n: torch.ones(2, dtype=torch.bfloat16) for n in extra})
    )
    with pytest.raises(ConvertError) as err:
        convert(src, tmp_path / "out", progress=False)
    assert err.value.what.startswith("10 source tensor(s) have no place")
    assert err.value.found == ", ".join(sorted(extra)[:8]) + " ..."


def test_a_source_shard_that_shrinks_while_copying_is_refused(make_draft, tmp_path):
    """A source rewritten under the converter (a download still running): the copy stops at its new end with
    what / where instead of spinning, and DST is not left behind."""
    src = make_draft("shrinking", speculators=True, shards=2)
    shards = sorted(src.glob("*.safetensors"))
    cut = []

    def progress(done, total):
        if not cut:
            for f in shards:
                os.truncate(f, 200)
            cut.append(done)

    with pytest.raises(ConvertError, match="the source file ended early while copying"):
        convert(src, tmp_path / "out", progress=progress)
    assert cut and not (tmp_path / "out").exists() and not _leftovers(tmp_path)


def test_the_output_config_names_no_remote_code(make_draft, tmp_path):
    """An ``auto_map`` in the source's layer config (a verifier with custom code) is not carried into the
    config sglang reads: the converted draft never asks for remote code."""
    src = make_draft(
        "automap", speculators=True, config={"transformer_layer_config": {"auto_map": {"AutoConfig": "x.Y"}}}
    )
    res = convert(src, tmp_path / "out", progress=False)
    assert "auto_map" not in json.loads((res.dst / "config.json").read_text()) and "auto_map" not in res.config


# ------------------------------------------------------------------ mutation survivors (fifth session, helper)
@pytest.mark.parametrize("ids", [[2, 2, 4], [4, 2, 3], [2, 4, 3]])
@pytest.mark.parametrize("by_option", [True, False])
def test_repeated_or_unordered_aux_ids_are_refused_naming_where_they_came_from(make_draft, tmp_path, by_option, ids):
    """Ids repeated ([2, 2, 4]) or out of order are refused; the error points at the flag or at the source's
    config.json, wherever the ids came from."""
    src = make_draft(
        "dup-ids", speculators=True, config=None if by_option else {"eagle_aux_hidden_state_layer_ids": ids}
    )
    with pytest.raises(ConvertError) as err:
        convert(src, tmp_path / "out", aux_layer_ids=ids if by_option else None, progress=False)
    assert err.value.what == "the aux layer ids are not distinct and increasing" and err.value.found == str(ids)
    assert err.value.where == (
        "--aux-layer-ids" if by_option else f"{src / 'config.json'}: eagle_aux_hidden_state_layer_ids"
    )
    assert not (tmp_path / "out").exists() and not _leftovers(tmp_path)


def test_aux_id_1_the_output_of_the_first_layer_converts(tiny, tmp_path):
    """speculators' id 1 (the input of layer 1 = the output of layer 0) is a capture point: converted to 0."""
    res = convert(
        tiny["speculators_draft"], tmp_path / "out", aux_layer_ids=[1, 2, 3], progress=False, run_doctor=False
    )
    assert json.loads((res.dst / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [
        0,
        1,
        2,
    ]


def test_a_negative_aux_id_is_not_a_layer_number(tiny, tmp_path):
    with pytest.raises(ConvertError) as err:
        convert(tiny["speculators_draft"], tmp_path / "out", aux_layer_ids=[-1, 2, 3], progress=False)
    assert err.value.what == "the aux layer ids are not layer numbers" and err.value.found == "[-1, 2, 3]"
    assert not (tmp_path / "out").exists() and not _leftovers(tmp_path)


def test_an_aux_id_past_the_targets_last_capture_point_names_the_valid_range(tiny, tmp_path):
    n = json.loads((tiny["deepseek_v3"] / "config.json").read_text())["num_hidden_layers"]
    with pytest.raises(ConvertError) as err:
        convert(
            tiny["speculators_draft"],
            tmp_path / "out",
            aux_layer_ids=[2, 3, n],
            target=tiny["deepseek_v3"],
            progress=False,
        )
    assert err.value.expected == f"ids in 1..{n - 1}" and err.value.where == "--aux-layer-ids"
    assert err.value.what == f"aux id {n} (the input of layer {n}) has no capture point in sglang on a {n}-layer target"
    assert err.value.found == f"[2, 3, {n}]"


@pytest.mark.parametrize(
    "edit, key, hint",
    [
        (lambda c: {k: v for k, v in c.items() if k != "norm_before_residual"}, "norm_before_residual", True),
        ({"norm_before_residual": True}, "norm_before_residual", False),
        ({"fc_norm": True, "norm_before_residual": True}, "norm_before_residual", False),  # fc_norm: carried
    ],
)
def test_unsupported_options_name_the_first_key_and_hint_only_for_a_missing_norm_before_residual(
    make_draft, tmp_path, edit, key, hint
):
    """The error points at the config key (not at the explanation in parentheses); only a draft whose config
    lacks norm_before_residual gets the hint to write it as false."""
    src = make_draft("unsupported", speculators=True, config=edit)
    with pytest.raises(ConvertError) as err:
        convert(src, tmp_path / "out", progress=False)
    assert err.value.where == f"{src / 'config.json'}: {key}"
    assert ('write "norm_before_residual": false into its config.json' in err.value.fix) is hint
    assert err.value.fix.startswith("retrain (or fine-tune) the draft with those options off, or serve it with vLLM")


def test_a_missing_draft_vocab_size_is_read_from_lm_head(make_draft, tmp_path, DELETE):
    src = make_draft("no-draft-vocab", speculators=True, config={"draft_vocab_size": DELETE})
    res = convert(src, tmp_path / "out", progress=False)
    cfg = json.loads((res.dst / "config.json").read_text())
    assert (
        cfg["draft_vocab_size"]
        == tm.DRAFT_VOCAB
        == read_header(src / "model.safetensors").tensors["lm_head.weight"].shape[0]
    )


def test_a_source_without_fc_and_with_a_null_target_hidden_size_is_refused_naming_fc(make_draft, tmp_path):
    src = make_draft(
        "no-fc", speculators=True, config={"target_hidden_size": None}, tensors=lambda t: t.pop("fc.weight")
    )
    with pytest.raises(ConvertError) as err:
        convert(src, tmp_path / "out", progress=False)
    assert err.value.what == "the source lacks tensors every EAGLE-3 draft needs" and err.value.found == "fc.weight"
    assert not (tmp_path / "out").exists() and not _leftovers(tmp_path)


def test_an_untied_source_without_lm_head_is_refused_naming_it(make_draft, tmp_path):
    src = make_draft("no-lm-head", speculators=True, tensors=lambda t: t.pop("lm_head.weight"))
    with pytest.raises(ConvertError) as err:
        convert(src, tmp_path / "out", progress=False)
    assert (
        err.value.what == "the source lacks tensors every EAGLE-3 draft needs" and err.value.found == "lm_head.weight"
    )
    assert err.value.where == str(src) and err.value.fix == "re-export the draft"
    assert not (tmp_path / "out").exists() and not _leftovers(tmp_path)


def test_the_verifier_speculators_trained_against_is_recorded(tiny, tmp_path):
    res = convert(tiny["speculators_draft"], tmp_path / "out", progress=False)
    src_cfg = json.loads((tiny["speculators_draft"] / "config.json").read_text())
    got = json.loads((res.dst / "config.json").read_text())["eagle3_patches_converted_from"]["verifier"]
    assert got == src_cfg["speculators_config"]["verifier"] and got["name_or_path"]


@pytest.mark.parametrize("repeats", [1, 2])
def test_the_first_tensor_stored_in_two_shards_is_named(make_draft, tmp_path, repeats):
    """Extra shards (read after model.safetensors, in name order) each repeat a different tensor: the error
    names the first repeat and its two files; a single repeat is refused as well."""
    from safetensors.torch import save_file

    src = make_draft("dups", speculators=True)
    save_file(
        {"norm.weight": torch.ones(tm.HIDDEN, dtype=torch.bfloat16)},
        str(src / "model.x1.safetensors"),
        metadata={"format": "pt"},
    )
    if repeats == 2:
        save_file(
            {"fc.weight": torch.ones(tm.HIDDEN, 3 * tm.HIDDEN, dtype=torch.bfloat16)},
            str(src / "model.x2.safetensors"),
            metadata={"format": "pt"},
        )
    with pytest.raises(ConvertError) as err:
        convert(src, tmp_path / "out", progress=False)
    assert err.value.what == "tensor norm.weight is stored in two shards"
    assert err.value.found == "model.safetensors, model.x1.safetensors" and err.value.where == str(src)
    assert not (tmp_path / "out").exists() and not _leftovers(tmp_path)


@pytest.mark.parametrize("n", [1, 7])
def test_names_the_index_lists_but_the_shards_lack_are_listed_five_at_most(make_draft, tmp_path, n):
    src = make_draft("absent", speculators=True, shards=2)
    index_path = src / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    ghosts = [f"ghost_{i}.weight" for i in range(n)]
    index["weight_map"].update({g: "model-00001-of-00002.safetensors" for g in ghosts})
    index_path.write_text(json.dumps(index))
    with pytest.raises(ConvertError) as err:
        convert(src, tmp_path / "out", progress=False)
    assert err.value.what == "tensors in the source's index are not in the shard it names"
    assert err.value.where == str(index_path) and err.value.found == ", ".join(ghosts[:5])


def test_a_zero_max_shard_size_is_refused(cli, tiny, tmp_path):
    with pytest.raises(ValueError, match="size must be positive"):
        convert_mod.parse_size("0")
    assert convert_mod.parse_size("1") == convert_mod.parse_size("1B") == 1  # the smallest size there is
    rc, out, err = cli("convert", tiny["speculators_draft"], tmp_path / "out", "--max-shard-size", "0", "--no-progress")
    assert rc == 2 and "size must be positive: '0'" in err and not (tmp_path / "out").exists()


def test_shards_hold_exactly_the_limit(tiny, tmp_path):
    """A limit equal to what the tensors of a shard take together keeps them in one shard: the limit is inclusive,
    in every shard (the count starts over at zero with each new shard)."""
    res = convert(tiny["speculators_draft"], tmp_path / "one", progress=False, run_doctor=False)
    order = [(n, t.nbytes) for n, t in sorted(read_header(res.files[0]).tensors.items(), key=lambda kv: kv[1].start)]
    later_full = False
    for k in range(len(order) - 1):  # a limit of exactly tensors k and k+1: they fill one shard
        f = order[k][1] + order[k + 1][1]
        out = convert(
            tiny["speculators_draft"], tmp_path / f"out{k}", max_shard_size=f, progress=False, run_doctor=False
        )
        shards = [
            [(n, t.nbytes) for n, t in sorted(read_header(p).tensors.items(), key=lambda kv: kv[1].start)]
            for p in out.files
        ]
        assert [e for s in shards for e in s] == order
        for s, nxt in zip(shards, shards[1:]):
            assert len(s) == 1 or sum(b for _, b in s) <= f
            assert sum(b for _, b in s) + nxt[0][1] > f, (k, s, nxt, f)
        full = [i for i, s in enumerate(shards) if len(s) > 1 and sum(b for _, b in s) == f]
        if k == 0:
            assert full[:1] == [0]  # the first two tensors fill the first shard exactly
        later_full = later_full or any(i > 0 for i in full)
    assert later_full  # some shard after the first was filled to exactly the limit


@pytest.mark.parametrize("how", ["missing", "fails"])
def test_without_copy_file_range_the_bytes_are_copied_by_read_and_write(tiny, tmp_path, monkeypatch, how):
    """A platform without ``os.copy_file_range`` (macOS) or a filesystem that refuses it (EXDEV across mounts):
    the copy falls back to pread/write and the output is the same, byte for byte."""
    import errno as _errno

    if how == "missing":
        monkeypatch.delattr(convert_mod.os, "copy_file_range", raising=False)
    else:

        def refuse(*a, **kw):
            raise OSError(_errno.EXDEV, "Invalid cross-device link")

        monkeypatch.setattr(convert_mod.os, "copy_file_range", refuse, raising=False)
    src = tiny["speculators_draft"]
    res = convert(src, tmp_path / "out", progress=False)
    monkeypatch.undo()
    got, want = _all_tensors(res.dst), _all_tensors(tiny["draft"])
    assert {n: _bytes(t) for n, t in got.items()} == {n: _bytes(t) for n, t in want.items()}
    side = sorted(p.name for p in src.iterdir() if convert_mod.COPY_FILES.match(p.name))
    assert side and all((res.dst / n).read_bytes() == (src / n).read_bytes() for n in side)
    assert res.report.ok and not _leftovers(tmp_path)


def test_side_files_are_copied_byte_for_byte_and_never_wider(make_draft, tmp_path):
    src = make_draft("side", speculators=True)
    payload = {
        "tokenizer.json": json.dumps({"model": {"vocab": {f"t{i}": i for i in range(3000)}}}).encode(),
        "special_tokens_map.json": b'{"bos_token": "<s>"}\n',
        "chat_template.jinja": b"{{ messages }}\n",
    }
    for name, data in payload.items():
        (src / name).write_bytes(data)
    os.chmod(src / "chat_template.jinja", 0o600)
    res = convert(src, tmp_path / "out", progress=False)
    for name, data in payload.items():
        assert (res.dst / name).read_bytes() == data, name
    assert (res.dst / "chat_template.jinja").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("kind", ["link-out", "too-large"])
def test_refused_side_files_are_reported_together(make_draft, tmp_path, kind):
    """Side files are checked before anything is written; the refusal names each refused file with the
    converter's own fix, and nothing is left behind."""
    src = make_draft("side-bad", speculators=True)
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    (src / "tokenizer.json").symlink_to(outside)
    if kind == "too-large":
        (src / "vocab.txt").touch()
        os.truncate(
            src / "vocab.txt", (256 << 20) + 1
        )  # one byte over docs/security.md's bound; sparse: nothing is read
    with pytest.raises(ConvertError) as err:
        convert(src, tmp_path / "out", progress=False)
    refused = "tokenizer.json" if kind == "link-out" else "tokenizer.json, vocab.txt"
    assert err.value.what.startswith(f"the source's side file(s) {refused} are refused")
    assert err.value.where == str(src) and err.value.fix.startswith("replace each link with the file it stands for")
    if kind == "too-large":
        assert f"{(256 << 20) + 1} bytes (at most {256 << 20})" in err.value.found
    assert not (tmp_path / "out").exists() and not _leftovers(tmp_path)


@pytest.mark.parametrize("sub", [["out"], ["a", "out"]])
def test_a_file_where_dsts_parent_should_be_is_named(tiny, tmp_path, sub):
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    dst = blocker.joinpath(*sub)
    with pytest.raises(ConvertError) as err:
        convert(tiny["speculators_draft"], dst, progress=False)
    assert err.value.what.endswith(f": {blocker} is not a directory") and err.value.found == f"a file at {blocker}"
    assert err.value.fix == "choose another DST, or move that file away"
    assert blocker.read_text() == "not a directory" and not _leftovers(tmp_path)


def test_parents_created_before_a_failing_one_are_removed_again(tiny, tmp_path):
    """DST's parents are created outermost first; when one cannot be (a name too long), those already created go."""
    dst = tmp_path / "a" / "b" / ("c" * 300) / "out"
    with pytest.raises(ConvertError) as err:
        convert(tiny["speculators_draft"], dst, progress=False)
    assert err.value.what == "cannot create the destination's parent directory: File name too long"
    assert err.value.fix == "choose a shorter DST" and err.value.found == "OSError [errno 36]"
    assert not (tmp_path / "a").exists() and not _leftovers(tmp_path)


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_interrupt_a_conversion_and_the_callers_handler_is_restored(tiny, tmp_path, signame):
    import signal

    sig = getattr(signal, signame)
    seen = []
    previous = signal.signal(sig, lambda s, f: seen.append(s))
    try:
        with pytest.raises(convert_mod.ConvertInterrupted) as err:
            convert(
                tiny["speculators_draft"],
                tmp_path / "new" / "out",
                progress=lambda done, total: os.kill(os.getpid(), sig),
            )
        assert err.value.signum == sig and str(err.value) == f"interrupted by {signame}"
        assert not seen and not (tmp_path / "new").exists()
        os.kill(os.getpid(), sig)  # the caller's own handler is back
        assert seen == [sig]
    finally:
        signal.signal(sig, previous)


def test_the_progress_bar_shows_scaled_byte_counts(tiny, tmp_path, capsys):
    res = convert(tiny["speculators_draft"], tmp_path / "out", progress=True)
    err = capsys.readouterr().err
    last = err.replace("\r", "\n").strip().splitlines()[-1]
    assert last.startswith("convert: 100%")
    import re

    from tqdm import tqdm

    shown = tqdm.format_sizeof(res.bytes_copied, divisor=1024)  # in KiB, shown as "k": e.g. 164k
    assert re.search(rf"\| {re.escape(shown)}/{re.escape(shown)} \[", last) and shown.endswith("k"), (shown, last)
    assert str(res.bytes_copied) not in last


def test_a_small_checkpoint_shows_no_progress_bar_on_a_terminal(tiny, tmp_path, monkeypatch):
    import io
    import sys

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    res = convert(tiny["speculators_draft"], tmp_path / "out", progress=None)
    monkeypatch.undo()
    assert res.bytes_copied < 256 << 20 and term.getvalue() == ""


@pytest.mark.parametrize("extra, bar", [(0, True), (-1, False), (-(1 << 20) + 1, False), (-(128 << 20), False)])
def test_the_default_progress_bar_starts_at_256_mib_on_a_terminal(tiny, tmp_path, monkeypatch, extra, bar):
    """``progress=None`` (the CLI's default): a bar on a terminal for a checkpoint of 256 MiB or more, none below.
    The source's embed_tokens is sized so the tensors total 256 MiB + ``extra`` bytes; its data is a hole
    (nothing is read: Ctrl-C as soon as copying starts)."""
    import io
    import sys

    src = tmp_path / "big"
    src.mkdir()
    (src / "config.json").write_bytes((tiny["speculators_draft"] / "config.json").read_bytes())
    small = read_header(tiny["speculators_draft"] / "model.safetensors").tensors
    base = sum(t.nbytes for t in small.values())
    want = (256 << 20) + extra - base
    entries = [(n, t.dtype, t.shape) for n, t in small.items()] + [("embed_tokens.weight", "U8", (want,))]
    header, offsets = convert_mod.encode_header(entries, {"format": "pt"})
    with open(src / "model.safetensors", "wb") as f:
        f.write(header)
        f.truncate(len(header) + max(e for _, e in offsets.values()))  # sparse

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    def ctrl_c(*a, **kw):
        raise KeyboardInterrupt

    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    monkeypatch.setattr(convert_mod, "_copy_range", ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        convert(src, tmp_path / "out", progress=None)
    monkeypatch.undo()
    assert term.getvalue().startswith("\rconvert:   0%") is bar, term.getvalue()
    assert not (tmp_path / "out").exists() and not _leftovers(tmp_path)


def test_renamed_tensors_are_reported_exactly(cli, tiny, tmp_path):
    """The result (and ``convert --json``) lists every renamed tensor, layers.0.* -> midlayer.*, and nothing else."""
    want = {f"layers.0.{p}": f"midlayer.{p}" for p in conversion_plan._MIDLAYER_PARAMS}
    res = convert(tiny["speculators_draft"], tmp_path / "out", progress=False)
    assert res.renamed == want
    rc, out, err = cli("convert", tiny["speculators_draft"], tmp_path / "out2", "--json")
    assert rc == 0 and json.loads(out)["renamed"] == want


def test_a_source_config_without_dtype_takes_it_from_fc(make_draft, tmp_path, DELETE):
    src = make_draft(
        "no-dtype",
        speculators=True,
        config={"dtype": DELETE},
        tensors=lambda t: t.update({k: v.to(torch.float16) for k, v in t.items() if v.dtype == torch.bfloat16}),
    )
    res = convert(src, tmp_path / "out", progress=False)
    assert json.loads((res.dst / "config.json").read_text())["torch_dtype"] == "float16"


def test_plan_conversion_keeps_embed_tokens_unless_asked(tmp_path):
    from eagle3_patches.checkpoint.conversion_plan import plan_conversion

    src = tm.build_speculators_fixture(tmp_path)
    plan = plan_conversion(src)
    assert plan.dropped == [] and "embed_tokens.weight" in {i.out for i in plan.items}
    assert plan_conversion(src, drop_embed_tokens=True).dropped == ["embed_tokens.weight"]


@pytest.mark.parametrize(
    "rope, want",
    [
        ({"rope_theta": 5e5, "rope_type": "default"}, None),
        ({"rope_theta": 5e5, "rope_type": "linear"}, {"rope_type": "linear", "type": "linear"}),
        ({"rope_theta": 5e5, "type": "dynamic"}, {"rope_type": "dynamic", "type": "dynamic"}),
        (
            {"rope_theta": 5e5, "rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192},
            {"rope_type": "llama3", "type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192},
        ),
        (  # the default rope with one parameter keeps it
            {"rope_theta": 5e5, "rope_type": "default", "partial_rotary_factor": 0.5},
            {"rope_type": "default", "type": "default", "partial_rotary_factor": 0.5},
        ),
    ],
)
def test_rope_parameters_become_rope_theta_and_rope_scaling(rope, want):
    """Only the default rope with no parameters becomes ``rope_scaling: null``; any other type is kept, even without
    parameters.
    """
    cfg = tm.speculators_config()
    cfg["transformer_layer_config"]["rope_parameters"] = rope
    out = conversion_plan.build_config(cfg, {})
    assert out["rope_theta"] == 5e5 and out["rope_scaling"] == want and "rope_parameters" not in out


def test_progress_without_tqdm_converts_without_a_bar(tiny, tmp_path, monkeypatch, capsys):
    """tqdm is optional: asked for a bar without it, the conversion still runs (and prints no bar)."""
    import sys

    monkeypatch.setitem(sys.modules, "tqdm", None)  # `from tqdm import tqdm` raises ImportError
    res = convert(tiny["speculators_draft"], tmp_path / "out", progress=True)
    monkeypatch.undo()
    assert (res.dst / "model.safetensors").is_file() and res.report.ok and capsys.readouterr().err == ""


def test_of_several_doctor_errors_on_the_output_the_first_is_raised(make_draft, tmp_path):
    """A source the converter plans but whose output the doctor refuses (wrong norm shapes, absolute d2t): the
    ConvertError carries the doctor's first error, and names DST, not the temporary directory."""
    from eagle3_patches.doctor import check_draft

    def bad(t):
        t["norm.weight"] = torch.ones(32, dtype=torch.bfloat16)
        t["layers.0.input_layernorm.weight"] = torch.ones(32, dtype=torch.bfloat16)
        t["d2t"] = t["d2t"] + torch.arange(tm.DRAFT_VOCAB)

    src = make_draft("doctor-bad", speculators=True, tensors=bad)
    unchecked = convert(src, tmp_path / "unchecked", progress=False, run_doctor=False).dst
    errors = check_draft(unchecked).errors
    assert len(errors) >= 2 and len({e.what for e in errors}) >= 2
    with pytest.raises(ConvertError) as err:
        convert(src, tmp_path / "out", progress=False)
    first = errors[0]
    assert err.value.what == f"the converted draft fails the doctor's checks: {first.what}"
    assert err.value.where == first.where.replace(str(unchecked), str(tmp_path / "out")) and err.value.fix == first.fix
    assert not (tmp_path / "out").exists() and not _leftovers(tmp_path)


@pytest.mark.parametrize("n", [0, 2])
def test_a_layer_config_with_other_than_one_decoder_layer_is_refused(make_draft, tmp_path, n):
    src = make_draft("layers", speculators=True, config={"transformer_layer_config": {"num_hidden_layers": n}})
    with pytest.raises(ConvertError) as err:
        convert(src, tmp_path / "out", progress=False)
    assert err.value.what == "sglang's EAGLE-3 draft has exactly one decoder layer"
    assert err.value.found == str(n) and err.value.expected == "1"


def test_model_prefixed_tensor_names_lose_the_prefix(make_draft, tmp_path):
    """transformers-style names (model.fc.weight, model.layers.0.*, model.norm.weight) convert like bare ones."""

    def prefixed(t):
        return {("model." + k if k not in ("d2t", "t2d", "lm_head.weight") else k): v for k, v in t.items()}

    src = make_draft("prefixed", speculators=True, tensors=prefixed)
    res = convert(src, tmp_path / "out", progress=False)
    assert set(read_header(res.dst / "model.safetensors").tensors) == set(
        read_header(make_draft("plain").joinpath("model.safetensors")).tensors
    )
    assert (
        res.renamed["model.fc.weight"] == "fc.weight"
        and res.renamed["model.layers.0.mlp.up_proj.weight"] == "midlayer.mlp.up_proj.weight"
    )


def test_tie_word_embeddings_defaults_to_false(make_draft, tmp_path, DELETE):
    src = make_draft(
        "no-tie",
        speculators=True,
        config={"tie_word_embeddings": DELETE, "transformer_layer_config": {"tie_word_embeddings": DELETE}},
    )
    res = convert(src, tmp_path / "out", progress=False)
    assert json.loads((res.dst / "config.json").read_text())["tie_word_embeddings"] is False


def test_dst_the_current_directory_is_refused_as_such(tiny, tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for dst in (".", ".."):
        with pytest.raises(ConvertError) as err:
            convert(tiny["speculators_draft"], dst, progress=False)
        assert (
            err.value.what.startswith("DST must name a new directory, not the current directory")
            and err.value.where == dst
        )


def test_a_side_file_of_256_mib_passes_the_size_check(make_draft, tmp_path, monkeypatch):
    """The documented limit: a side file of exactly 256 MiB is copied (the copy is interrupted here at once; the
    file is a hole), one byte more is refused (test_refused_side_files_are_reported_together)."""
    src = make_draft("side-256", speculators=True)
    (src / "vocab.txt").touch()
    os.truncate(src / "vocab.txt", 256 << 20)

    def ctrl_c(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(convert_mod, "_copy_range", ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        convert(src, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists() and not _leftovers(tmp_path)


def test_dst_permissions_are_never_wider_than_0644_and_0755(make_draft, tmp_path):
    src = make_draft("wide", speculators=True)
    (src / "tokenizer.json").write_text("{}")
    for p in src.iterdir():
        os.chmod(p, 0o777)
    os.chmod(src, 0o777)
    umask = os.umask(0)
    os.umask(umask)
    res = convert(src, tmp_path / "new" / "out", progress=False)
    assert {p.name: p.stat().st_mode & 0o777 for p in res.dst.iterdir()} == dict.fromkeys(
        ["config.json", "model.safetensors", "tokenizer.json"], 0o644
    )
    assert res.dst.stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "new").stat().st_mode & 0o777 == 0o755 & ~umask  # a parent it created: as mkdir -p


def test_a_pickle_only_source_names_three_pickles_at_most(tmp_path):
    src = tmp_path / "pickled"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(tm.speculators_config()))
    names = [f"pytorch_model-0000{i}-of-00004.bin" for i in range(1, 5)]
    for n in names:
        (src / n).write_bytes(b"\x80\x04")
    with pytest.raises(ConvertError) as err:
        convert(src, tmp_path / "out", progress=False)
    assert err.value.found == ", ".join(names[:3])


@pytest.mark.parametrize("fields", [{"draft_vocab_size": "x", "target_hidden_size": "y"}, {"draft_vocab_size": "x"}])
def test_the_first_unusable_config_field_is_named(make_draft, tmp_path, fields):
    src = make_draft("fields", speculators=True, config=fields)
    with pytest.raises(ConvertError) as err:
        convert(src, tmp_path / "out", progress=False)
    assert err.value.what == "the source config field draft_vocab_size is unusable"
    assert err.value.where == f"{src / 'config.json'}: draft_vocab_size" and err.value.found == "'x'"
    assert not (tmp_path / "out").exists()


def test_absurd_aux_ids_are_quoted_200_characters_at_most(tiny, tmp_path):
    ids = [2, 3, 10**400]
    with pytest.raises(ConvertError) as err:
        convert(tiny["speculators_draft"], tmp_path / "out", aux_layer_ids=ids, progress=False)
    assert err.value.found == repr(ids)[:200] and len(err.value.found) == 200


def test_the_last_aux_id_a_target_can_capture_converts(tiny, tmp_path):
    n = json.loads((tiny["deepseek_v3"] / "config.json").read_text())["num_hidden_layers"]
    res = convert(
        tiny["speculators_draft"],
        tmp_path / "out",
        aux_layer_ids=[2, 3, n - 1],
        target=tiny["deepseek_v3"],
        progress=False,
    )
    assert res.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, n - 2]


def test_debris_of_another_user_is_left_alone(tiny, tmp_path):
    foreign = tmp_path / f".out.eagle3-convert-{os.getpid()}-0-0000000f"  # token 0: its owner is gone
    foreign.mkdir()
    os.chown(foreign, 12345, 12345)
    res = convert(tiny["speculators_draft"], tmp_path / "out", progress=False)
    assert res.cleaned == [] and foreign.is_dir()


def test_an_old_dst_left_by_a_killed_forced_run_is_restored_first(tiny, tmp_path):
    """A ``--force`` run killed between its two renames leaves DST moved aside; the next run puts it back
    (then, forced, replaces it)."""
    dst = tmp_path / "out"
    old = tmp_path / f".out.eagle3-old-{os.getpid()}-0-00000001"
    old.mkdir()
    (old / "mine.txt").write_text("old draft")
    res = convert(tiny["speculators_draft"], dst, force=True, progress=False)
    assert res.cleaned == [f"restored {dst} from {old.name}, left by a killed run (pid {os.getpid()})"]
    assert (dst / "model.safetensors").is_file() and not old.exists() and not _leftovers(tmp_path)


def test_an_old_dst_put_back_is_refused_before_copying_without_force(tiny, tmp_path):
    """The same debris, the next run without ``--force``: DST is put back and the run stops at once, saying so,
    before it copies anything."""
    dst = tmp_path / "out"
    old = tmp_path / f".out.eagle3-old-{os.getpid()}-0-00000001"
    old.mkdir()
    (old / "mine.txt").write_text("old draft")
    copied = []
    with pytest.raises(ConvertError) as err:
        convert(tiny["speculators_draft"], dst, progress=lambda done, total: copied.append(done))
    assert (
        err.value.what
        == "the destination already exists: a killed `--force` run had moved it aside, and it was put back"
    )
    assert err.value.found == f"restored {dst} from {old.name}, left by a killed run (pid {os.getpid()})"
    assert err.value.fix == "choose a new DST, or pass --force to replace it" and err.value.where == str(dst)
    assert not copied and (dst / "mine.txt").read_text() == "old draft" and not _leftovers(tmp_path)


def _read_text_without_boot_id(self, *a, **kw):
    """``Path.read_text`` on a kernel without a boot id (the original is ``Path._read_text_with_boot_id``)."""
    if self.name == "boot_id":
        raise FileNotFoundError(2, "No such file or directory", str(self))
    return Path._read_text_with_boot_id(self, *a, **kw)


def test_without_a_boot_id_a_killed_runs_directory_is_still_removed(tiny, tmp_path, monkeypatch):
    """A kernel without ``/proc/sys/kernel/random/boot_id`` (some containers): a run that died there leaves a
    temporary directory the next run still recognises as debris and removes."""
    import subprocess
    import sys

    dst = tmp_path / "out"
    import inspect

    script = (
        "import sys\nfrom pathlib import Path\n"
        + inspect.getsource(_read_text_without_boot_id)
        + "Path._read_text_with_boot_id = Path.read_text\nPath.read_text = _read_text_without_boot_id\n"
        "from eagle3_patches import convert as c\nc._temp_name(Path(sys.argv[1]), 'convert').mkdir()\n"
    )
    subprocess.run([sys.executable, "-c", script, str(dst)], check=True)  # a run that made its directory and died
    (debris,) = _leftovers(tmp_path)
    monkeypatch.setattr(Path, "_read_text_with_boot_id", Path.read_text, raising=False)  # this process, same kernel
    monkeypatch.setattr(Path, "read_text", _read_text_without_boot_id)
    res = convert(tiny["speculators_draft"], dst, progress=False, run_doctor=False)
    assert res.cleaned == [f"removed {debris}, left by a killed run (pid {debris.split('-')[2]})"] and not _leftovers(
        tmp_path
    )


def test_a_layer_config_without_num_hidden_layers_is_one_layer(make_draft, tmp_path):
    """speculators writes the layer's own llama config; one without ``num_hidden_layers`` is the one layer."""
    src = make_draft("no-n", speculators=True)
    cfg = json.loads((src / "config.json").read_text())
    del cfg["transformer_layer_config"]["num_hidden_layers"]
    (src / "config.json").write_text(json.dumps(cfg))
    res = convert(src, tmp_path / "out", progress=False)
    assert res.config["num_hidden_layers"] == 1 and res.report.ok


def test_a_parent_someone_wrote_into_is_kept_when_the_run_fails(tiny, tmp_path, monkeypatch):
    """A parent directory the run created and another process wrote into meanwhile: the failed run removes
    what it made and leaves that directory (with the other's file), raising its own error."""
    parent = tmp_path / "a" / "b"
    real = convert_mod._copy_range

    def meanwhile(src_fd, offset, length, dst_fd, progress):
        (parent / "theirs.txt").write_text("not the converter's")
        real(src_fd, offset, max(length - 1, 1), dst_fd, progress)  # and the shard does not read back

    monkeypatch.setattr(convert_mod, "_copy_range", meanwhile)
    with pytest.raises(ConvertError, match="the written shard does not read back"):
        convert(tiny["speculators_draft"], parent / "out", progress=False)
    assert (parent / "theirs.txt").is_file() and sorted(p.name for p in parent.iterdir()) == ["theirs.txt"]


def test_a_live_runs_directory_is_kept_while_its_memory_grows(tiny, tmp_path):
    """The owner token names a process by its start, not by anything that changes while it runs."""
    import subprocess
    import sys

    script = (
        "import pathlib, sys\nfrom eagle3_patches import convert as c\n"
        "c._temp_name(pathlib.Path(sys.argv[1]), 'convert').mkdir()\n"
        "grown = bytearray(64 << 20)\nprint('ready', flush=True)\nsys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "out")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        (alive,) = _leftovers(tmp_path)
        res = convert(tiny["speculators_draft"], tmp_path / "out", progress=False, run_doctor=False)
        assert res.cleaned == [] and (tmp_path / alive).is_dir()
    finally:
        child.kill()
        child.wait()


def test_a_conversion_leaves_no_file_open(make_draft, tmp_path):
    """Side files, shards and directories are all closed again (a service converting many drafts keeps its fds)."""
    src = make_draft("with-tokenizer", speculators=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (src / name).write_text("{}")

    def fds():
        return sorted(os.listdir("/proc/self/fd"))

    convert(src, tmp_path / "warm", progress=False)  # imports and caches first
    before = fds()
    res = convert(src, tmp_path / "out", progress=False)
    assert (res.dst / "tokenizer_config.json").read_text() == "{}"
    assert fds() == before


def test_the_configs_dtype_is_kept_over_the_weights(make_draft, tmp_path):
    """``"dtype": "float16"`` with bfloat16 weights: sglang runs the draft in float16 (it casts at load), so the
    converted config says float16; a ``dtype`` in the layer's own config does not reach the output."""
    src = make_draft(
        "f16", speculators=True, config={"dtype": "float16", "transformer_layer_config": {"dtype": "float32"}}
    )
    res = convert(src, tmp_path / "out", progress=False)
    cfg = json.loads((res.dst / "config.json").read_text())
    assert cfg["torch_dtype"] == "float16" and "dtype" not in cfg


def test_a_draft_vocab_size_unlike_lm_head_is_refused_not_rewritten(make_draft, tmp_path):
    src = make_draft("vocab", speculators=True, config={"draft_vocab_size": tm.DRAFT_VOCAB // 2})
    with pytest.raises(ConvertError) as err:
        convert(src, tmp_path / "out", progress=False)
    assert (
        err.value.what.startswith("the converted draft fails the doctor's checks") and not (tmp_path / "out").exists()
    )


def test_a_source_without_the_final_norm_is_refused_naming_it(make_draft, tmp_path):
    src = make_draft("no-norm", speculators=True, tensors=lambda t: t.pop("norm.weight"))
    with pytest.raises(ConvertError) as err:
        convert(src, tmp_path / "out", progress=False)
    assert err.value.what == "the source lacks tensors every EAGLE-3 draft needs" and err.value.found == "norm.weight"


def test_a_one_byte_side_file_is_copied(make_draft, tmp_path):
    src = make_draft("tiny-side", speculators=True)
    (src / "merges.txt").write_bytes(b"#")
    res = convert(src, tmp_path / "out", progress=False)
    assert (res.dst / "merges.txt").read_bytes() == b"#"


def test_a_shard_is_no_more_readable_than_its_source(make_draft, tmp_path):
    src = make_draft("private", speculators=True)
    os.chmod(src / "model.safetensors", 0o600)
    res = convert(src, tmp_path / "out", progress=False)
    assert os.stat(res.files[0]).st_mode & 0o777 == 0o600


def test_no_dtype_anywhere_leaves_torch_dtype_out_not_null(make_draft, tmp_path, DELETE):
    """No ``dtype`` in the config and an ``fc`` stored in a dtype a config cannot name: the output has no
    ``torch_dtype`` (sglang's auto rule decides) rather than a null one."""
    src = make_draft(
        "f64",
        speculators=True,
        config={"dtype": DELETE},
        tensors=lambda t: t.update({"fc.weight": t["fc.weight"].to(torch.float64)}),
    )
    res = convert(src, tmp_path / "out", progress=False, run_doctor=False)
    assert "torch_dtype" not in json.loads((res.dst / "config.json").read_text())


def test_a_non_root_run_leaves_roots_debris_alone(tiny):
    """Run as an ordinary user (uid 65534), the converter never touches a dead run's directory that root owns,
    and one of its own that it cannot wholly remove does not stop the conversion."""
    import shutil
    import subprocess
    import sys
    import tempfile

    if shutil.which("setpriv") is None or os.getuid() != 0:
        pytest.skip("needs root and setpriv to run the converter as another user")
    root = Path(tempfile.mkdtemp(prefix="eagle3-uid-"))
    try:
        os.chmod(root, 0o1777)  # like /tmp: anyone may create, only owners remove
        src = root / "src"
        shutil.copytree(tiny["speculators_draft"], src)
        os.chmod(src, 0o755)
        for f in src.iterdir():
            os.chmod(f, 0o644)
        debris = root / f".out.eagle3-convert-{os.getpid()}-0-00000001"  # token 0: its owner is gone
        debris.mkdir(mode=0o755)
        (debris / "model.safetensors").write_bytes(b"partial")
        mine = root / f".out.eagle3-convert-{os.getpid()}-0-00000002"  # the user's, holding something it cannot delete
        (mine / "stuck").mkdir(parents=True)
        (mine / "stuck" / "f").write_bytes(b"x")
        os.chown(mine, 65534, 65534)
        code = (
            "import sys\nfrom eagle3_patches.convert import convert\n"
            "print(convert(sys.argv[1], sys.argv[2], progress=False, run_doctor=False).cleaned)\n"
        )
        env = {**os.environ, "PYTHONPATH": str(Path(convert_mod.__file__).parents[2])}
        as_user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c"]
        probe = subprocess.run(
            [*as_user, "import eagle3_patches.convert as c; print(c.__file__)"],
            capture_output=True,
            text=True,
            env=env,
            cwd=root,
        )
        if (
            probe.returncode != 0 or probe.stdout.strip() != convert_mod.__file__
        ):  # not this checkout's code: nothing to test
            pytest.skip(f"uid 65534 cannot run this checkout's converter here: {(probe.stdout + probe.stderr)[-200:]}")
        run = subprocess.run(
            [*as_user, code, str(src), str(root / "out")], capture_output=True, text=True, env=env, cwd=root
        )
        assert run.returncode == 0, run.stdout + run.stderr
        assert run.stdout.strip() == str([f"removed {mine.name}, left by a killed run (pid {os.getpid()})"]), run.stdout
        assert (debris / "model.safetensors").read_bytes() == b"partial"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_expected_accept_length_is_carried_across_and_checked_first():
    figure = {"accept_length": 3.1, "speculative_num_steps": 3, "speculative_eagle_topk": 1}
    cfg = dict(tm.speculators_config(), expected_accept_length=figure)
    assert conversion_plan.build_config(cfg, {})["expected_accept_length"] == figure  # the watchdog reads it there
    assert "expected_accept_length" not in conversion_plan.build_config(tm.speculators_config(), {})
    with pytest.raises(conversion_plan.ConvertError) as info:
        conversion_plan.build_config(dict(cfg, expected_accept_length={"accept_length": "fast"}), {})
    d = info.value.diagnostic
    assert d.where == "config.json: expected_accept_length" and d.found == "accept_length 'fast'"


# ------------------------------------------------------------------ draft norms (EAGLE-3.1): carried where read
def _norms(fields):
    """A tensors edit adding the weights speculators saves for ``fields`` (non-trivial values)."""

    def edit(t):
        g = torch.Generator().manual_seed(7)
        if "norm_before_fc" in fields:
            t["input_norm.weight"] = torch.rand(3 * tm.HIDDEN, generator=g).to(torch.bfloat16)
        if "fc_norm" in fields:
            t.update({f"fc_norm.{i}.weight": torch.rand(tm.HIDDEN, generator=g).to(torch.bfloat16) for i in range(3)})

    return edit


@pytest.mark.parametrize(
    "fields, names, first",
    [
        (("fc_norm", "norm_output"), "fc_norm, norm_output", "0.5.12"),
        (("norm_before_fc",), "norm_before_fc", "0.5.17"),
        (("norm_output", "norm_before_fc"), "norm_before_fc, norm_output", "0.5.17"),
    ],
)
def test_the_converter_carries_the_norms_the_newest_release_reads(make_draft, tmp_path, fields, names, first):
    """No release given: the converter writes what the newest release reads (each field at the top level, as
    0.5.23 reads it), copies the norms' weights bit for bit, and says which releases serve the result."""
    src = make_draft("eagle31", speculators=True, config=dict.fromkeys(fields, True), tensors=_norms(fields))
    res = convert(src, tmp_path / "out", progress=False)
    cfg = json.loads((res.dst / "config.json").read_text())
    assert {f: cfg.get(f) for f in conversion_plan.F.MATH_FIELDS if f in cfg} == dict.fromkeys(fields, True)
    assert not set(fields) & set(cfg["eagle_config"])
    got, want = _all_tensors(res.dst), _all_tensors(src)
    for name in [n for n in want if "norm." in n and not n.startswith(("layers.", "norm"))]:
        assert _bytes(got[name]) == _bytes(want[name]), name
    assert res.serving == (
        f"carries the draft norms {names}: read by sglang >= {first}, and by sglang <0.5.17,>=0.5.8 under "
        "eagle3-patches (eagle3_draft_norms); an older release would serve the draft without them (refused at start "
        "under eagle3-patches)"
    )
    assert res.report is not None and not res.report.errors, res.report.format()


def test_a_draft_without_norms_serves_everywhere(tiny, tmp_path):
    assert convert(tiny["speculators_draft"], tmp_path / "out", progress=False).serving == ""


@pytest.mark.parametrize(
    "field, older, first",
    [("fc_norm", "0.5.11", "0.5.12"), ("norm_output", "0.5.9", "0.5.12"), ("norm_before_fc", "0.5.16", "0.5.17")],
)
def test_a_release_given_by_version_gets_the_norm_where_it_reads_it_and_a_refusal_where_not(field, older, first):
    """speculators_draft_config serving the draft on a release given by version (no patch set): carried from the
    first release that reads it (the table observed from the wheels), refused before it, naming that release."""
    config = {**tm.speculators_config(), field: True}
    for release in (first, "0.5.23"):
        assert conversion_plan.build_config(config, {}, release=release)[field] is True
    with pytest.raises(ConvertError) as err:
        conversion_plan.build_config(config, {}, release=older)
    assert err.value.where == f"config.json: {field}"
    assert err.value.found == f"{field}=true (sglang >= {first} reads it)"
    assert err.value.what.startswith(
        f"this draft was trained with options the LlamaForCausalLMEagle3 of sglang {older} "
    )
    assert err.value.fix.endswith(f"or serve it with vLLM or on sglang >= {first}, which reads it")


def test_the_norm_goes_where_the_release_reads_it():
    """A release (or patch set) that reads norm_before_fc only in eagle_config gets it there."""
    config = {**tm.speculators_config(), "norm_before_fc": True}
    cfg = conversion_plan.build_config(config, {}, release="0.5.9", read={"eagle_config.norm_before_fc"})
    assert cfg["eagle_config"]["norm_before_fc"] is True and "norm_before_fc" not in cfg


def test_norm_before_residual_is_refused_on_every_release():
    config = {**tm.speculators_config(), "norm_before_residual": True}
    for release in (None, "0.5.9", "0.5.23"):
        err = conversion_plan.unsupported(config, release=release)
        assert err is not None and err.found == "norm_before_residual=true (no sglang release up to 0.5.23 reads it)"


def test_served_on_0_5_9_the_norms_are_carried_only_with_the_backport(tiny, make_draft):
    """speculators_draft_config on 0.5.9: what the process reads is the release's own fields plus the active
    backport's; without the backport the draft is refused naming the first release that reads the field."""
    from eagle3_patches.patches.eagle3_draft_norms import BACKPORTED

    fields = ("fc_norm", "norm_output", "norm_before_fc")
    src = make_draft("eagle31", speculators=True, config=dict.fromkeys(fields, True), tensors=_norms(fields))
    cfg = conversion_plan.served_sglang_config(src, "0.5.9", frozenset(BACKPORTED))
    assert [cfg[f] for f in fields] == [True, True, True]
    with pytest.raises(ConvertError) as err:
        conversion_plan.served_sglang_config(src, "0.5.9", frozenset())
    assert err.value.found == (
        "norm_before_fc=true (sglang >= 0.5.17 reads it), fc_norm=true (sglang >= 0.5.12 reads it), "
        "norm_output=true (sglang >= 0.5.12 reads it)"
    )
    assert err.value.fix.endswith("or on sglang >= 0.5.17, which reads them")
