"""The MLA EAGLE-3 draft (sglang's ``Eagle3DeepseekV2ForCausalLM``, 0.5.12+) in the real CPU server beside the tiny
Kimi-K2.5, under ``eagle3-patches run``: greedy outputs identical to the server without speculation, the draft's
``fc`` fed 3 x hidden (the diagnostic probe), and a draft with a tensor missing refused at start, naming it.

The MLA draft is the tiny one of ``tiny_models.mla_draft_tensors`` (random weights: what it proves is the path, not
an accept length)."""

from __future__ import annotations

import pytest
from e2e_servers import PROMPTS, probe_records, serve_or_fail
from support.releases import only_release

from eagle3_patches import settings
from eagle3_patches.testing import tiny_models
from eagle3_patches.testing.server import ServerError, serve, speculative_flags

pytestmark = [
    pytest.mark.server,
    pytest.mark.timeout(900),
    only_release(">=0.5.12", "sglang's MLA draft class (models/kimi_k25_eagle3.py) arrived in 0.5.12"),
]


@pytest.fixture(scope="module")
def mla(models, tiny_root, tmp_path_factory) -> dict:
    draft = tiny_models.build_mla_draft(tiny_root / "tiny-eagle3-mla-draft")
    tmp = tmp_path_factory.mktemp("mla")
    out = serve_or_fail(
        "mla-eagle3",
        models["target"],
        speculative_flags(str(draft), "EAGLE3"),
        tmp,
        PROMPTS,
        env={settings.PROBE: str(tmp / "probe")},
    )
    out["probe"] = probe_records(tmp / "probe")
    return out


def test_the_mla_draft_gives_the_outputs_of_no_speculation(mla, baseline):
    assert all(r["meta_info"]["spec_verify_ct"] > 0 for r in mla["responses"])  # it speculated
    for prompt, want, got in zip(PROMPTS, baseline["outputs"], mla["outputs"]):
        assert got == want, f"prompt {prompt}: MLA-draft speculative {got} != plain {want}"


def test_the_mla_drafts_fc_is_fed_3_x_hidden(mla, figure):
    extend = [r for r in mla["probe"] if r.get("hop") == "draft_input" and r.get("fc_applied")]
    assert extend, mla["probe"][:5]
    assert {r["width"] for r in extend} == {3 * tiny_models.HIDDEN}
    assert {"mla_draft_strict_loading", "mla_draft_fc_guard"} <= set(extend[0]["patches_applied"])  # in that process
    figure(f"MLA draft in the server: fc inputs {sorted({tuple(r['fc_input_shape']) for r in extend})}")


def test_an_mla_draft_missing_a_tensor_is_refused_at_start(models, tiny_root, tmp_path):
    tensors = tiny_models.mla_draft_tensors()
    del tensors["layers.0.self_attn.kv_b_proj.weight"]
    draft = tiny_models.build_mla_draft(tiny_root / "mla-draft-without-kv-b-proj", tensors)
    with pytest.raises(ServerError) as info:
        serve(models["target"], speculative_flags(str(draft)), tmp_path / "refused.log", PROMPTS[:1], max_new_tokens=4)
    log = (tmp_path / "refused.log").read_text()
    assert "does not match Eagle3DeepseekV2ForCausalLM" in log and "kv_b_proj.weight" in log, str(info.value)
