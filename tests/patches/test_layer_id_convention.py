"""layer_id_convention: one draft config captures the same layer outputs on every sglang release.

The draft config says ``eagle_aux_hidden_state_layer_ids: [2, 3, 4]`` on the tiny 6-layer DeepSeek-V3
target and records the library's convention (``output-of-layer``: id i = the output of layer i).
sglang <= 0.5.12 captures the outputs of layers 2, 3, 4 for it; stock 0.5.13+ the outputs of layers
1, 2, 3 (the +1 rule changed).  The captured aux tensor (``logits_output.hidden_states``, real prefill)
is compared, chunk by chunk, with every decoder layer's output (``hidden_states + residual``, taken by
forward hooks on the same run) to find which layers were really captured.
"""

from __future__ import annotations

import json

import pytest
from support.releases import only_release, patch_applies, sglang_version

from eagle3_patches.checkpoint.layer_ids import CONVENTION_KEY, INPUT_OF_LAYER, OUTPUT_OF_LAYER
from eagle3_patches.patches import layer_id_convention as lic
from eagle3_patches.selftest import PASSED
from eagle3_patches.selftest.checkpoints import LAYER_CHECK_IDS, build
from eagle3_patches.testing.isolation import run_isolated
from eagle3_patches.testing.tiny_models import HIDDEN, NUM_LAYERS

IDS = LAYER_CHECK_IDS  # output-of-layer: the outputs of layers 2, 3, 4 (capture before layers 3, 4, 5)


@pytest.fixture(scope="module")
def drafts(tiny_root):
    return {
        "marked": build(tiny_root, "layer_ids_marked_draft"),
        "unmarked": build(tiny_root, "layer_ids_unmarked_draft"),
    }


@pytest.fixture(scope="module")
def check(run_check):
    """The selftest check: ``captured_layers`` on the tiny DeepSeek-V3 with the patch set, then the
    patch reverted (stock rule, same model), then an unmarked config."""
    return run_check("layer_id_convention")


@pytest.fixture(scope="module")
def captured(check):
    return check.observations


@pytest.mark.sglang
def test_the_check_passes(check):
    assert check.status == PASSED, check.reason


@pytest.mark.sglang
def test_same_draft_config_captures_the_outputs_of_layers_2_3_4(captured):
    """On every release: ids [2, 3, 4] in the library's convention = the outputs of layers 2, 3, 4."""
    assert captured["patched"]["width"] == len(IDS) * HIDDEN
    assert captured["patched"]["layers_to_capture"] == [i + 1 for i in IDS]
    assert captured["patched"]["outputs_of"] == list(IDS)


@pytest.mark.sglang
def test_patch_state_follows_the_release(captured):
    expected = "applied" if patch_applies("layer_id_convention") else "not-applicable"
    assert captured["state"] == expected, captured["reason"]


@pytest.mark.sglang
@only_release(">=0.5.13", "the +1 rule changed in 0.5.13")
def test_stock_0_5_13_reads_the_same_ids_as_the_outputs_of_layers_1_2_3(captured):
    """The bug, pinned: without the patch the same config captures other layers from 0.5.13 on."""
    assert captured["stock"]["layers_to_capture"] == list(IDS)
    assert captured["stock"]["outputs_of"] == [i - 1 for i in IDS]


@pytest.mark.sglang
@only_release("<0.5.13", "before 0.5.13 sglang always adds 1")
def test_stock_before_0_5_13_already_captures_the_outputs_of_layers_2_3_4(captured):
    assert captured["stock"]["outputs_of"] == list(IDS)


@pytest.mark.sglang
@only_release(">=0.5.13", "the patch applies from 0.5.13")
def test_unmarked_config_keeps_sglangs_rule_and_warns(captured):
    """A config that records no convention may have been made for this release: left alone, with a warning."""
    assert captured["unmarked"]["layers_to_capture"] == list(IDS)
    assert any("+1 rule changed in 0.5.13" in m and CONVENTION_KEY in m for m in captured["unmarked"]["logs"])


