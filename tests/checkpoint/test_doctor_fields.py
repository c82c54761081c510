"""The doctor refuses a draft whose config sets a field that changes its math and that the release never reads
(EAGLE-3.1's norms on an older sglang), naming the field and the first release that reads it."""

from __future__ import annotations

import pytest

from eagle3_patches.checkpoint import draft_fields as F
from eagle3_patches.diagnostic import ERROR, INFO
from eagle3_patches.doctor import doctor
from eagle3_patches.testing import tiny_models as tm

LAUNCH = ["--speculative-algorithm", "EAGLE3"]


def run(tiny, draft, version):
    return doctor(tiny["kimi_k25"], draft, sglang_version=version, launch=["--speculative-algorithm", "EAGLE3"])


@pytest.mark.parametrize(
    "edit, name, too_old, first",
    [
        ({"norm_output": True}, "norm_output", "0.5.11", "0.5.12"),
        ({"fc_norm": True}, "fc_norm", "0.5.11", "0.5.12"),
        ({"use_aux_norm": True}, "use_aux_norm", "0.5.11", "0.5.12"),
        ({"norm_before_fc": True}, "norm_before_fc", "0.5.16", "0.5.17"),
        ({"eagle_config": {"norm_before_fc": True}}, "eagle_config.norm_before_fc", "0.5.16", "0.5.17"),
    ],
)
def test_a_field_the_release_never_reads_is_refused_naming_the_first_that_does(
    tiny, make_draft, edit, name, too_old, first
):
    d = make_draft(config=edit)
    r = run(tiny, d, too_old)
    (f,) = [f for f in r.findings if f.code == "draft-config-ignored"]
    assert f.severity == ERROR and f.where.endswith(f"config.json: {name}")
    assert f.expected == f"a release that reads it: sglang >= {first}"
    assert f.fix == f"serve on sglang >= {first}, or use a draft trained without it"
    assert "draft-config-ignored" not in run(tiny, d, first).codes()


def test_a_field_no_release_reads_has_no_release_to_name(tiny, make_draft):
    f = next(
        f
        for f in run(tiny, make_draft(config={"norm_before_residual": True}), "0.5.23").findings
        if f.code == "draft-config-ignored"
    )
    assert f.fix == "use a draft trained without it" and "0.5.23" in f.expected


def test_fields_set_false_are_nothing(tiny, make_draft):
    d = make_draft(config={"norm_output": False, "fc_norm": False})
    assert "draft-config-ignored" not in run(tiny, d, "0.5.9").codes()


def test_the_installed_release_is_judged_by_its_own_source(tiny, make_draft, monkeypatch):
    d = make_draft(config={"norm_output": True})
    launch = ["--speculative-algorithm", "EAGLE3"]
    r = doctor(tiny["kimi_k25"], d, launch=launch)  # the installed sglang: its llama_eagle3.py is read
    assert r.facts["draft_fields_read_from"].endswith("llama_eagle3.py")
    monkeypatch.setattr(
        F, "installed_source", lambda module: ("patched/llama_eagle3.py", "x = getattr(config, 'norm_output')")
    )
    r = doctor(tiny["kimi_k25"], d, launch=launch)
    assert "draft-config-ignored" not in r.codes() and r.facts["draft_fields_read_from"] == "patched/llama_eagle3.py"


def test_a_hostile_field_value_is_shown_bounded(tiny, make_draft):
    d = make_draft(config={"norm_output": "x" * 10_000})
    (f,) = [f for f in run(tiny, d, "0.5.11").findings if f.code == "draft-config-ignored"]
    assert len(f.found) < 200


# --------------------------------------------------------------------------- eagle3_draft_norms (the backport)
def _norm_weights(t: dict) -> None:
    import torch

    t["input_norm.weight"] = torch.ones(3 * tm.HIDDEN, dtype=torch.bfloat16)
    t.update({f"fc_norm.{i}.weight": torch.ones(tm.HIDDEN, dtype=torch.bfloat16) for i in range(3)})


EAGLE31 = {"fc_norm": True, "norm_output": True, "norm_before_fc": True}


def test_the_backported_fields_are_fixed_under_the_patch_set(tiny, make_draft):
    """0.5.9 with eagle3-patches: the norms are read (a note naming the backport) and their weights are expected."""
    d = make_draft(config=EAGLE31, tensors=_norm_weights)
    stock = run(tiny, d, "0.5.9")
    ignored = [f for f in stock.findings if f.code == "draft-config-ignored"]
    assert sorted(f.where.rsplit(": ", 1)[1] for f in ignored) == sorted(EAGLE31)
    assert {f.severity for f in ignored} == {ERROR}
    assert "keys-unknown" in stock.codes()  # stock drops input_norm / fc_norm.<i> silently
    patched = doctor(tiny["kimi_k25"], d, sglang_version="0.5.9", launch=LAUNCH, with_patches=True)
    notes = [f for f in patched.findings if f.code == "draft-config-ignored"]
    assert len(notes) == 3 and {f.severity for f in notes} == {INFO}
    assert all("fixed by eagle3-patches' eagle3_draft_norms" in f.what for f in notes)
    assert "keys-unknown" not in patched.codes() and "keys-missing" not in patched.codes()


