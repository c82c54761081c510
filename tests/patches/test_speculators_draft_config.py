"""speculators_draft_config: a draft written by the real speculators library is served as it is.

The draft is the trained tiny draft as speculators 0.9.0 wrote it (``tools/make_speculators_fixture.py``),
copied next to a tripwire ``config.py`` (the file its ``auto_map`` names).  "Converted" is the same draft
after ``eagle3-patches convert``.  Everything sglang does runs in its own spawned process, with sglang's
own ``ModelConfig`` / ``ModelRunner`` / ``ServerArgs``.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle3_patches.checkpoint import layer_ids as L
from eagle3_patches.checkpoint.convert import ConvertError, convert
from eagle3_patches.testing import tiny_models as tm
from eagle3_patches.testing.isolation import run_isolated
from eagle3_patches.testing.releases import only_release, sglang_version
from eagle3_patches.testing.sglang_harness import load_drafts

pytestmark = pytest.mark.sglang
NAME = "speculators_draft_config"
PATCHES = [NAME, "eagle3_draft_strict_loading"]  # before 0.5.12 layers.0.* needs the strict loader's mapping


@pytest.fixture(scope="module")
def drafts(tiny_root):
    root = tiny_root / "speculators-direct"
    direct = tm.build_speculators_fixture(root)
    converted = root / f"{direct.name}-converted"
    if not (converted / "config.json").exists():
        convert(direct, converted, progress=False)

    def variant(name, *, config=None, tensors=None):
        path = root / f"{direct.name}-{name}"
        if not path.exists():
            tmp = root / f".{path.name}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(direct, tmp)
            if config:
                cfg = json.loads((tmp / "config.json").read_text())
                for key, value in config.items():
                    if isinstance(value, dict):
                        cfg[key].update(value)
                    else:
                        cfg[key] = value
                (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
            if tensors:
                t = load_file(str(tmp / "model.safetensors"))
                tensors(t)
                save_file(t, str(tmp / "model.safetensors"), metadata={"format": "pt"})
            tmp.rename(path)
        return path

    return {
        "direct": direct,
        "converted": converted,
        "sglang": tm.build_trained_eagle3_draft(tiny_root),
        "norm_before_fc": variant("norm-before-fc", config={"norm_before_fc": True}),
        "norm_output": variant("norm-output", config={"norm_output": True}),
        "qwen3": variant("qwen3", config={"transformer_layer_config": {"model_type": "qwen3"}}),
        "input_norm": variant("input-norm", tensors=lambda t: t.update({"input_norm.weight": torch.ones(3 * tm.HIDDEN, dtype=torch.bfloat16)})),
    }


# --------------------------------------------------------------------------- what runs in sglang's processes
def _draft_configs(target: str, paths: list[str]) -> dict:
    """sglang's own ModelConfig for each draft (trust_remote_code on, as the harness's server args set it)."""
    from sglang.srt.configs.model_config import ModelConfig

    from eagle3_patches.testing import sglang_harness as h

    sa = h.server_args(target)
    assert sa.trust_remote_code
    out = {}
    for path in paths:
        try:
            out[path] = ("ok", ModelConfig.from_server_args(sa, model_path=path, is_draft_model=True).hf_config.to_dict())
        except Exception as exc:  # noqa: BLE001 - returned to the test
            out[path] = (type(exc).__name__, str(exc))
    return out


def _target_runner_outcome(target: str, draft: str) -> dict:
    """The target's ModelRunner with EAGLE3 and this draft: what it captures, or where it stopped."""
    import traceback

    from eagle3_patches.testing import sglang_harness as h

    try:
        runner = h.model_runner(h.eagle3_server_args(target, draft))
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "type": type(exc).__name__, "message": str(exc),
                "frames": [f.name for f in traceback.extract_tb(exc.__traceback__)]}
    model = getattr(runner.model, "language_model", runner.model)
    return {"ok": True, "layers_to_capture": list(model.model.layers_to_capture)}


def _launcher_outcome(target: str, draft: str):
    from eagle3_patches.testing import sglang_harness as h

    try:
        h.launcher_server_args(h.eagle3_server_args, target, draft)
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__, str(exc)
    return "ok", ""