@pytest.mark.sglang
@only_release(">=0.5.13", "the patch applies from 0.5.13")
def test_unmarked_config_warns_once_naming_both_readings(captured):
    """Set twice (sglang sets the ids again before capturing CUDA graphs): one warning, which says which
    layers' outputs the ids capture here and on <= 0.5.12."""
    ids = list(IDS)
    warned = [m for m in captured["unmarked"]["logs"] if "+1 rule changed in 0.5.13" in m]
    assert len(warned) == 1, captured["unmarked"]["logs"]
    assert (
        f"aux layer ids {ids} capture the outputs of layers {[i - 1 for i in ids]} on this sglang, but of "
        f"layers {ids} on sglang <= 0.5.12"
    ) in warned[0]


@pytest.mark.sglang
@only_release(">=0.5.13", "the patch applies from 0.5.13")
def test_patched_says_which_layers_it_captures_instead(captured):
    ids = list(IDS)
    said = [m for m in captured["patched"]["logs"] if "-> layers_to_capture" in m]
    assert len(said) == 1, captured["patched"]["logs"]
    assert f"aux layer ids {ids} ({OUTPUT_OF_LAYER}, from eagle_config.{CONVENTION_KEY} in " in said[0]
    assert f"-> layers_to_capture {[i + 1 for i in ids]} (sglang's own rule gave {ids})" in said[0]


@pytest.mark.sglang
@only_release(">=0.5.13", "the patch applies from 0.5.13")
def test_the_environment_names_the_convention_of_an_unmarked_config(captured):
    """EAGLE3_PATCHES_LAYER_ID_CONVENTION=input-of-layer: the ids [1, 3, 4] are captured as they are, where
    sglang's own rule adds 1 to a list whose first id is 1; the log says so."""
    stock = captured["stock"]["first_id_1"]
    ids = [1, *list(IDS)[1:]]
    assert stock == [i + 1 for i in ids]
    out = captured["unmarked_input_of_layer"]
    assert out["layers_to_capture"] == ids
    said = [m for m in out["logs"] if "-> layers_to_capture" in m]
    assert len(said) == 1 and f"({INPUT_OF_LAYER}, from EAGLE3_PATCHES_LAYER_ID_CONVENTION)" in said[0], out["logs"]
    assert f"-> layers_to_capture {ids} (sglang's own rule gave {stock})" in said[0]


@pytest.mark.sglang
def test_the_default_capture_is_never_changed(captured):
    """``set_eagle3_layers_to_capture()`` without ids (a draft config without ids; before CUDA graphs): the
    patched target captures sglang's own default layers, silently."""
    assert captured["default"]["layers_to_capture"] == captured["stock"]["default"]
    assert len(captured["default"]["layers_to_capture"]) == 3
    assert captured["default"]["logs"] == []


@pytest.mark.sglang
def test_a_bare_model_without_server_args_records_no_convention(tiny):
    """A target built outside a server (no global server args): no draft to read, sglang's rule stands."""
    convention, why = run_isolated(lic.draft_convention, patches=None)
    assert convention is None and "records no eagle_config" in why


# -- no sglang --------------------------------------------------------------------------------------
def test_capture_points_per_convention():
    assert lic.capture_points_for([2, 30, 58], OUTPUT_OF_LAYER) == [3, 31, 59]
    assert lic.capture_points_for([1, 29, 57], OUTPUT_OF_LAYER) == [2, 30, 58]  # first id 1: same as <= 0.5.12
    assert lic.capture_points_for([2, 30, 58], INPUT_OF_LAYER) == [2, 30, 58]
    with pytest.raises(ValueError):
        lic.capture_points_for([1], "nonsense")


@pytest.mark.parametrize("value", ["x", "output-of-layers"])
def test_an_unknown_convention_in_the_environment_is_refused_naming_the_variable(monkeypatch, value):
    """A one-character value too: a typo in the variable never falls back to sglang's rule unnoticed."""
    from eagle3_patches import settings
    from eagle3_patches.errors import Eagle3ConfigError

    monkeypatch.setattr(lic, "server_arg", lambda name: None)  # no draft path: nothing recorded
    settings.reload({settings.LAYER_ID_CONVENTION: value})
    try:
        with pytest.raises(Eagle3ConfigError) as info:
            lic.draft_convention()
    finally:
        settings.reload()
    d = info.value.diagnostic
    assert d.where == settings.LAYER_ID_CONVENTION and d.found == repr(value)


