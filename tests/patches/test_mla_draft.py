"""The MLA EAGLE-3 draft (sglang's ``Eagle3DeepseekV2ForCausalLM``, ``models/kimi_k25_eagle3.py``, 0.5.12+) beside the
tiny Kimi-K2.5: ``mla_draft_strict_loading`` and ``mla_draft_fc_guard``, through the selftest checks (real draft
``ModelRunner`` objects and the real EAGLE worker).  On releases without the class the checks skip with their reason."""

from __future__ import annotations

import pytest
import torch
from packaging.version import Version
from safetensors.torch import load_file

from eagle3_patches.selftest import PASSED
from eagle3_patches.selftest.checkpoints import MLA_REFUSED_FOR
from eagle3_patches.testing import tiny_models as tm

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def loading(run_check):
    return run_check("mla_draft_strict_loading")


@pytest.fixture(scope="module")
def fc(run_check):
    return run_check("mla_draft_fc_guard")


@pytest.mark.stock
def test_stock_loads_every_bad_mla_draft_silently(loading):
    stock = loading.observations["stock_by_name"]
    assert all(stock[name]["ok"] for name in MLA_REFUSED_FOR), {n: stock[n].get("message") for n in MLA_REFUSED_FOR}


def test_the_loading_check_passes(loading):
    assert loading.status == PASSED, loading.reason


@pytest.mark.parametrize("name", sorted(MLA_REFUSED_FOR))
def test_patched_refuses_each_bad_mla_draft_naming_the_tensor(loading, name):
    got = loading.observations["patched_by_name"][name]
    assert not got["ok"] and got["type"] == "Eagle3ConfigError"
    assert MLA_REFUSED_FOR[name] in got["message"]
    assert "does not match Eagle3DeepseekV2ForCausalLM" in got["message"]
    assert str(loading.observations["paths"][name]) in got["message"]  # which checkpoint


def test_patched_loads_the_good_mla_draft_bit_exactly(loading):
    """What the file holds is what the draft runs with: every tensor, the down projections as sglang fuses them."""
    got = loading.observations["patched_by_name"]["mla_draft"]
    assert got["ok"], got
    params = got["params"]
    want = load_file(f"{loading.observations['paths']['mla_draft']}/model.safetensors")
    a, m = "layers.0.self_attn.", "model.midlayer."
    fused = torch.cat([want[a + "q_a_proj.weight"], want[a + "kv_a_proj_with_mqa.weight"]])
    assert torch.equal(params[m + "self_attn.fused_qkv_a_proj_with_mqa.weight"], fused)
    for name in ("kv_b_proj", "q_b_proj", "o_proj"):
        assert torch.equal(params[f"{m}self_attn.{name}.weight"], want[f"{a}{name}.weight"])
    assert torch.equal(params["model.fc.weight"], want["fc.weight"])
    assert torch.equal(params["lm_head.weight"], want["lm_head.weight"])
    hot = got["hot_token_id"]
    assert hot is not None and torch.equal(hot, tm.hot_token_ids(tm.VOCAB, tm.DRAFT_VOCAB))


@pytest.mark.stock
def test_stock_skips_the_mla_drafts_fc_silently_under_eagle(fc):
    stock = fc.observations["stock"]
    assert stock["error"] is None and stock["fc_inputs"] == []


def test_patched_refuses_h_wide_states_naming_the_flag(fc):
    assert fc.status == PASSED, fc.reason
    patched = fc.observations["patched"]
    assert patched["error"] == "Eagle3CaptureError" and patched["fc_inputs"] == []
    assert "--speculative-algorithm EAGLE3" in patched["message"]
    assert "Eagle3MLAModel.forward (sglang/srt/models/kimi_k25_eagle3.py)" in patched["message"]


def test_with_eagle3_the_mla_drafts_fc_gets_3_x_hidden(fc):
    fc_inputs = fc.observations["eagle3"]["fc_inputs"]
    assert fc_inputs and {shape[-1] for shape in fc_inputs} == {3 * tm.HIDDEN}


