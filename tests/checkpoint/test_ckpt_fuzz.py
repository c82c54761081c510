"""Property tests: random mutations of configs and safetensors headers never crash the doctor
(no exception, no ``internal-error`` finding) and never make the converter raise anything but
an :class:`Eagle3Error` or leave a destination behind."""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eagle3_patches.convert import convert
from eagle3_patches.doctor import doctor
from eagle3_patches.errors import Eagle3Error
from eagle3_patches.testing import tiny_models as tm

DELETE = object()

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**40), max_value=2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
    max_leaves=6,
)
interesting_ints = st.sampled_from([0, 1, 2, 3, 5, 6, 7, 64, 255, 256, 1024, -1, 2**31, 2**62])
values = st.one_of(st.just(DELETE), json_values, interesting_ints, st.lists(interesting_ints, max_size=5))

DRAFT_PATHS = [
    ("architectures",),
    ("model_type",),
    ("hidden_size",),
    ("vocab_size",),
    ("draft_vocab_size",),
    ("target_hidden_size",),
    ("num_hidden_layers",),
    ("num_attention_heads",),
    ("num_key_value_heads",),
    ("head_dim",),
    ("intermediate_size",),
    ("torch_dtype",),
    ("dtype",),
    ("tie_word_embeddings",),
    ("bias",),
    ("eagle_config",),
    ("eagle_config", "eagle_aux_hidden_state_layer_ids"),
    ("eagle_config", "use_aux_hidden_state"),
    ("eagle_config", "eagle3_patches_layer_id_convention"),
    ("eagle_aux_hidden_state_layer_ids",),
    ("speculators_model_type",),
    ("transformer_layer_config",),
]
TARGET_PATHS = [
    ("architectures",),
    ("model_type",),
    ("num_hidden_layers",),
    ("hidden_size",),
    ("vocab_size",),
    ("torch_dtype",),
    ("first_k_dense_replace",),
    ("text_config",),
    ("text_config", "num_hidden_layers"),
    ("text_config", "hidden_size"),
    ("quantization_config",),
]
SPECULATORS_PATHS = [
    ("eagle_aux_hidden_state_layer_ids",),
    ("draft_vocab_size",),
    ("target_hidden_size",),
    ("dtype",),
    ("norm_before_fc",),
    ("norm_output",),
    ("tie_word_embeddings",),
    ("transformer_layer_config",),
    ("transformer_layer_config", "hidden_size"),
    ("transformer_layer_config", "num_hidden_layers"),
    ("transformer_layer_config", "model_type"),
    ("transformer_layer_config", "rope_parameters"),
    ("transformer_layer_config", "vocab_size"),
    ("speculators_config",),
]


def mutate(cfg, path, value):
    cfg = copy.deepcopy(cfg)
    node = cfg
    for key in path[:-1]:
        if not isinstance(node, dict):
            return cfg
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    if not isinstance(node, dict):
        return cfg
    if value is DELETE:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value
    return cfg


def mutations(paths):
    return st.lists(st.tuples(st.sampled_from(paths), values), min_size=1, max_size=4)


def apply_all(cfg, muts):
    for path, value in muts:
        cfg = mutate(cfg, path, value)
    return cfg


def check(report):
    assert report.exit_code in (0, 1)
    assert "internal-error" not in report.codes(), report.format()
    report.format()
    json.loads(report.to_json())


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny):
    root = tmp_path_factory.mktemp("fuzz")
    return root


_settings = settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)


@_settings
@given(
    draft_muts=mutations(DRAFT_PATHS),
    target_muts=mutations(TARGET_PATHS),
    version=st.sampled_from(["0.5.8", "0.5.9", "0.5.12", "0.5.13", "0.5.23", "0.6.0"]),
    tp=st.sampled_from([1, 2, 8]),
)
def test_config_mutations_never_crash(tiny, link_file, draft_muts, target_muts, version, tp):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        d, t = tmp / "draft", tmp / "target"
        d.mkdir()
        t.mkdir()
        kind = "kimi_k25" if len(target_muts) % 2 else "deepseek_v3"
        link_file(tiny["draft"] / "model.safetensors", d / "model.safetensors")
        link_file(tiny[kind] / "model.safetensors", t / "model.safetensors")
        dcfg = apply_all(json.loads((tiny["draft"] / "config.json").read_text()), draft_muts)
        tcfg = apply_all(json.loads((tiny[kind] / "config.json").read_text()), target_muts)
        (d / "config.json").write_text(json.dumps(dcfg))
        (t / "config.json").write_text(json.dumps(tcfg))
        check(doctor(t, d, sglang_version=version, tp=tp))