def test_convention_read_from_the_draft_config(drafts):
    assert lic._read_draft_config(str(drafts["marked"]))["eagle_config"][CONVENTION_KEY] == OUTPUT_OF_LAYER
    assert lic._read_draft_config(str(drafts["unmarked"]))["eagle_config"].get(CONVENTION_KEY) is None
    assert lic._read_draft_config(None) is None


@pytest.mark.parametrize("config", [None, "{not json", "[2, 3, 4]", b"\xff\xfe"])
def test_a_draft_config_that_cannot_be_read_records_nothing(tmp_path, config):
    """No config.json, one that is not JSON, not an object, not UTF-8: no convention (sglang's rule), no crash."""
    if config is not None:
        (tmp_path / "config.json").write_bytes(config.encode() if isinstance(config, str) else config)
    assert lic._read_draft_config(str(tmp_path)) is None


@pytest.mark.parametrize("hub_id", ["eagle3-patches-test/never-downloaded", "not//a valid id"])
def test_a_hub_id_is_read_from_the_cache_only(tmp_path, monkeypatch, hub_id):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # an empty cache; offline machines have no other
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert lic._read_draft_config(hub_id) is None


def _marked_config() -> bytes:
    return json.dumps(
        {
            "architectures": ["LlamaForCausalLMEagle3"],
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3], CONVENTION_KEY: INPUT_OF_LAYER},
        }
    ).encode()


def test_a_hub_cache_snapshot_is_read_through_its_blob_link(tmp_path, monkeypatch):
    """The hub cache's layout: snapshots/<rev>/config.json is a link into blobs/, which is read."""
    repo = tmp_path / "models--org--draft"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "0123abcd").write_bytes(_marked_config())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("f" * 40)
    snapshot = repo / "snapshots" / ("f" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").symlink_to("../../blobs/0123abcd")
    huggingface_hub = pytest.importorskip("huggingface_hub")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))  # read once, at its import
    assert lic._read_draft_config(str(snapshot))["eagle_config"][CONVENTION_KEY] == INPUT_OF_LAYER
    assert lic._read_draft_config("org/draft")["eagle_config"][CONVENTION_KEY] == INPUT_OF_LAYER


def test_a_config_linked_out_of_the_draft_or_too_large_is_not_read(tmp_path):
    """A hostile draft's config.json: a link to a file elsewhere, or larger than any config: nothing recorded
    (sglang's rule applies) and nothing outside the draft read."""
    outside = tmp_path / "elsewhere.json"
    outside.write_bytes(_marked_config())
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "config.json").symlink_to(outside)
    assert lic._read_draft_config(str(linked)) is None
    huge = tmp_path / "huge"
    huge.mkdir()
    (huge / "config.json").write_bytes(_marked_config()[:-1] + b", " + b" " * (5 << 20) + b"}")
    assert lic._read_draft_config(str(huge)) is None


def test_a_speculators_draft_is_read_as_sglang_is_handed_it(tiny_root):
    """Served directly (speculators_draft_config), the ids are in the running release's convention, recorded."""
    from eagle3_patches.checkpoint.layer_ids import release_convention
    from eagle3_patches.testing.tiny_models import build_speculators_fixture

    config = lic._read_draft_config(str(build_speculators_fixture(tiny_root / "speculators-direct")))
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["eagle_config"][CONVENTION_KEY] == release_convention(sglang_version())


def test_declared_releases():
    from packaging.version import Version

    assert Version("0.5.12") not in lic.PATCH.applies_to
    assert Version("0.5.13") in lic.PATCH.applies_to and Version("0.5.23") in lic.PATCH.applies_to
    assert sglang_version() is None or isinstance(sglang_version(), Version)


def test_tiny_target_has_room_for_the_ids():
    assert max(IDS) <= NUM_LAYERS - 2
