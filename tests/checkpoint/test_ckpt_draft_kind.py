"""checkpoint/draft_kind: which drafts count as EAGLE-3, for the algorithm guard (from the files) and the doctor
(from what it read), by one rule. A miss lets an EAGLE-3 draft run under ``--speculative-algorithm EAGLE`` with an
accept length near 1.0; a false alarm refuses a working EAGLE-1/2 server at start."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

from eagle3_patches.checkpoint.draft_kind import eagle3_draft_evidence
from eagle3_patches.doctor import doctor
from eagle3_patches.testing import tiny_models as tm

H = tm.HIDDEN


def _eagle_draft(path, *, hidden, width, fc_key="fc.weight"):
    """An EAGLE-1-format draft (``LlamaForCausalLMEagle``, no eagle_config): only its fc tells what it is."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle"], "hidden_size": hidden}))
    save_file(
        {fc_key: torch.zeros(max(hidden, 1) if isinstance(hidden, int) else H, width)}, str(path / "model.safetensors")
    )
    return path


def test_the_eagle3_formats_are_evidence_and_other_checkpoints_not(tiny, tmp_path):
    assert "LlamaForCausalLMEagle3" in eagle3_draft_evidence(tiny["draft"])
    assert "Eagle3DraftModel" in eagle3_draft_evidence(tiny["speculators_draft"])
    renamed = tmp_path / "renamed"
    shutil.copytree(tiny["draft"], renamed)
    cfg = json.loads((renamed / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLMEagle"]
    del cfg["eagle_config"]
    (renamed / "config.json").write_text(json.dumps(cfg))
    assert eagle3_draft_evidence(renamed) == f"fc.weight takes {3 * H} = 3 x hidden ({H}) inputs"
    assert eagle3_draft_evidence(tiny["deepseek_v3"]) is None  # not a draft
    assert eagle3_draft_evidence(tmp_path / "nowhere") is None


@pytest.mark.parametrize(
    "hidden, width, fc_key, states",
    [
        (H, 3 * H, "fc.weight", 3),
        (H, 4 * H, "fc.weight", 4),  # four aux layers
        (H, 3 * H, "model.fc.weight", 3),  # saved with the model prefix
        (1, 3, "fc.weight", 3),
        (H, 2 * H, "fc.weight", None),  # EAGLE-1/2: the embedding and one hidden state
        (H, H, "fc.weight", None),
        (H, 3 * H - 8, "fc.weight", None),  # not a multiple of hidden
        (0, 3 * H, "fc.weight", None),  # a config's nonsense is no evidence, and no crash
        (str(H), 3 * H, "fc.weight", None),
    ],
)
def test_an_fc_of_k_hidden_states_is_evidence_from_three_on(tmp_path, hidden, width, fc_key, states):
    draft = _eagle_draft(tmp_path / "d", hidden=hidden, width=width, fc_key=fc_key)
    expected = None if states is None else f"fc.weight takes {width} = {states} x hidden ({hidden}) inputs"
    assert eagle3_draft_evidence(draft) == expected


def test_an_unreadable_header_is_no_evidence_for_the_guard(tmp_path):
    draft = _eagle_draft(tmp_path / "d", hidden=H, width=3 * H)
    (draft / "model.safetensors").write_bytes(b"\xff" * 64)  # the doctor names it; the guard lets sglang start
    assert eagle3_draft_evidence(draft) is None


@pytest.mark.parametrize("width, is_eagle3", [(2 * H, False), (3 * H, True)])
def test_the_doctor_judges_the_draft_as_the_guard_does(tiny, make_draft, DELETE, width, is_eagle3):
    """An EAGLE-1/2 draft (fc 2 x hidden) is served with EAGLE, an EAGLE-3 one in the EAGLE-1 format with EAGLE3."""

    def fc(t):
        t["fc.weight"] = torch.zeros(H, width)

    draft = make_draft("eagle", config={"architectures": ["LlamaForCausalLMEagle"], "eagle_config": DELETE}, tensors=fc)
    assert (eagle3_draft_evidence(draft) is not None) == is_eagle3
    launch = [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(tiny["deepseek_v3"]),
        "--speculative-draft-model-path",
        str(draft),
        "--speculative-algorithm",
    ]
    eagle, eagle3 = (
        doctor(launch=[*launch, algo], sglang_version="0.5.9").codes("error") for algo in ("EAGLE", "EAGLE3")
    )
    assert ("algorithm-eagle-with-eagle3-draft" in eagle) == is_eagle3, eagle
    assert ("algorithm-eagle3-with-non-eagle3-draft" in eagle3) != is_eagle3, eagle3
