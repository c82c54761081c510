"""speculators_draft_config: a draft written by the real speculators library is served as it is.

The draft is the trained tiny draft as speculators 0.9.0 wrote it (``tools/make_speculators_fixture.py``),
copied next to a tripwire ``config.py`` (the file its ``auto_map`` names).  "Converted" is the same draft
after ``eagle3-patches convert``.  Everything sglang does runs in its own spawned process, with sglang's
own ``ModelConfig`` / ``ModelRunner`` / ``ServerArgs``.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from support.releases import only_release, sglang_version

from eagle3_patches.checkpoint import draft_fields as F
from eagle3_patches.checkpoint import layer_ids as L
from eagle3_patches.checkpoint.conversion_plan import served_sglang_config
from eagle3_patches.convert import ConvertError, convert
from eagle3_patches.registry import NotApplicable
from eagle3_patches.testing import tiny_models as tm
from eagle3_patches.testing.isolation import run_isolated
from eagle3_patches.testing.sglang_harness import load_drafts

pytestmark = pytest.mark.sglang
NAME = "speculators_draft_config"
PATCHES = [NAME, "eagle3_draft_strict_loading"]  # before 0.5.12 layers.0.* needs the strict loader's mapping
NORMS = "eagle3_draft_norms"


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
        "norm_before_fc": variant(
            "norm-before-fc-weighted",
            config={"norm_before_fc": True},
            tensors=lambda t: t.update({"input_norm.weight": torch.rand(3 * tm.HIDDEN).to(torch.bfloat16) + 0.5}),
        ),
        "norm_output": variant("norm-output", config={"norm_output": True}),
        "norm_before_residual": variant("norm-before-residual", config={"norm_before_residual": True}),
        "qwen3": variant("qwen3", config={"transformer_layer_config": {"model_type": "qwen3"}}),
        "input_norm": variant(
            "input-norm",
            tensors=lambda t: t.update({"input_norm.weight": torch.ones(3 * tm.HIDDEN, dtype=torch.bfloat16)}),
        ),
    }


# --------------------------------------------------------------------------- what runs in sglang's processes
def _draft_configs(target: str, paths: list[str]) -> dict:
    """sglang's own ModelConfig for each draft (trust_remote_code on, as the harness's server args set it), and
    what eagle3-patches logged meanwhile (``"log"``)."""
    from sglang.srt.configs.model_config import ModelConfig

    from eagle3_patches.testing import sglang_harness as h

    log = h.eagle3_log()
    out = {}
    sa = h.server_args(target)
    assert sa.trust_remote_code
    for path in paths:
        try:
            out[path] = (
                "ok",
                ModelConfig.from_server_args(sa, model_path=path, is_draft_model=True).hf_config.to_dict(),
            )
        except Exception as exc:  # noqa: BLE001 - returned to the test
            out[path] = (type(exc).__name__, str(exc))
    out["log"] = [r.getMessage() for r in log]
    return out


def _target_runner_outcome(target: str, draft: str) -> dict:
    """The target's ModelRunner with EAGLE3 and this draft: what it captures, or where it stopped."""
    import traceback

    from eagle3_patches.testing import sglang_harness as h

    try:
        runner = h.model_runner(h.eagle3_server_args(target, draft))
    except Exception as exc:  # noqa: BLE001
        return {
            "ok": False,
            "type": type(exc).__name__,
            "message": str(exc),
            "frames": [f.name for f in traceback.extract_tb(exc.__traceback__)],
        }
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
    return {
        "state": state,
        "patched_is_subclass": issubclass(patched, AutoConfig) and patched is not AutoConfig,
        "restored": vars(reader)["AutoConfig"] is AutoConfig,
    }