def _reader_auto_config_identity():
    """The reader module's AutoConfig: patched, then after revert (identity with transformers' class)."""
    import importlib

    from transformers import AutoConfig

    import eagle3_patches
    from eagle3_patches.patches.speculators_draft_config import reader_module

    reader = reader_module(importlib.import_module("sglang.srt.utils.hf_transformers_utils"))
    patched = vars(reader)["AutoConfig"]
    state = eagle3_patches.status()[NAME].state.value
    eagle3_patches.revert([NAME])
    return {"state": state, "patched_is_subclass": issubclass(patched, AutoConfig) and patched is not AutoConfig,
            "restored": vars(reader)["AutoConfig"] is AutoConfig}


# --------------------------------------------------------------------------- stock
@pytest.mark.stock
def test_stock_cannot_serve_a_speculators_draft(tiny, drafts):
    """The bug: stock sglang has no reading of the speculators config.  Depending on the directory's name,
    transformers raises "Unrecognized model" (this test's path), or guesses a model type named in the path
    (a draft directory named after Llama reads as a LlamaConfig of architecture Eagle3DraftModel); either
    way no LlamaForCausalLMEagle3 draft comes out."""
    out = run_isolated(_draft_configs, str(tiny["kimi_k25"]), [str(drafts["direct"])], patches=None)
    kind, value = out[str(drafts["direct"])]
    assert kind != "ok" or value.get("architectures") != ["LlamaForCausalLMEagle3"], value
    if kind != "ok":
        assert "Unrecognized model" in value


# --------------------------------------------------------------------------- patched: the config
@pytest.fixture(scope="module")
def configs(tiny, drafts):
    paths = [str(drafts[n]) for n in ("direct", "converted", "sglang", "norm_before_fc", "norm_output", "qwen3", "input_norm")]
    return {
        "stock": run_isolated(_draft_configs, str(tiny["kimi_k25"]), paths[1:3], patches=None),
        "patched": run_isolated(_draft_configs, str(tiny["kimi_k25"]), paths, patches=PATCHES),
    }


def test_patched_reads_the_speculators_config_as_the_converted_one(configs, drafts):
    direct = configs["patched"][str(drafts["direct"])]
    converted = configs["patched"][str(drafts["converted"])]
    assert direct[0] == "ok", direct
    assert converted[0] == "ok", converted
    d, c = dict(direct[1]), dict(converted[1])
    assert d.pop("_name_or_path") == str(drafts["direct"]) and c.pop("_name_or_path") == str(drafts["converted"])
    de, ce = d.pop("eagle_config"), c.pop("eagle_config")
    assert d == c  # every other field: what sglang reads from the converted draft, in memory
    assert d["architectures"] == ["LlamaForCausalLMEagle3"] and d["target_hidden_size"] == tm.HIDDEN
    # the ids: the converter's output-of-layer ids, in the running release's own convention
    convention = L.release_convention(sglang_version())
    assert ce["eagle_aux_hidden_state_layer_ids"] == list(tm.DRAFT_AUX_IDS)
    assert ce[L.CONVENTION_KEY] == L.OUTPUT_OF_LAYER
    assert de[L.CONVENTION_KEY] == convention
    assert de["eagle_aux_hidden_state_layer_ids"] == L.from_output_of_layer(tm.DRAFT_AUX_IDS, convention)


def test_patched_never_executes_the_drafts_code(configs, drafts):
    """trust_remote_code is on and auto_map names config.py: nothing of it runs."""
    assert configs["patched"][str(drafts["direct"])][0] == "ok"
    assert (drafts["direct"] / "config.py").is_file()
    assert not (drafts["direct"] / tm.TRIPWIRE_MARK).exists()


def test_patched_is_silent_on_sglang_format_drafts(configs, drafts):
    for name in ("converted", "sglang"):
        path = str(drafts[name])
        assert configs["patched"][path] == configs["stock"][path], name
        assert configs["stock"][path][0] == "ok"


@pytest.mark.parametrize("variant, needle", [
    ("norm_before_fc", "norm_before_fc=true"),
    ("norm_output", "norm_output=true"),
    ("qwen3", "not a llama layer"),
    ("input_norm", "input_norm.weight"),
])
def test_patched_refuses_what_sglang_cannot_run_with_the_converters_message(configs, drafts, tmp_path, variant, needle):
    kind, message = configs["patched"][str(drafts[variant])]
    assert kind == "ConvertError", message
    with pytest.raises(ConvertError) as info:
        convert(drafts[variant], tmp_path / "out", progress=False)
    assert message == str(info.value)  # one message, the converter's
    assert needle in message and str(drafts[variant]) in message


