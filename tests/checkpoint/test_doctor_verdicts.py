"""The doctor judges the launch the user will run: with eagle3-patches when the launch is wrapped in
``eagle3-patches run`` or the installed sglang loads this package as a plugin, stock sglang when the launch says
so, and both verdicts where it cannot know (bare flags); its findings listed root cause first."""

from __future__ import annotations

import json

import pytest
from packaging.version import Version

from eagle3_patches import settings
from eagle3_patches.diagnostic import ERROR, Diagnostic
from eagle3_patches.doctor import doctor
from eagle3_patches.doctor import run as doctor_run
from eagle3_patches.doctor.report import CONSEQUENCE, Report, consequence
from eagle3_patches.plugin import ENTRY_POINT

#: on sglang 0.5.9 stock, a correct Kimi-K2.5 pair at tp 8 fails on three bugs eagle3-patches fixes
FIXED_ON_059 = ["kimi-k25-delegation", "cuda-graph-capture-order", "tp-allreduce-fusion"]


def kimi_flags(tiny, *extra: str) -> list[str]:
    return [
        "--model-path",
        str(tiny["kimi_k25"]),
        "--speculative-draft-model-path",
        str(tiny["draft"]),
        "--tp-size",
        "2",
        "--speculative-algorithm",
        "EAGLE3",
        *extra,
    ]


# ------------------------------------------------------------------------------------------------ which launch
def test_bare_flags_give_both_verdicts_and_exit_by_stock_sglangs(tiny, cli):
    rc, out, err = cli("doctor", "--sglang-version", "0.5.9", "--", *kimi_flags(tiny))
    assert rc == 1, out + err
    assert "stock sglang or eagle3-patches (not known from the flags: both verdicts below)" in out
    assert "FAIL on stock sglang: 3 error(s)" in out
    assert "OK with eagle3-patches: 0 error(s)" in out
    assert "  fixed by eagle3-patches: " + ", ".join(FIXED_ON_059) in out
    assert "--with-patches judges that launch and exits by it" in out


def test_bare_flags_json_carries_the_verdict_with_eagle3_patches(tiny, cli):
    rc, out, _ = cli("doctor", "--json", "--sglang-version", "0.5.9", "--", *kimi_flags(tiny))
    report = json.loads(out)
    assert (rc, report["ok"], report["facts"]["with_patches"]) == (1, False, None)
    assert sorted(f["code"] for f in report["findings"] if f["severity"] == ERROR) == sorted(FIXED_ON_059)
    assert report["with_patches"]["ok"] is True and report["with_patches"]["exit_code"] == 0
    assert not [f for f in report["with_patches"]["findings"] if f["severity"] == ERROR]


def test_with_patches_said_judges_that_launch_and_exits_by_it(tiny, cli):
    rc, out, err = cli("doctor", "--with-patches", "--sglang-version", "0.5.9", "--", *kimi_flags(tiny))
    assert rc == 0, out + err
    assert ", with eagle3-patches\n" in out and "on stock sglang" not in out


def test_without_patches_said_judges_stock_sglang_alone(tiny, cli):
    rc, out, _ = cli("doctor", "--without-patches", "--sglang-version", "0.5.9", "--", *kimi_flags(tiny))
    assert rc == 1
    assert ", stock sglang (no eagle3-patches)\n" in out and "with eagle3-patches:" not in out


def test_a_launch_wrapped_in_eagle3_patches_run_is_judged_with_them(tiny):
    launch = ["eagle3-patches", "run", "--", "python", "-m", "sglang.launch_server", *kimi_flags(tiny)]
    r = doctor(sglang_version="0.5.9", launch=launch)
    assert (r.exit_code, r.with_patches, r.facts["with_patches"]) == (0, None, True)
    assert "with eagle3-patches (the launch is wrapped in `eagle3-patches run`)" in r.format()


def test_a_whole_launch_command_not_wrapped_is_judged_stock(tiny):
    r = doctor(sglang_version="0.5.9", launch=["python", "-m", "sglang.launch_server", *kimi_flags(tiny)])
    assert (r.exit_code, r.with_patches, r.facts["with_patches"]) == (1, None, False)
    assert sorted(r.codes(ERROR)) == sorted(FIXED_ON_059)
    assert (
        "stock sglang (no eagle3-patches: the launch runs python -m sglang.launch_server without "
        "`eagle3-patches run`)" in r.format()
    )