def _reader_outcomes(directory: str) -> dict:
    """For each ``from_pretrained`` argument that makes transformers read another file than the directory's
    ``config.json`` (or return more than a config), what the reader's patched ``AutoConfig`` gives and what
    transformers' own gives; and the patched class's docstring (``help(AutoConfig)`` in the serving process)."""
    import importlib

    from transformers import AutoConfig

    from eagle3_patches.patches.speculators_draft_config import reader_module

    patched = vars(reader_module(importlib.import_module("sglang.srt.utils.hf_transformers_utils")))["AutoConfig"]
    assert patched is not AutoConfig

    def outcome(cls, kwargs):
        try:
            got = cls.from_pretrained(directory, **kwargs)
        except Exception as exc:  # noqa: BLE001 - compared between the two classes
            return ["raised", type(exc).__name__]
        config = got[0] if isinstance(got, tuple) else got
        return [type(got).__name__, type(config).__name__, config.architectures]

    cases = {
        "subfolder": {"subfolder": "sub"},
        "_configuration_file": {"_configuration_file": "other.json"},
        "gguf_file": {"gguf_file": "draft.gguf"},
        "return_unused_kwargs": {"return_unused_kwargs": True},
    }
    return {
        "cases": {
            name: {"patched": outcome(patched, kw), "transformers": outcome(AutoConfig, kw)}
            for name, kw in cases.items()
        },
        "doc": patched.__doc__,
        "transformers_doc": AutoConfig.__doc__,
    }


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
    paths = [
        str(drafts[n])
        for n in (
            "direct",
            "converted",
            "sglang",
            "norm_before_fc",
            "norm_output",
            "qwen3",
            "input_norm",
            "norm_before_residual",
        )
    ]
    norms = [str(drafts["norm_before_fc"]), str(drafts["norm_output"])]
    return {
        "stock": run_isolated(_draft_configs, str(tiny["kimi_k25"]), paths[1:3], patches=None),
        # the direct draft read again under another spelling of its path (sglang caches a config per argument)
        "patched": run_isolated(_draft_configs, str(tiny["kimi_k25"]), [*paths, paths[0] + "/"], patches=PATCHES),
        # with the backport of the draft norms (on the releases before the first that reads them)
        "backported": run_isolated(_draft_configs, str(tiny["kimi_k25"]), norms, patches=[*PATCHES, NORMS]),
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


def test_patched_says_once_how_it_reads_the_speculators_draft(configs, drafts):
    """The server log says, once per draft, that the draft is read as it is and which layers the ids become
    (the ids are where a speculators draft goes silently wrong); nothing for the SGLang-format drafts."""
    direct = configs["patched"][str(drafts["direct"])][1]
    said = [m for m in configs["patched"]["log"] if f"{drafts['direct']} is a speculators-format" in m]
    assert len(said) == 1, configs["patched"]["log"]
    ids = direct["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert str(drafts["direct"]) in said[0] and f"-> {ids}" in said[0], said
    assert not any(str(drafts[n]) in m for n in ("converted", "sglang") for m in configs["patched"]["log"])


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


@pytest.mark.parametrize("field", ["norm_before_fc", "norm_output"])
def test_patched_carries_a_norm_where_the_release_reads_it_and_refuses_it_naming_the_first_release_where_not(
    configs, drafts, field
):
    """The field is handed to sglang under the name the running release reads, from the first release that reads
    it (its own llama_eagle3.py); before it, refused naming that release; with the backport, carried on every
    release."""
    first = F.FIRST_READ[field]
    kind, value = configs["patched"][str(drafts[field])]
    # what the installed llama_eagle3.py reads (a fork build's source carries the backport)
    if F.read_name(field, F.fields_read(F.installed_source()[1])) is not None:
        assert kind == "ok" and value[field] is True, value
    else:
        assert kind == "ConvertError", value
        assert f"the LlamaForCausalLMEagle3 of sglang {sglang_version()} does not read" in value
        assert f"{field}=true (sglang >= {'.'.join(map(str, first))} reads it)" in value
    kind, value = configs["backported"][str(drafts[field])]
    assert kind == "ok" and value[field] is True, value


@pytest.mark.parametrize(
    "variant, needle",
    [
        ("norm_before_residual", "norm_before_residual=true (no sglang release up to 0.5.23 reads it)"),
        ("qwen3", "not a llama layer"),
        ("input_norm", "norm_before_fc (input_norm.weight present, the field not set)"),
    ],
)
def test_patched_refuses_what_sglang_cannot_run_with_the_converters_message(configs, drafts, variant, needle):
    """One message, the converter's (built for the running release and what it reads)."""
    kind, message = configs["patched"][str(drafts[variant])]
    assert kind == "ConvertError", message
    with pytest.raises(ConvertError) as info:
        served_sglang_config(drafts[variant], str(sglang_version()), F.fields_read(F.installed_source()[1]))
    assert message == str(info.value)
    assert needle in message and str(drafts[variant]) in message


def test_patched_refuses_before_any_rank_loads_weights(tiny, drafts):
    """The target's ModelRunner reads the draft's config in __init__, before it loads any weight (from 0.5.12
    the server arguments' resolution reads it even earlier)."""
    out = run_isolated(
        _target_runner_outcome, str(tiny["deepseek_v3"]), str(drafts["norm_before_residual"]), patches=PATCHES
    )
    assert not out["ok"] and out["type"] == "ConvertError", out
    assert "norm_before_residual=true" in out["message"]
    assert "load_model" not in out["frames"], out["frames"]
    assert {"__init__", "__post_init__", "resolve_once"} & set(out["frames"]), out["frames"]


@only_release(">=0.5.12", "from 0.5.12 the launcher reads the draft's config (ServerArgs)")
def test_patched_refuses_in_the_launcher_from_0_5_12(tiny, drafts):
    assert run_isolated(_launcher_outcome, str(tiny["kimi_k25"]), str(drafts["direct"]), patches=PATCHES) == ("ok", "")
    kind, message = run_isolated(
        _launcher_outcome, str(tiny["kimi_k25"]), str(drafts["norm_before_residual"]), patches=PATCHES
    )
    assert kind == "ConvertError" and "norm_before_residual=true" in message


@pytest.mark.runtime_only  # a fork build carries the strict loader in its source
@only_release("<0.5.12", "0.5.12 loads layers.0.* natively")
def test_refused_where_layers0_would_be_dropped(tiny, drafts):
    """Before 0.5.12 only the strict loader maps layers.0.*: without it the draft is refused, not served half random."""
    out = run_isolated(_draft_configs, str(tiny["kimi_k25"]), [str(drafts["direct"])], patches=[NAME])
    kind, message = out[str(drafts["direct"])]
    assert (
        kind == "Eagle3ConfigError" and "eagle3_draft_strict_loading" in message and "eagle3-patches convert" in message
    )


@pytest.mark.runtime_only
def test_revert_restores_sglangs_auto_config(tiny):
    out = run_isolated(_reader_auto_config_identity, patches=[NAME])
    assert out == {"state": "applied", "patched_is_subclass": True, "restored": True}


@pytest.mark.runtime_only
def test_readings_of_another_file_go_to_transformers_untouched(tiny, drafts, tmp_path):
    """A speculators draft's directory that also holds a plain llama config in ``sub/`` and in ``other.json``:
    ``from_pretrained(..., subfolder=...)``, ``_configuration_file=``, ``gguf_file=`` and
    ``return_unused_kwargs=True`` get exactly what transformers gives them (another file's config, its error,
    a tuple), never the speculators draft's config read in their place."""
    directory = tmp_path / "draft"
    shutil.copytree(drafts["direct"], directory)
    plain = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": 256,
    }
    (directory / "sub").mkdir()
    (directory / "sub" / "config.json").write_text(json.dumps(plain))
    (directory / "other.json").write_text(json.dumps(plain))
    out = run_isolated(_reader_outcomes, str(directory), patches=[NAME])
    for name, got in out["cases"].items():
        assert got["patched"] == got["transformers"], name
    assert out["cases"]["subfolder"]["transformers"][2] == ["LlamaForCausalLM"]  # the other file was read
    assert out["cases"]["_configuration_file"]["transformers"][2] == ["LlamaForCausalLM"]
    # help(AutoConfig) in the serving process: transformers' documentation, then what eagle3-patches adds
    assert out["doc"].startswith(out["transformers_doc"]) and len(out["transformers_doc"]) > 100
    assert f"eagle3-patches ({NAME})" in out["doc"]


# --------------------------------------------------------------------------- a release whose reader has another shape
def _reader(tmp_path, monkeypatch, name: str, source: str | None, *, file: bool = True):
    """A module shaped like sglang's config reader (``get_config`` beside an ``AutoConfig``), as a future release
    might ship it: from ``source`` written to a file, or (``source=None``) with no readable source."""
    import importlib.util
    import sys
    import types

    if source is None:
        module = types.ModuleType(name)
        if file:
            module.__file__ = str(tmp_path / f"{name}.py")  # a .py that is not there: an install without sources
        exec(
            "class AutoConfig:\n    pass\n\ndef get_config(model):\n    return AutoConfig.from_pretrained(model)\n",
            module.__dict__,
        )
    else:
        (tmp_path / f"{name}.py").write_text(source)
        spec = importlib.util.spec_from_file_location(name, tmp_path / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, name, module)
    return module


_GET = "def get_config(model):\n    return AutoConfig.from_pretrained(model)\n"
#: case -> (the reader's source: None for none readable, the reason the registry reports, what the probe says)
_READERS = {
    "no get_config": ("class AutoConfig:\n    pass\n", "has no get_config", NotApplicable),
    "no AutoConfig": ("def get_config(model):\n    return model\n", "has no AutoConfig", NotApplicable),
    "reader not imported": (
        "def get_config(model):\n    return model\n",
        "? (where get_config lives) has no AutoConfig",
        NotApplicable,
    ),
    "no source file": (None, "cannot read the source", None),
    "no source at all": (None, "cannot read the source", None),
    "no AutoConfig.from_pretrained call": (
        "class AutoConfig:\n    pass\n\ndef get_config(model):\n    return model\n",
        "no longer contains 'AutoConfig.from_pretrained('",
        None,
    ),
    "an AutoConfig without from_pretrained": (
        "class AutoConfig:\n    pass\n\n" + _GET,
        "AutoConfig has no from_pretrained",
        None,
    ),
}


@pytest.mark.parametrize("case", list(_READERS))
def test_a_reader_of_another_shape_is_not_applicable(tmp_path, monkeypatch, case):
    """What a future sglang's config reader would look like if it moved or changed: the patch is
    not-applicable, with the reason (the registry's state), never a crash or a patch of the wrong thing; the
    upstream probe says nothing of what it cannot read."""
    from eagle3_patches.patches.speculators_draft_config import PATCH

    source, why, probe = _READERS[case]
    name = "future_reader_" + "".join(c if c.isalnum() else "_" for c in case)
    module = _reader(tmp_path, monkeypatch, name, source, file=case != "no source at all")
    if case == "reader not imported":
        module.get_config.__module__ = "not_imported_anywhere"
    if probe is None:
        assert PATCH.upstream(module) is None
    else:
        with pytest.raises(probe, match=re.escape(why)):
            PATCH.upstream(module)
    with pytest.raises(NotApplicable, match=re.escape(why)):
        PATCH.check(module)


def test_the_upstream_probe_reports_a_reader_that_knows_speculators(tmp_path, monkeypatch):
    from eagle3_patches.patches.speculators_draft_config import PATCH

    module = _reader(
        tmp_path,
        monkeypatch,
        "future_reader_upstream",
        "class AutoConfig:\n    @classmethod\n    def from_pretrained(cls, model):\n        return cls()\n\n"
        "def get_config(model):\n    return AutoConfig.from_pretrained(model)  # reads speculators_model_type\n",
    )
    assert PATCH.upstream(module) == "future_reader_upstream reads speculators_model_type itself"
    PATCH.check(module)  # the shape the patch was written for


# --------------------------------------------------------------------------- patched: the weights and the capture
def test_direct_and_converted_load_the_same_parameters_bit_for_bit(tiny, drafts):
    direct, converted = run_isolated(
        load_drafts, str(tiny["deepseek_v3"]), [str(drafts["direct"]), str(drafts["converted"])], patches=PATCHES
    )
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
