"""The doctor on an MLA EAGLE-3 draft (sglang's ``Eagle3DeepseekV2ForCausalLM``, 0.5.12+): its tensors judged against
the class sglang builds for it, not against the Llama draft's."""

from __future__ import annotations

import pytest

from eagle3_patches.diagnostic import ERROR
from eagle3_patches.doctor import doctor
from eagle3_patches.testing import tiny_models as tm

A = "layers.0.self_attn."
LAUNCH = ["--speculative-algorithm", "EAGLE3"]
KEY_CODES = {"keys-unknown", "keys-missing", "tensor-shape", "fc-width", "draft-architecture", "draft-kind-not-served"}


def run(tiny, draft, version="0.5.23"):
    return doctor(tiny["kimi_k25"], draft, sglang_version=version, launch=["--speculative-algorithm", "EAGLE3"])


def finding(report, code):
    (f,) = [f for f in report.findings if f.code == code]
    return f


def test_a_correct_mla_draft_passes_the_key_and_shape_checks(tiny):
    r = run(tiny, tiny["mla_draft"])
    assert not KEY_CODES & set(r.codes()), r.format()
    assert r.ok, r.format()
    assert "layout MLA draft for Kimi-K2.x" in finding(r, "draft-kind").what


def test_a_fused_down_projection_is_a_known_layout(tiny, make_mla_draft):
    import torch

    def fuse(t):
        parts = [t.pop(A + "q_a_proj.weight"), t.pop(A + "kv_a_proj_with_mqa.weight")]
        t[A + "fused_qkv_a_proj_with_mqa.weight"] = torch.cat(parts)

    r = run(tiny, make_mla_draft(tensors=fuse))
    assert not KEY_CODES & set(r.codes()), r.format()


def test_a_missing_tensor_is_named(tiny, make_mla_draft):
    r = run(tiny, make_mla_draft(tensors=lambda t: t.pop(A + "kv_b_proj.weight")))
    f = finding(r, "keys-missing")
    assert f.severity == ERROR and f.found == "midlayer.self_attn.kv_b_proj.weight"


def test_a_tensor_the_mla_class_has_no_parameter_for_is_named(tiny, make_mla_draft):
    r = run(tiny, make_mla_draft(tensors=lambda t: t.update({A + "q_proj.weight": t[A + "q_a_proj.weight"].clone()})))
    f = finding(r, "keys-unknown")
    assert "Eagle3DeepseekV2ForCausalLM has no parameter for" in f.what and f.found == A + "q_proj.weight"


@pytest.mark.parametrize(
    "name, shape",
    [
        ("q_a_proj.weight", (48, tm.HIDDEN)),  # exported for one hidden state, not [embeds, hidden]
        ("kv_a_proj_with_mqa.weight", (48, 2 * tm.HIDDEN)),  # without the rope part
        ("q_b_proj.weight", (4 * 16, 48)),  # without the rope part of q
        ("kv_b_proj.weight", (4 * 16, 48)),  # without v
    ],
)
def test_a_projection_of_the_wrong_shape_is_named(tiny, make_mla_draft, name, shape):
    import torch

    r = run(tiny, make_mla_draft(tensors=lambda t: t.update({A + name: torch.zeros(shape, dtype=torch.bfloat16)})))
    f = finding(r, "tensor-shape")
    assert f.severity == ERROR and f.found == str(list(shape)) and name in f.where


def test_an_fc_for_one_hidden_state_is_the_fc_width_error(tiny, make_mla_draft):
    import torch

    r = run(tiny, make_mla_draft(tensors=lambda t: t.update({"fc.weight": torch.zeros(tm.HIDDEN, tm.HIDDEN)})))
    assert finding(r, "fc-width").found == f"[{tm.HIDDEN}, {tm.HIDDEN}] (1 states)"


def test_before_the_class_existed_the_draft_is_not_served(tiny):
    r = run(tiny, tiny["mla_draft"], version="0.5.11")
    assert finding(r, "draft-kind-not-served").severity == ERROR


# --------------------------------------------------------------------------- EAGLE-3.1's norms on the MLA draft
def _fc_norm(names=("fc_norm.0", "fc_norm.1", "fc_norm.2")):
    import torch

    return lambda t: t.update({f"{n}.weight": torch.full((tm.HIDDEN,), 1.5, dtype=torch.bfloat16) for n in names})


EAGLE31 = {"fc_norm": True, "norm_output": True}


@pytest.mark.parametrize("with_patches", [False, True])
def test_the_mla_drafts_norms_are_judged_by_its_own_class(tiny, make_mla_draft, with_patches):
    """0.5.12's kimi_k25_eagle3.py reads neither norm (its llama_eagle3.py reads both: not the class that serves
    this draft); 0.5.13 reads both."""
    d = make_mla_draft(config=EAGLE31, tensors=_fc_norm())
    old = doctor(tiny["kimi_k25"], d, sglang_version="0.5.12", launch=LAUNCH, with_patches=with_patches)
    ignored = sorted(f.where.rsplit(": ", 1)[1] for f in old.findings if f.code == "draft-config-ignored")
    assert ignored == ["fc_norm", "norm_output"], old.format()
    assert finding(old, "keys-unknown").found == "fc_norm.0.weight, fc_norm.1.weight, fc_norm.2.weight"
    new = doctor(tiny["kimi_k25"], d, sglang_version="0.5.13", launch=LAUNCH, with_patches=with_patches)
    assert not (KEY_CODES | {"keys-missing", "draft-config-ignored"}) & set(new.codes()), new.format()


def test_on_a_release_that_reads_fc_norm_its_weights_are_required(tiny, make_mla_draft):
    r = run(tiny, make_mla_draft(config=EAGLE31), "0.5.13")
    assert "fc_norm.0.weight" in finding(r, "keys-missing").found


def test_the_mla_class_maps_no_older_aux_norm_names(tiny, make_mla_draft):
    """The Llama draft's loader maps aux_norm_low / _mid / _high onto fc_norm.<i> (0.5.12+, and the backport); the
    MLA draft's never did: those tensors are dropped and fc_norm stays at its initial value."""
    d = make_mla_draft(config=EAGLE31, tensors=_fc_norm(("aux_norm_low", "aux_norm_mid", "aux_norm_high")))
    r = run(tiny, d, "0.5.23")
    assert "aux_norm_low.weight" in finding(r, "keys-unknown").found
    assert "fc_norm.0.weight" in finding(r, "keys-missing").found