def test_patched_refuses_before_any_rank_loads_weights(tiny, drafts):
    """The target's ModelRunner reads the draft's config in __init__, before it loads any weight (from 0.5.12
    the server arguments' resolution reads it even earlier)."""
    out = run_isolated(_target_runner_outcome, str(tiny["deepseek_v3"]), str(drafts["norm_before_fc"]), patches=PATCHES)
    assert not out["ok"] and out["type"] == "ConvertError", out
    assert "norm_before_fc=true" in out["message"]
    assert "load_model" not in out["frames"], out["frames"]
    assert {"__init__", "__post_init__", "resolve_once"} & set(out["frames"]), out["frames"]


@only_release(">=0.5.12", "from 0.5.12 the launcher reads the draft's config (ServerArgs)")
def test_patched_refuses_in_the_launcher_from_0_5_12(tiny, drafts):
    assert run_isolated(_launcher_outcome, str(tiny["kimi_k25"]), str(drafts["direct"]), patches=PATCHES) == ("ok", "")
    kind, message = run_isolated(_launcher_outcome, str(tiny["kimi_k25"]), str(drafts["norm_output"]), patches=PATCHES)
    assert kind == "ConvertError" and "norm_output=true" in message


@pytest.mark.runtime_only  # a fork build carries the strict loader in its source
@only_release("<0.5.12", "0.5.12 loads layers.0.* natively")
def test_refused_where_layers0_would_be_dropped(tiny, drafts):
    """Before 0.5.12 only the strict loader maps layers.0.*: without it the draft is refused, not served half random."""
    out = run_isolated(_draft_configs, str(tiny["kimi_k25"]), [str(drafts["direct"])], patches=[NAME])
    kind, message = out[str(drafts["direct"])]
    assert kind == "Eagle3ConfigError" and "eagle3_draft_strict_loading" in message and "eagle3-patches convert" in message


@pytest.mark.runtime_only
def test_revert_restores_sglangs_auto_config(tiny):
    out = run_isolated(_reader_auto_config_identity, patches=[NAME])
    assert out == {"state": "applied", "patched_is_subclass": True, "restored": True}


# --------------------------------------------------------------------------- patched: the weights and the capture
def test_direct_and_converted_load_the_same_parameters_bit_for_bit(tiny, drafts):
    direct, converted = run_isolated(load_drafts, str(tiny["deepseek_v3"]), [str(drafts["direct"]), str(drafts["converted"])],
                                     patches=PATCHES)
    assert direct["ok"] and converted["ok"], (direct, converted)
    assert direct["params"].keys() == converted["params"].keys()
    assert [n for n in direct["params"] if not torch.equal(direct["params"][n], converted["params"][n])] == []
    assert torch.equal(direct["hot_token_id"], converted["hot_token_id"])
    # and they are the file's tensors (layers.0.* in midlayer, not random init)
    file = load_file(str(drafts["direct"] / "model.safetensors"))
    midlayer = "model.midlayer." if "model.midlayer.hidden_norm.weight" in direct["params"] else "model.layers.0."
    assert torch.equal(direct["params"][midlayer + "hidden_norm.weight"], file["layers.0.hidden_norm.weight"].float())
    assert torch.equal(direct["params"]["model.fc.weight"], file["fc.weight"].float())
    assert torch.equal(direct["hot_token_id"], file["d2t"] + torch.arange(file["d2t"].numel()))


def test_the_target_captures_the_layers_the_draft_was_trained_on(tiny, drafts):
    """Direct and converted: the target captures the outputs of layers 1, 2, 3 (speculators' ids 2, 3, 4)."""
    direct = run_isolated(_target_runner_outcome, str(tiny["kimi_k25"]), str(drafts["direct"]), patches="all")
    converted = run_isolated(_target_runner_outcome, str(tiny["kimi_k25"]), str(drafts["converted"]), patches="all")
    assert direct["ok"] and converted["ok"], (direct, converted)
    assert direct["layers_to_capture"] == converted["layers_to_capture"] == [i + 1 for i in tm.DRAFT_AUX_IDS]
