"""The doctor on exactly one of a thing: one pickle file instead of safetensors, one shard missing from an index, a
single aux layer id.  A check written for "some" must fire on one, not only on two or more."""

from __future__ import annotations

import json
import shutil

from eagle3_patches.diagnostic import ERROR, WARNING
from eagle3_patches.doctor import doctor


def codes(report, severity):
    return [f.code for f in report.findings if f.severity == severity]


def test_a_target_with_one_pickle_file_is_named_as_pickle_only(tiny, tmp_path):
    t = tmp_path / "target"
    t.mkdir()
    shutil.copy(tiny["kimi_k25"] / "config.json", t / "config.json")
    (t / "pytorch_model.bin").write_bytes(b"\0" * 8)
    r = doctor(t, tiny["draft"], sglang_version="0.5.13", with_patches=True)
    assert "target-no-safetensors" in codes(r, WARNING), r.format()
    assert "not-a-checkpoint" not in r.codes()


def test_a_draft_with_one_pickle_file_is_named_as_pickle_only(tiny, tmp_path):
    d = tmp_path / "draft"
    d.mkdir()
    shutil.copy(tiny["draft"] / "config.json", d / "config.json")
    (d / "pytorch_model.bin").write_bytes(b"\0" * 8)
    r = doctor(tiny["kimi_k25"], d, sglang_version="0.5.13", with_patches=True)
    (f,) = [f for f in r.findings if f.code == "draft-no-safetensors"]
    assert f.severity == ERROR and f.found == "pytorch_model.bin"


def test_one_shard_missing_from_the_targets_index_is_an_error(tiny, tmp_path):
    t = tmp_path / "target"
    t.mkdir()
    shutil.copy(tiny["kimi_k25"] / "config.json", t / "config.json")
    shutil.copy(tiny["kimi_k25"] / "model.safetensors", t / "model-00001-of-00002.safetensors")
    from safetensors import safe_open

    with safe_open(str(t / "model-00001-of-00002.safetensors"), framework="np") as f:
        names = list(f.keys())
    weight_map = {n: "model-00001-of-00002.safetensors" for n in names}
    weight_map["language_model.lm_head.extra"] = "model-00002-of-00002.safetensors"
    (t / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    r = doctor(t, tiny["draft"], sglang_version="0.5.13", with_patches=True)
    f = next(f for f in r.findings if f.code == "safetensors-index" and "missing" in f.what)
    assert f.what == "1 shard(s) named by the target's index are missing" and f.severity == ERROR


def test_a_single_aux_layer_id_is_a_count_problem_not_an_empty_list(tiny, make_draft):
    d = make_draft(config={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2]}})
    r = doctor(tiny["kimi_k25"], d, sglang_version="0.5.13", with_patches=True)
    assert "aux-ids-invalid" not in r.codes(), r.format()
