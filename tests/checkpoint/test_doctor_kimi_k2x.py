"""The doctor on Kimi-K2.6 / Kimi-K2.7-Code and their EAGLE-3.1 MLA drafts at their real sizes
(:mod:`support.kimi_k2x`: the public configs' shapes, header-only weights), on every release of the
matrix: the coder draft's aux ids ``[1, 29, 57]`` under each release's layer-id rule, the draft's norms served or
refused, and the targets recognised as the Kimi-K2.5 class they declare.

The expected values are read from the released wheels, not from the library: ``deepseek_v2.py``'s
``layers_to_capture`` (before 0.5.13 ``+1`` always, from 0.5.13 ``+1`` when the first id is 1: ``[1, 29, 57]`` is
shifted on every release) and ``kimi_k25_eagle3.py`` (0.5.12 skips ``fc_norm.<i>.weight`` and never reads
``norm_output``; 0.5.13 and later read both)."""

from __future__ import annotations

import pytest
from support import kimi_k2x as K

from eagle3_patches.diagnostic import ERROR, INFO, WARNING
from eagle3_patches.doctor import doctor

#: the full matrix (tools/matrix_releases.json), .postN included
RELEASES = (
    "0.5.9",
    "0.5.10",
    "0.5.10.post1",
    "0.5.11",
    "0.5.12",
    "0.5.12.post1",
    "0.5.13",
    "0.5.13.post1",
    "0.5.14",
    "0.5.15",
    "0.5.15.post1",
    "0.5.16",
    "0.5.17",
    "0.5.18",
    "0.5.19",
    "0.5.20",
    "0.5.21",
    "0.5.22",
    "0.5.23",
)
LAUNCH = ["--speculative-algorithm", "EAGLE3", "--tp", "8"]


def _base(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split(".")[:3])


@pytest.fixture(scope="module")
def k2x(tmp_path_factory):
    root = tmp_path_factory.mktemp("k2x")
    return {
        "target": K.build_target(root / "kimi-k2.7-code"),
        "coder31": K.build_mla_draft(root / "kimi-k2.7-coder-eagle3.1-mla"),
        "plain": K.build_mla_draft(root / "kimi-k2.7-coder-eagle3-mla", K.draft_spec(eagle31=False)),
    }


def run(k2x, draft: str, version: str, with_patches: bool, launch=LAUNCH):
    return doctor(k2x["target"], k2x[draft], sglang_version=version, launch=launch, with_patches=with_patches)


def test_the_fixture_has_the_public_shapes(k2x):
    r = run(k2x, "coder31", "0.5.23", True)
    assert "KimiK25ForConditionalGeneration, 61 layers, hidden 7168, vocab 163840" in r.format()
    assert "Eagle3DeepseekV2ForCausalLM, hidden 7168" in r.format() and "aux ids [1, 29, 57]" in r.format()


@pytest.mark.parametrize("with_patches", [False, True])
@pytest.mark.parametrize("version", RELEASES)
def test_the_coder_drafts_ids_capture_the_outputs_of_layers_1_29_57_on_every_release(k2x, version, with_patches):
    r = run(k2x, "coder31", version, with_patches)
    (f,) = [f for f in r.findings if f.code == "aux-ids-capture"]
    assert f.severity == INFO
    assert f.what == (
        f"on sglang {version}, ids [1, 29, 57] -> capture before layers [2, 30, 58]: the outputs of layers "
        "[1, 29, 57] of 61 (3 state(s), in layer order)"
    )
    wrong = [f for f in r.findings if f.code.startswith("aux-ids") and f.severity in (ERROR, WARNING)]
    assert not wrong, r.format()


@pytest.mark.parametrize("version", RELEASES)
def test_the_eagle31_draft_is_served_with_its_norms_or_refused_on_every_release(k2x, version):
    stock, patched = run(k2x, "coder31", version, False), run(k2x, "coder31", version, True)
    for r in (stock, patched):
        ignored = {f.where.rsplit(": ", 1)[1]: f for f in r.findings if f.code == "draft-config-ignored"}
        unknown = [f for f in r.findings if f.code == "keys-unknown"]
        if _base(version) < (0, 5, 12):  # no MLA draft class at all
            assert "draft-kind-not-served" in r.codes(ERROR) and not ignored, r.format()
            continue
        if _base(version) < (0, 5, 13):
            assert sorted(ignored) == ["fc_norm", "norm_output"], r.format()
            assert {f.severity for f in ignored.values()} == {ERROR}
            assert all(f.expected == "a release that reads it: sglang >= 0.5.13" for f in ignored.values())
            assert all("Eagle3DeepseekV2ForCausalLM never reads" in f.what for f in ignored.values())
            (u,) = unknown
            assert u.severity == ERROR and "fc_norm.0.weight" in u.found
            assert "draft-kind-not-served" not in r.codes()  # one finding per problem: draft-config-ignored
            continue
        assert not ignored and not unknown and "keys-missing" not in r.codes(), r.format()
        kind = next(f for f in r.findings if f.code == "draft-kind")
        assert "kind EAGLE-3.1, layout MLA draft for Kimi-K2.x with EAGLE-3.1's norms" in kind.what
        assert f"served by sglang {version}" in kind.what
    if (0, 5, 12) <= _base(version) < (0, 5, 13):
        assert all("refuses this at start" in f.what for f in patched.findings if f.code == "draft-config-ignored")


@pytest.mark.parametrize("version", ["0.5.12", "0.5.13", "0.5.23"])
def test_the_plain_mla_draft_carries_no_norm_finding(k2x, version):
    r = run(k2x, "plain", version, True)
    assert "draft-config-ignored" not in r.codes() and "keys-unknown" not in r.codes(), r.format()


def test_the_k2x_targets_are_kimi_k25s_class_to_every_rule(k2x):
    """What holds for Kimi-K2.5 holds for them: the 0.5.9 delegation and the TP all-reduce fusion before 0.5.14."""
    stock, patched = run(k2x, "plain", "0.5.9", False), run(k2x, "plain", "0.5.9", True)
    assert "kimi-k25-delegation" in stock.codes(ERROR) and "kimi-k25-delegation" in patched.codes(INFO)
    assert "tp-allreduce-fusion" in run(k2x, "plain", "0.5.13", False).codes(ERROR)
    assert "tp-allreduce-fusion" not in run(k2x, "plain", "0.5.14", False).codes()