def _header_mutation():
    return st.one_of(
        st.tuples(st.just("truncate"), st.floats(min_value=0, max_value=1)),
        st.tuples(st.just("flip"), st.floats(min_value=0, max_value=1), st.integers(0, 255)),
        st.tuples(
            st.just("entry"),
            st.sampled_from(
                [
                    "fc.weight",
                    "d2t",
                    "t2d",
                    "lm_head.weight",
                    "norm.weight",
                    "midlayer.self_attn.q_proj.weight",
                    "__metadata__",
                ]
            ),
            st.sampled_from(["dtype", "shape", "data_offsets", None]),
            st.one_of(
                json_values,
                st.sampled_from(["BF16", "F32", "I64", "I32", "BOOL", "F4", "F8_E4M3", "C64", "U64", "XX"]),
                st.lists(st.integers(0, 2000), max_size=3),
                st.lists(st.integers(-5, 10**12), min_size=2, max_size=2),
            ),
        ),
        st.tuples(
            st.just("rename"),
            st.sampled_from(["fc.weight", "d2t", "t2d", "midlayer.mlp.up_proj.weight"]),
            st.text(max_size=12),
        ),
        st.tuples(st.just("length"), st.integers(0, 2**64 - 1)),
    )


def corrupt(raw: bytes, mut) -> bytes:
    n = int.from_bytes(raw[:8], "little")
    kind = mut[0]
    if kind == "truncate":
        return raw[: int(mut[1] * len(raw))]
    if kind == "flip":
        pos = min(int(mut[1] * (8 + n)), 8 + n - 1)
        return raw[:pos] + bytes([mut[2]]) + raw[pos + 1 :]
    if kind == "length":
        return mut[1].to_bytes(8, "little") + raw[8:]
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    if kind == "entry":
        _, name, fld, value = mut
        if fld is None or not isinstance(header.get(name), dict):
            header[name] = value
        else:
            header[name][fld] = value
    elif kind == "rename":
        _, name, new = mut
        if name in header:
            header[new] = header.pop(name)
    body = json.dumps(header).encode()
    return len(body).to_bytes(8, "little") + body + data


@_settings
@given(muts=st.lists(_header_mutation(), min_size=1, max_size=3), shards=st.sampled_from([1, 2]))
def test_header_mutations_never_crash(tiny, muts, shards):
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "draft"
        d.mkdir()
        shutil.copy(tiny["draft"] / "config.json", d / "config.json")
        tensors = tm.eagle3_draft_tensors(tm.TinyDraftSpec())
        names = sorted(tensors)
        files = []
        for i in range(shards):
            f = d / (f"model-{i + 1:05d}-of-{shards:05d}.safetensors" if shards > 1 else "model.safetensors")
            save_file({k: tensors[k] for k in names[i::shards]}, str(f), metadata={"format": "pt"})
            files.append(f)
        if shards > 1:
            wm = {k: files[i % shards].name for i, k in enumerate(names)}
            (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
        for j, mut in enumerate(muts):
            f = files[j % len(files)]
            try:
                f.write_bytes(corrupt(f.read_bytes(), mut))
            except (ValueError, UnicodeDecodeError):
                pass  # an earlier mutation already broke the header: keep it broken
        check(doctor(tiny["deepseek_v3"], d, sglang_version="0.5.9"))


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(muts=mutations(SPECULATORS_PATHS))
def test_convert_mutated_speculators_config(tiny, link_file, muts):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        src = tmp / "src"
        src.mkdir()
        link_file(tiny["speculators_draft"] / "model.safetensors", src / "model.safetensors")
        cfg = apply_all(json.loads((tiny["speculators_draft"] / "config.json").read_text()), muts)
        (src / "config.json").write_text(json.dumps(cfg))
        dst = tmp / "out"
        try:
            res = convert(src, dst, sglang_version="0.5.9", progress=False)
        except Eagle3Error:
            assert not dst.exists()
        else:
            assert res.report is not None and res.report.ok
            assert (dst / "model.safetensors").is_file()
        assert [p.name for p in tmp.iterdir() if p.name.startswith(".")] == []
