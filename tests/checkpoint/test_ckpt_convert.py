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

from eagle3_patches.checkpoint import convert as convert_mod
from eagle3_patches.checkpoint.convert import ConvertError, convert
from eagle3_patches.checkpoint.doctor import doctor
from eagle3_patches.checkpoint.layer_ids import CONVENTION_KEY
from eagle3_patches.checkpoint.safetensors_header import read_header
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
    for key in ("architectures", "model_type", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                "head_dim", "num_hidden_layers", "vocab_size", "draft_vocab_size", "target_hidden_size", "rope_theta",
                "rope_scaling", "rms_norm_eps", "tie_word_embeddings", "torch_dtype", "hidden_act"):
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


@pytest.mark.parametrize("release, ids, convention", [
    (None, [1, 2, 3], "output-of-layer"),  # the converter: this library's convention
    ("0.5.9", [1, 2, 3], "output-of-layer"),  # speculators_draft_config: the release's own reading
    ("0.5.12", [1, 2, 3], "output-of-layer"),
    ("0.5.13", [2, 3, 4], "input-of-layer"),
    ("0.5.23", [2, 3, 4], "input-of-layer"),
])
def test_build_config_writes_ids_in_the_releases_convention(release, ids, convention):
    cfg = convert_mod.build_config(tm.speculators_config(), {}, release=release)
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == ids
    assert cfg["eagle_config"][CONVENTION_KEY] == convention


def test_served_sglang_config_reads_only_local_speculators_drafts(tiny, make_draft, tmp_path):
    """What speculators_draft_config hands sglang: None (transformers reads it as always) unless a local
    speculators draft; the converter's refusal for one it cannot serve."""
    served = convert_mod.served_sglang_config
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
    """Two shards are listed in model.safetensors.index.json (as transformers writes them): sglang finds every tensor."""
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


def test_keeps_embed_tokens_unless_asked(make_draft, tmp_path):
    def with_embed(t):
        t["embed_tokens.weight"] = torch.randn(tm.VOCAB, tm.HIDDEN, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)

    src = make_draft("with-embed", speculators=True, tensors=with_embed)
    kept = convert(src, tmp_path / "kept", progress=False)
    assert "embed_tokens.weight" in _all_tensors(kept.dst)
    dropped = convert(src, tmp_path / "dropped", drop_embed_tokens=True, progress=False)
    assert "embed_tokens.weight" not in _all_tensors(dropped.dst) and dropped.dropped == ["embed_tokens.weight"]


def test_rope_parameters_become_rope_scaling(make_draft, tmp_path):
    def yarn(cfg):
        cfg["transformer_layer_config"]["rope_parameters"] = {"rope_theta": 50000.0, "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}

    res = convert(make_draft("yarn", speculators=True, config=yarn), tmp_path / "out", progress=False)
    assert res.config["rope_theta"] == 50000.0
    assert res.config["rope_scaling"] == {"rope_type": "yarn", "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}


def test_null_target_hidden_size_comes_from_fc(make_draft, tmp_path):
    res = convert(make_draft("null-th", speculators=True, config={"target_hidden_size": None}), tmp_path / "out", progress=False)
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
    with pytest.raises(raised):  # an OSError becomes a what / where / fix message
        convert(tiny["speculators_draft"], tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists() and not _leftovers(tmp_path)


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
        ({"norm_before_fc": True}, None, "norm_before_fc=true"),
        ({"norm_output": True}, None, "norm_output=true"),
        ({"norm_before_residual": True}, None, "norm_before_residual=true"),
        (lambda c: {k: v for k, v in c.items() if k != "norm_before_residual"}, None, "vLLM reads it as true"),
        (None, lambda t: t.update({"input_norm.weight": torch.ones(3 * tm.HIDDEN, dtype=torch.bfloat16)}), "input_norm.weight"),
        ({"transformer_layer_config": {"model_type": "qwen3"}}, None, "not a llama layer"),
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


@pytest.mark.parametrize("text, power", [("123", 0), ("123B", 0), ("123KiB", 1), ("123MiB", 2), ("123GiB", 3), ("123TiB", 4)])
def test_binary_and_plain_sizes(text, power):
    assert convert_mod.parse_size(text) == 123 * 1024**power


def test_the_default_shard_size_is_the_hubs():
    from huggingface_hub.serialization._base import MAX_SHARD_SIZE, parse_size_to_int

    assert convert_mod.DEFAULT_MAX_SHARD_SIZE == parse_size_to_int(MAX_SHARD_SIZE)


def test_shards_are_filled_up_to_the_limit_and_never_past_it(tiny, tmp_path):
    """For limits one byte under what two tensors take together: no shard of several tensors exceeds
    the limit, and no shard could have taken the next shard's first tensor (shards are filled in order)."""
    from eagle3_patches.checkpoint.convert import plan_conversion

    nbytes = {i.out: i.src.nbytes for i in plan_conversion(tiny["speculators_draft"]).items}
    seen = []
    for k, f in enumerate(sorted({a + b + d for a, b in zip(nbytes.values(), list(nbytes.values())[1:]) for d in (-1,)})):
        res = convert(tiny["speculators_draft"], tmp_path / f"out{k}", max_shard_size=f, progress=False, run_doctor=False)
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
    bad = make_draft("bad", speculators=True, tensors=lambda t: t.update({"fc.weight": t["fc.weight"][:, :8].contiguous()}))
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
    plain = tmp_path / f".out.eagle3-convert-{os.getpid()}-0-0000000b"
    plain.write_text("a file, not a run's directory")
    vanished = f".out.eagle3-convert-{os.getpid()}-0-0000000c"
    real_lstat = convert_mod.os.lstat

    def lstat(path, *a, **kw):
        if Path(path).name == vanished:
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real_lstat(path, *a, **kw)

    real_listdir = convert_mod.os.listdir
    monkeypatch.setattr(convert_mod.os, "listdir", lambda p: [vanished, *real_listdir(p)] if Path(p) == tmp_path else real_listdir(p))
    monkeypatch.setattr(convert_mod.os, "lstat", lstat)
    res = convert(tiny["speculators_draft"], dst, progress=False)
    monkeypatch.undo()
    assert sorted(res.cleaned) == sorted(f"removed {d.name}, left by a killed run (pid {os.getpid()})" for d in dead)
    assert not any(d.exists() for d in dead) and other.is_dir() and plain.is_file()
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
    src = make_draft("extra", speculators=True, tensors=lambda t: t.update({n: torch.ones(2, dtype=torch.bfloat16) for n in extra}))
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
    src = make_draft("automap", speculators=True, config={"transformer_layer_config": {"auto_map": {"AutoConfig": "x.Y"}}})
    res = convert(src, tmp_path / "out", progress=False)
    assert "auto_map" not in json.loads((res.dst / "config.json").read_text()) and "auto_map" not in res.config