def test_under_the_patch_set_the_norm_weights_are_required(tiny, make_draft):
    d = make_draft(config=EAGLE31)  # the config sets the norms, the checkpoint lacks their weights
    r = doctor(tiny["kimi_k25"], d, sglang_version="0.5.9", launch=LAUNCH, with_patches=True)
    (f,) = [f for f in r.findings if f.code == "keys-missing"]
    assert "input_norm.weight" in f.found and "fc_norm.0.weight" in f.found


def test_the_backport_switched_off_leaves_the_fields_refused_at_start(tiny, make_draft, monkeypatch):
    monkeypatch.setenv("EAGLE3_PATCHES_DISABLE", "eagle3_draft_norms")
    from eagle3_patches import settings

    settings.reload()
    d = make_draft(config={"fc_norm": True}, tensors=_norm_weights)
    r = doctor(tiny["kimi_k25"], d, sglang_version="0.5.9", launch=LAUNCH, with_patches=True)
    (f,) = [f for f in r.findings if f.code == "draft-config-ignored"]
    assert f.severity == ERROR and "eagle3_draft_config_fields" in f.what and "refuses this at start" in f.what


def test_norm_before_residual_stays_refused_under_the_patch_set(tiny, make_draft):
    d = make_draft(config={"norm_before_residual": True})
    r = doctor(tiny["kimi_k25"], d, sglang_version="0.5.9", launch=LAUNCH, with_patches=True)
    (f,) = [f for f in r.findings if f.code == "draft-config-ignored"]
    assert f.severity == ERROR and "refuses this at start" in f.what


def test_on_a_release_that_reads_them_the_weights_are_expected_without_the_patch(tiny, make_draft):
    d = make_draft(config=EAGLE31, tensors=_norm_weights)
    r = run(tiny, d, "0.5.17")
    assert "draft-config-ignored" not in r.codes() and "keys-unknown" not in r.codes()


# --------------------------------------------------------------------------- a speculators draft with the norms
def _speculators_norms(t: dict) -> None:
    import torch

    t["input_norm.weight"] = torch.ones(3 * tm.HIDDEN, dtype=torch.bfloat16)
    t.update({f"fc_norm.{i}.weight": torch.ones(tm.HIDDEN, dtype=torch.bfloat16) for i in range(3)})


def _unsupported(r):
    return [f for f in r.findings if f.code == "draft-unsupported-architecture"]


@pytest.mark.parametrize("with_patches", [True, None])
def test_a_speculators_draft_with_the_norms_is_served_on_0_5_9_with_the_backport(tiny, make_draft, with_patches):
    """speculators_draft_config carries the norms into the config it hands sglang, eagle3_draft_norms reads them:
    nothing refused, the norm weights expected (with patches known, or not known from the launch)."""
    d = make_draft(speculators=True, config=EAGLE31, tensors=_speculators_norms)
    r = doctor(tiny["kimi_k25"], d, sglang_version="0.5.9", launch=LAUNCH, with_patches=with_patches)
    verdict = r if with_patches else r.with_patches
    assert not _unsupported(r) and not _unsupported(verdict), r.format()
    assert "keys-unknown" not in verdict.codes() and "keys-missing" not in verdict.codes(), verdict.format()


@pytest.mark.parametrize(
    "version, refused, first",
    [("0.5.9", ["norm_before_fc", "fc_norm", "norm_output"], "0.5.17"), ("0.5.16", ["norm_before_fc"], "0.5.17")],
)
def test_without_the_backport_a_speculators_draft_is_refused_naming_the_first_release(
    tiny, make_draft, monkeypatch, version, refused, first
):
    from eagle3_patches import settings

    monkeypatch.setenv("EAGLE3_PATCHES_DISABLE", "eagle3_draft_norms")
    settings.reload()
    try:
        d = make_draft(speculators=True, config=EAGLE31, tensors=_speculators_norms)
        r = doctor(tiny["kimi_k25"], d, sglang_version=version, launch=LAUNCH, with_patches=True)
    finally:
        monkeypatch.delenv("EAGLE3_PATCHES_DISABLE")
        settings.reload()
    (f,) = _unsupported(r)
    assert f.severity == ERROR and f.where.endswith(f"config.json: {refused[0]}")
    assert [part.split("=")[0] for part in f.found.split(", ")] == refused
    assert f"sglang {version} does not read" in f.what
    assert f.fix.endswith(f"or on sglang >= {first}, which reads " + ("it" if len(refused) == 1 else "them"))


def test_a_speculators_draft_on_a_release_that_reads_the_norms_needs_no_backport(tiny, make_draft):
    d = make_draft(speculators=True, config=EAGLE31, tensors=_speculators_norms)
    r = doctor(tiny["kimi_k25"], d, sglang_version="0.5.17", launch=LAUNCH, with_patches=True)
    assert not _unsupported(r) and "keys-unknown" not in r.codes(), r.format()
    r = doctor(
        tiny["kimi_k25"],
        make_draft("nbr", speculators=True, config={"norm_before_residual": True}),
        sglang_version="0.5.23",
        launch=LAUNCH,
        with_patches=True,
    )
    assert _unsupported(r)[0].found == "norm_before_residual=true (no sglang release up to 0.5.23 reads it)"