@pytest.fixture
def installed(monkeypatch):
    """The doctor's view of the installed sglang set to a release; this package's plugin entry point as given."""

    def set_up(version: str, *, entry_point: bool = True) -> None:
        monkeypatch.setattr(doctor_run, "installed_sglang_version", lambda: Version(version))
        if not entry_point:
            import importlib.metadata

            real = importlib.metadata.entry_points
            monkeypatch.setattr(
                importlib.metadata,
                "entry_points",
                lambda **kw: [ep for ep in real(**kw) if ep.name != ENTRY_POINT],
            )

    yield set_up
    settings.reload()


def test_installed_sglang_that_loads_the_plugin_is_judged_with_eagle3_patches(tiny, installed, monkeypatch):
    installed("0.5.11")
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    monkeypatch.delenv(settings.PLUGIN, raising=False)
    settings.reload()
    r = doctor(launch=kimi_flags(tiny))
    assert (r.facts["with_patches"], r.with_patches) == (True, None)
    assert "sglang 0.5.11 loads eagle3-patches as a plugin here" in r.facts["with_patches_source"]


@pytest.mark.parametrize(
    "version, env, entry_point",
    [
        ("0.5.10", {}, True),  # no plugin mechanism before 0.5.11
        ("0.5.11", {settings.PLUGIN: "0"}, True),  # switched off
        ("0.5.11", {"SGLANG_PLUGINS": "someone_else"}, True),  # sglang's allow-list leaves it out
        ("0.5.11", {"SGLANG_PLUGINS": " "}, True),  # set, so an allow-list, of no name: sglang loads no plugin
        ("0.5.11", {"SGLANG_PLUGINS": " , "}, True),
        ("0.5.11", {}, False),  # not installed as a package (a checkout on sys.path)
    ],
)
def test_where_the_plugin_is_not_loaded_bare_flags_stay_undecided(
    tiny, installed, monkeypatch, version, env, entry_point
):
    installed(version, entry_point=entry_point)
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    monkeypatch.delenv(settings.PLUGIN, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    settings.reload()
    r = doctor(launch=kimi_flags(tiny))
    assert r.facts["with_patches"] is None and r.with_patches is not None


def test_a_version_given_for_another_machine_never_reads_this_machines_plugin(tiny, installed):
    installed("0.5.11")
    r = doctor(sglang_version="0.5.11", launch=kimi_flags(tiny))
    assert r.facts["with_patches"] is None


# ------------------------------------------------------------------------------------------------ the order
def test_the_wrong_algorithm_is_listed_first_of_the_errors(tiny):
    flags = kimi_flags(tiny)
    flags[flags.index("EAGLE3")] = "EAGLE"
    r = doctor(sglang_version="0.5.9", launch=flags, with_patches=False)
    errors = [line for line in r.format().splitlines() if line.startswith("ERROR")]
    assert errors[0].startswith("ERROR   [algorithm-eagle-with-eagle3-draft]"), errors
    assert len(errors) == 4
    assert json.loads(r.to_json())["findings"][0]["code"] == "algorithm-eagle-with-eagle3-draft"


def test_findings_are_ordered_by_severity_then_consequence_then_as_found():
    r = Report()
    for code in ("dtype-mismatch", "keys-unknown", "aux-ids-missing", "tp-draft-split", "algorithm-not-eagle"):
        r.add(ERROR, code, code)
    r.add("warning", "algorithm-eagle3-without-draft", "w")
    r.add(ERROR, "aux-ids-count", "second of its rank")
    assert [f.code for f in r.ordered()] == [
        "algorithm-not-eagle",
        "tp-draft-split",
        "aux-ids-missing",
        "aux-ids-count",
        "keys-unknown",
        "dtype-mismatch",
        "algorithm-eagle3-without-draft",
    ]


@pytest.mark.parametrize("rank, prefixes", list(enumerate(CONSEQUENCE)))
def test_each_consequence_rank_is_found_by_its_prefixes(rank, prefixes):
    assert {consequence(p + "x") for p in prefixes} == {rank}
    assert consequence("something-else") == len(CONSEQUENCE)


def test_a_report_fork_continues_apart_from_its_parent():
    r = Report()
    r.add(ERROR, "a", "a")
    child = r.fork(facts={"with_patches": True})
    child.add_diagnostic(Diagnostic(ERROR, "b", "b"))
    assert (r.codes(), child.codes(), child.facts) == (["a"], ["a", "b"], {"with_patches": True})


# ------------------------------------------------------------------------------------------------ the doc example
def _gen_docs():
    import importlib.util
    from pathlib import Path

    tool = Path(__file__).resolve().parents[2] / "tools" / "gen_docs.py"
    spec = importlib.util.spec_from_file_location("gen_docs_under_test", tool)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_report_in_docs_doctor_md_is_what_the_doctor_prints(tiny):
    tool = _gen_docs()
    page = tool.DOCTOR_PAGE.read_text(encoding="utf-8")
    fresh = tool.with_doctor_example(page, tiny["kimi_k25"], tiny["draft"])
    assert tool.same_but_timing(fresh, page), "docs/doctor.md's example is stale: run python tools/gen_docs.py"
    assert "FAIL on stock sglang" in fresh and str(tiny["kimi_k25"].parent) not in fresh


def test_a_hand_edited_example_is_found_stale(tiny):
    tool = _gen_docs()
    page = tool.DOCTOR_PAGE.read_text(encoding="utf-8").replace("FAIL on stock sglang: 4", "FAIL on stock sglang: 3")
    assert not tool.same_but_timing(tool.with_doctor_example(page, tiny["kimi_k25"], tiny["draft"]), page)


def test_sglang_plugins_listing_it_among_others_with_spaces_loads_it(tiny, installed, monkeypatch):
    installed("0.5.11")
    monkeypatch.delenv(settings.PLUGIN, raising=False)
    monkeypatch.setenv("SGLANG_PLUGINS", " someone_else , eagle3_patches ")
    settings.reload()
    assert doctor(launch=kimi_flags(tiny)).facts["with_patches"] is True


def test_a_single_fix_is_named_as_fixed(tiny):
    """On 0.5.9 the DeepSeek-V3 pair at tp 1 fails stock on the CUDA-graph capture order alone."""
    r = doctor(tiny["deepseek_v3"], tiny["draft"], sglang_version="0.5.9", launch=["--speculative-algorithm", "EAGLE3"])
    assert r.codes(ERROR) == ["cuda-graph-capture-order"]
    assert "  fixed by eagle3-patches: cuda-graph-capture-order" in r.format().splitlines()


def test_the_json_form_takes_its_indent():
    r = Report()
    r.add(ERROR, "a", "a")
    assert "\n" not in r.to_json(indent=None) and "\n" in r.to_json()


def test_the_algorithm_argument_is_read_as_sglang_reads_the_flag(tiny):
    r = doctor(tiny["deepseek_v3"], tiny["draft"], sglang_version="0.5.9", speculative_algorithm=" eagle3 ")
    assert r.facts["algorithm"] == "EAGLE3"
    with pytest.raises(ValueError, match="unknown speculative algorithm 'MEDUSA'"):
        doctor(tiny["deepseek_v3"], tiny["draft"], sglang_version="0.5.9", speculative_algorithm="MEDUSA")


def test_the_converters_check_gives_one_verdict_for_the_setup_it_is_given(tiny):
    from eagle3_patches.doctor import check_draft

    r = check_draft(tiny["draft"], target=tiny["kimi_k25"], sglang_version="0.5.13", with_patches=True)
    assert r.with_patches is None  # the checkpoints alone: no launch, so no second verdict
    assert (r.facts["sglang_version"], r.facts["with_patches"]) == ("0.5.13", True)
    assert r.facts["target"].startswith(str(tiny["kimi_k25"]))


def test_checking_the_checkpoints_only_gives_one_verdict(tiny):
    """``--checkpoint-only`` judges no launch, so whether it runs under eagle3-patches does not matter: one verdict,
    where bare flags (the same call without it) give both."""
    only = doctor(tiny["kimi_k25"], tiny["draft"], sglang_version="0.5.9", checkpoint_only=True)
    assert only.with_patches is None and "with_patches" not in only.to_dict()
    both = doctor(tiny["kimi_k25"], tiny["draft"], sglang_version="0.5.9")
    assert both.with_patches is not None and "with_patches" in both.to_dict()
