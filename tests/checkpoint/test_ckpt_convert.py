"""The speculators -> SGLang converter, byte level: names, bytes, config, sharding, atomicity, refusals."""

from __future__ import annotations

import hashlib
import json
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
    # the doctor's draft checks ran on the result and pass; the full doctor agrees with the target
    assert res.report is not None and res.report.ok
    assert doctor(tiny["deepseek_v3"], res.dst, sglang_version="0.5.11").ok
    assert not _leftovers(tmp_path)


def test_output_headers_are_aligned_and_verified(tiny, tmp_path):
    res = convert(tiny["speculators_draft"], tmp_path / "out", progress=False)
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
