"""eagle3_draft_config_fields: a draft config field that changes the draft's math and that the installed release
never reads is refused once, in the launcher, before anything loads; stock sglang serves the draft without it.

On the real launcher (``ServerArgs`` resolved as ``launch_server`` resolves it) with the tiny Kimi-K2.5 target and
drafts whose configs set each field; which fields the installed release reads comes from its own source."""

from __future__ import annotations

import json
import shutil

import pytest

from eagle3_patches.checkpoint import draft_fields as F
from eagle3_patches.selftest.scenarios import launcher_outcomes
from eagle3_patches.testing.isolation import run_isolated

pytestmark = pytest.mark.sglang


def _installed_reads() -> frozenset[str]:
    found = F.installed_source()
    assert found is not None
    return F.fields_read(found[1])


@pytest.fixture(scope="module")
def drafts(tiny, tmp_path_factory):
    """A draft per field set true, plus the tiny draft as it is: name -> (target, draft, algorithm)."""
    root = tmp_path_factory.mktemp("draft-fields")
    out = {"plain": (str(tiny["kimi_k25"]), str(tiny["draft"]), "EAGLE3")}
    for name in F.candidate_names():
        d = root / name
        shutil.copytree(tiny["draft"], d)
        config = json.loads((d / "config.json").read_text())
        field = name.removeprefix(F.EAGLE_CONFIG + ".")
        block = config.setdefault(F.EAGLE_CONFIG, {}) if name.startswith(F.EAGLE_CONFIG) else config
        block[field] = True
        (d / "config.json").write_text(json.dumps(config))
        out[name] = (str(tiny["kimi_k25"]), str(d), "EAGLE3")
    return out


def _backported() -> frozenset[str]:
    """The fields eagle3_draft_norms makes the draft read on the installed release (none where it does not apply)."""
    from support.releases import sglang_version

    from eagle3_patches.patches.eagle3_draft_norms import PATCH as NORMS

    return NORMS.backports_draft_fields if NORMS.covers(sglang_version()) else frozenset()


@pytest.fixture(scope="module")
def without_backport(drafts):
    """The patch set with eagle3_draft_norms switched off."""
    from eagle3_patches.patches import get_registry

    return run_isolated(
        launcher_outcomes, drafts, patches=[n for n in get_registry().names() if n != "eagle3_draft_norms"]
    )


@pytest.fixture(scope="module")
def stock(drafts):
    return run_isolated(launcher_outcomes, drafts, patches=None)


@pytest.fixture(scope="module")
def patched(drafts):
    return run_isolated(launcher_outcomes, drafts, patches="all")


@pytest.mark.stock
def test_stock_launches_a_draft_whose_fields_it_never_reads(stock):
    unread = [n for n in F.candidate_names() if n not in _installed_reads()]
    assert unread  # every release up to the newest observed ignores norm_before_residual
    for name in unread:
        assert stock[name] == ("ok", "EAGLE3"), name


@pytest.mark.runtime_only
def test_patched_refuses_each_field_the_release_never_reads_naming_the_first_that_does(patched):
    """With the backport in the set, the fields it implements are read; the others (norm_before_residual on every
    release) are refused."""
    read = _installed_reads() | _backported()
    assert "norm_before_residual" not in read
    for name in F.candidate_names():
        if name in read:
            assert patched[name] == ("ok", "EAGLE3"), name
            continue
        kind, message = patched[name]
        assert kind == "Eagle3ConfigError", (name, kind, message)
        assert f"config.json: {name}" in message and "never reads" in message
        assert F.first_reading(name) in message


@pytest.mark.runtime_only
def test_without_the_backport_its_fields_are_refused_where_the_release_never_reads_them(without_backport):
    read = _installed_reads()
    unread = [n for n in F.candidate_names() if n not in read]
    assert set(_backported()) <= set(unread) | read
    for name in F.candidate_names():
        expected = "ok" if name in read else "Eagle3ConfigError"
        assert without_backport[name][0] == expected, (name, without_backport[name])


@pytest.mark.runtime_only
def test_patched_lets_a_draft_without_such_fields_through(patched):
    assert patched["plain"] == ("ok", "EAGLE3")


@pytest.mark.runtime_only
def test_a_lowercase_eagle3_is_checked_too(drafts):
    """sglang upper-cases the algorithm's name (``SpeculativeAlgorithm.from_string``): ``sglang.Engine(
    speculative_algorithm="eagle3")`` serves the draft as EAGLE-3, so its unread fields are refused under that
    spelling too."""
    target, draft, _ = drafts["norm_before_residual"]
    cases = {"unread": (target, draft, "eagle3"), "plain": (target, drafts["plain"][1], "eagle3")}
    out = run_isolated(launcher_outcomes, cases, patches=["eagle3_draft_config_fields"])
    kind, message = out["unread"]
    assert kind == "Eagle3ConfigError", out["unread"]
    assert "config.json: norm_before_residual" in message and "never reads" in message
    # a draft without such fields goes through under either spelling (some releases upper-case it in ServerArgs)
    assert out["plain"][0] == "ok" and out["plain"][1].upper() == "EAGLE3", out["plain"]


# -- no sglang: what the refusal and the doctor say ---------------------------------------------------------
def test_the_readers_of_one_field_and_of_fields_no_release_reads():
    from eagle3_patches.patches.eagle3_draft_config_fields import readers

    assert readers([]) == ""
    one = readers(["norm_output"])
    assert one.startswith("carries the draft norms norm_output: read by sglang >= 0.5.12")
    both = readers(["norm_output", "norm_before_residual"])  # one never read: no release reads them all
    assert "read by no sglang release up to 0.5.23" in both and "sglang >= 0.5.12" not in both


def test_only_the_fields_asked_about_are_reported():
    from eagle3_patches.patches.eagle3_draft_config_fields import ignored_fields

    config = {"norm_output": True, "norm_before_residual": True}
    kw = dict(version="0.5.9", source="x", config_path="d/config.json")
    assert {d.where for d in ignored_fields(config, frozenset(), **kw)} == {
        "d/config.json: norm_output",
        "d/config.json: norm_before_residual",
    }
    only = ignored_fields(config, frozenset(), among=["norm_output"], **kw)
    assert [d.where for d in only] == ["d/config.json: norm_output"]