@pytest.mark.parametrize("patch", ["mla_draft_strict_loading", "mla_draft_fc_guard"])
def test_every_release_that_serves_the_mla_draft_runs_both_mla_patches_from_its_first(tiny, patch):
    """The doctor's verdict on the MLA draft per release (served from the first release with
    ``models/kimi_k25_eagle3.py``, .post releases alike) and the patch's range agree at the range's first release and
    on either side of it: a bound moved by one release leaves the first release's MLA drafts unguarded, or claims a
    release with no class to guard."""
    import eagle3_patches
    from eagle3_patches.doctor import doctor

    for version in ("0.5.11", "0.5.11.post1", "0.5.12", "0.5.12.post1", "0.5.13"):
        r = doctor(tiny["kimi_k25"], tiny["mla_draft"], sglang_version=version, launch="--speculative-algorithm EAGLE3")
        served = "draft-kind-not-served" not in r.codes()
        assert eagle3_patches.get_patch(patch).covers(Version(version)) == served, (version, r.format())


@pytest.mark.parametrize("patch", ["mla_draft_strict_loading", "mla_draft_fc_guard"])
def test_on_a_release_with_the_mla_draft_class_the_patch_is_applied(patch):
    """On the installed release (the matrix runs each): where sglang has ``models/kimi_k25_eagle3.py``, ``status``
    says ``applied`` for both MLA patches; where it has none, neither claims the release."""
    from importlib.util import find_spec
    from pathlib import Path

    from support.releases import sglang_version

    import eagle3_patches

    (root,) = find_spec("sglang").submodule_search_locations
    has_class = (Path(root) / "srt" / "models" / "kimi_k25_eagle3.py").is_file()
    assert eagle3_patches.get_patch(patch).covers(sglang_version()) == has_class


def test_the_fc_guard_refuses_a_release_whose_mla_draft_no_longer_skips_fc():
    """A forward that applies fc itself, or reads no target states, has nothing for the guard to replace."""
    from types import SimpleNamespace

    from eagle3_patches.patches.mla_draft_fc_guard import PATCH
    from eagle3_patches.registry import NotApplicable

    class Eagle3MLAModel:
        def forward(self, hidden_states, spec_info):
            return self.fc(spec_info.hidden_states)

    with pytest.raises(NotApplicable):
        PATCH.check(SimpleNamespace(Eagle3MLAModel=Eagle3MLAModel))

    class Skipping(Eagle3MLAModel):
        def forward(self, hidden_states, spec_info):
            hidden_states = spec_info.hidden_states
            return self.fc(hidden_states)

    PATCH.check(SimpleNamespace(Eagle3MLAModel=Skipping))  # sglang's shape: accepted


def test_the_loading_check_refuses_a_release_whose_mla_loader_it_does_not_know():
    """The strict loader replaces sglang's: it needs that loader's shape (params_dict, the fused kv_a projection) and
    sglang's default_weight_loader, else it is not applied."""
    from types import SimpleNamespace

    from eagle3_patches.patches.mla_draft_strict_loading import PATCH
    from eagle3_patches.registry import NotApplicable

    class Known:
        def load_weights(self, weights):
            params_dict = dict(self.named_parameters())
            return params_dict["kv_a_proj_with_mqa"]

    class Unknown:
        def load_weights(self, weights):
            return list(weights)

    def loader(param, weight):
        return None

    PATCH.check(SimpleNamespace(Eagle3DeepseekV2ForCausalLM=Known, default_weight_loader=loader))  # accepted
    for module in (
        SimpleNamespace(Eagle3DeepseekV2ForCausalLM=Unknown, default_weight_loader=loader),
        SimpleNamespace(Eagle3DeepseekV2ForCausalLM=Known),
    ):
        with pytest.raises(NotApplicable):
            PATCH.check(module)
