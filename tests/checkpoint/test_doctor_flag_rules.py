"""The doctor's per-release rules for the speculative flags (``doctor/flag_rules.py``): each fires on its bad flags
on a release in its range, stays silent on the good ones and on a release outside its range; and each one's claim
is shown on the installed sglang's real ``ServerArgs`` (and draft-tree code), on CPU in an isolated process."""

from __future__ import annotations

import dataclasses

import pytest
from packaging.version import Version
from support.releases import sglang_version

from eagle3_patches.checkpoint.launch_args import parse_launch_args
from eagle3_patches.diagnostic import ERROR, INFO, WARNING
from eagle3_patches.doctor import doctor
from eagle3_patches.doctor.flag_rules import BY_CODE, RULES, SPEC_V2, env_bool, rules_table, spec_flags
from eagle3_patches.sglang_version import base_release
from eagle3_patches.testing.isolation import run_isolated


def launch(*flags: str, env: str = "") -> str:
    return f"{env} python -m sglang.launch_server --speculative-algorithm EAGLE3 {' '.join(flags)}".strip()


def codes(version: str, command: str) -> dict[str, object]:
    r = doctor(None, None, sglang_version=version, launch=command)
    return {f.code: f for f in r.findings if f.code.startswith("spec-")}


@pytest.fixture(autouse=True)
def _no_spec_v2_here(monkeypatch):
    monkeypatch.delenv(SPEC_V2, raising=False)


def steps(n, k, d):
    return (
        "--speculative-num-steps",
        str(n),
        "--speculative-eagle-topk",
        str(k),
        "--speculative-num-draft-tokens",
        str(d),
    )


# code -> (bad launch, good launch, a release in range, a release outside it (None: every release))
CASES = {
    "spec-v2-topk-refused": (
        launch(*steps(3, 4, 8), env=f"{SPEC_V2}=1"),
        launch(*steps(3, 1, 4), env=f"{SPEC_V2}=1"),
        "0.5.10.post1",
        "0.5.11",
    ),
    "spec-overlap-forced-on": (
        launch(*steps(3, 1, 4), "--disable-overlap-schedule", env=f"{SPEC_V2}=true"),
        launch(*steps(3, 1, 4), "--disable-overlap-schedule"),
        "0.5.9",
        "0.5.11",
    ),
    "spec-v1-fallback": (
        launch(*steps(3, 4, 8)),
        launch(*steps(3, 4, 8), "--disable-overlap-schedule"),
        "0.5.12",
        "0.5.13",
    ),
    "spec-draft-tokens-exceed-tree": (
        launch(*steps(3, 4, 38)),  # the tree holds 4 + 2 x 16 = 36: at most 37
        launch(*steps(3, 4, 37)),
        "0.5.23",
        None,
    ),
    "spec-draft-tokens-overridden": (
        launch(*steps(3, 1, 8)),
        launch(*steps(3, 1, 4)),
        "0.5.9",
        None,
    ),
}


def test_every_rule_has_its_cases_and_its_source():
    assert set(CASES) == set(BY_CODE)
    for rule in RULES:
        assert rule.source.startswith("srt/") and "(0.5." in rule.source, rule.code


@pytest.mark.parametrize("code", sorted(CASES))
def test_a_rule_fires_on_its_flags_in_its_releases(code):
    bad, _good, inside, _outside = CASES[code]
    f = codes(inside, bad).get(code)
    assert f is not None, codes(inside, bad)
    rule = BY_CODE[code]
    assert f.severity == rule.severity and f.where == rule.flag and rule.flag in f.fix
    assert f.found and f.expected and f.what.endswith(f"(sglang {base_release(Version(inside))})")


@pytest.mark.parametrize("code", sorted(CASES))
def test_a_rule_is_silent_on_good_flags(code):
    _bad, good, inside, _outside = CASES[code]
    assert code not in codes(inside, good)


@pytest.mark.parametrize("code", [c for c, case in sorted(CASES.items()) if case[3]])
def test_a_rule_is_silent_on_a_release_outside_its_range(code):
    bad, _good, _inside, outside = CASES[code]
    assert code not in codes(outside, bad)
    assert not BY_CODE[code].applies(Version(outside))


def test_the_severities_say_what_sglang_does():
    assert BY_CODE["spec-v2-topk-refused"].severity == ERROR  # refused at start
    assert BY_CODE["spec-draft-tokens-exceed-tree"].severity == ERROR  # fails after loading
    assert BY_CODE["spec-overlap-forced-on"].severity == WARNING
    assert BY_CODE["spec-draft-tokens-overridden"].severity == WARNING
    assert BY_CODE["spec-v1-fallback"].severity == INFO


# ------------------------------------------------------------------------------------------------ the predicates' edges
@pytest.mark.parametrize(
    "n, k, d, fires",
    [(3, 4, 37, False), (3, 4, 38, True), (1, 8, 9, False), (1, 8, 10, True), (5, 2, 19, False), (5, 2, 20, True)],
)
def test_the_tree_bound_is_topk_plus_steps_minus_one_times_topk_squared(n, k, d, fires):
    assert ("spec-draft-tokens-exceed-tree" in codes("0.5.9", launch(*steps(n, k, d)))) is fires


def test_the_tree_finding_names_the_largest_number_that_starts():
    f = codes("0.5.9", launch(*steps(3, 4, 64)))["spec-draft-tokens-exceed-tree"]
    assert f.expected == "--speculative-num-draft-tokens at most 37"
    assert f.fix.startswith("pass --speculative-num-draft-tokens 37 or less,")
    assert "36 candidates" in f.what and "63 of them" in f.what


@pytest.mark.parametrize("d, fires", [(2, True), (4, False), (5, True), (8, True)])
def test_the_override_fires_on_any_other_number_than_steps_plus_one(d, fires):
    found = codes("0.5.9", launch(*steps(3, 1, d)))
    assert ("spec-draft-tokens-overridden" in found) is fires
    assert "spec-draft-tokens-exceed-tree" not in found  # a chain: sglang overrides the number, nothing fails


def test_the_override_names_what_the_server_runs_with():
    f = codes("0.5.23", launch(*steps(3, 1, 8)))["spec-draft-tokens-overridden"]
    assert "steps + 1 = 4" in f.what and "not the 8 asked for" in f.what
    assert f.fix.startswith("pass --speculative-num-draft-tokens 4")


@pytest.mark.parametrize(
    "flags",
    [
        ("--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "8"),  # steps left to sglang
        ("--speculative-num-steps", "3", "--speculative-eagle-topk", "1"),  # draft tokens left to sglang
        ("--speculative-num-steps", "3", "--speculative-num-draft-tokens", "64"),  # topk left to sglang
        ("--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "64"),  # a tree, steps left to sglang
        (),
    ],
)
def test_values_left_to_sglang_are_not_judged(flags):
    r = doctor(None, None, sglang_version="0.5.9", launch=launch(*flags))
    assert not [f for f in r.findings if f.code.startswith("spec-") or f.code == "internal-error"], r.format()


@pytest.mark.parametrize("topk", [2, 4])
def test_topk_above_one_under_spec_v2_is_refused_not_judged_as_an_ignored_overlap_flag(topk):
    found = codes("0.5.9", launch(*steps(3, topk, 8), "--disable-overlap-schedule", env=f"{SPEC_V2}=1"))
    assert "spec-v2-topk-refused" in found and "spec-overlap-forced-on" not in found


def test_topk_above_one_with_spec_v2_switched_off_is_what_was_asked_for():
    assert "spec-v1-fallback" not in codes("0.5.12", launch(*steps(3, 4, 8), env=f"{SPEC_V2}=0"))


def test_the_rules_judge_eagle_launches_only():
    command = f"{SPEC_V2}=1 python -m sglang.launch_server --speculative-algorithm NGRAM " + " ".join(steps(3, 4, 64))
    assert codes("0.5.9", command) == {}


@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3", "NEXTN"])
def test_every_eagle_family_algorithm_is_judged(algorithm):
    """sglang resolves the flags alike for EAGLE, EAGLE3 and NEXTN (NEXTN becomes EAGLE)."""
    command = f"python -m sglang.launch_server --speculative-algorithm {algorithm} " + " ".join(steps(3, 1, 8))
    assert "spec-draft-tokens-overridden" in codes("0.5.9", command)


@pytest.mark.parametrize(("version", "code"), [("0.5.10", "spec-v2-topk-refused"), ("0.5.12", "spec-v1-fallback")])
@pytest.mark.parametrize(("topk", "fires"), [(1, False), (2, True), (3, True)])
def test_a_tree_starts_at_topk_2_for_the_spec_v2_rules(version, code, topk, fires):
    found = codes(version, launch(*steps(3, topk, topk + 1), env=f"{SPEC_V2}=1"))
    assert (code in found) is fires
    if fires:
        assert f"--speculative-eagle-topk {topk}" in found[code].found


def test_a_tree_without_spec_v2_is_not_refused():
    """0.5.10 with spec v2 off (its default) runs the spec v1 worker, which takes a tree."""
    assert "spec-v2-topk-refused" not in codes("0.5.10", launch(*steps(3, 4, 8)))
    assert "spec-v2-topk-refused" not in codes("0.5.10", launch(*steps(3, 4, 8), env=f"{SPEC_V2}=0"))


@pytest.mark.parametrize(
    ("n", "k", "tree"), [(3, 1, 3), (1, 1, 1), (3, 4, 36), (1, 8, 8), (0, 4, None), (3, 0, None), (None, 4, None)]
)
def test_the_tree_size_is_the_candidates_a_draft_tree_holds(n, k, tree):
    f = spec_flags(parse_launch_args(launch()), Version("0.5.9"))
    assert dataclasses.replace(f, num_steps=n, topk=k).tree_size == tree
    assert dataclasses.replace(f, num_steps=3, topk=None).tree_size is None


@pytest.mark.parametrize(
    ("given", "release"),
    [("0.5.10.post1", "0.5.10"), ("0.6", "0.6.0"), ("1", "1.0.0"), ("0.5.9.1", "0.5.9"), ("0.5.13rc1", "0.5.13")],
)
def test_a_version_is_judged_and_named_as_its_release(given, release):
    assert str(base_release(Version(given))) == release
    f = codes(given, launch(*steps(3, 1, 8)))["spec-draft-tokens-overridden"]
    assert f.what.endswith(f"(sglang {release})")


def test_the_rules_cannot_be_changed_by_a_caller():
    """The rule table is shared by every doctor run (and the docs); the flags and findings are values."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        RULES[0].severity = INFO  # type: ignore[misc]
    f = spec_flags(parse_launch_args(launch()), Version("0.5.9"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.topk = 4  # type: ignore[misc]
    finding = BY_CODE["spec-draft-tokens-overridden"].judge(dataclasses.replace(f, num_steps=3, topk=1, draft_tokens=8))
    assert finding is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        finding.fix = ""  # type: ignore[misc]


# ------------------------------------------------------------------------------------------------ SGLANG_ENABLE_SPEC_V2
@pytest.mark.parametrize(
    "value, parsed",
    [
        ("1", True),
        ("true", True),
        ("YES", True),
        ("y", True),
        ("0", False),
        ("False", False),
        ("no", False),
        ("N", False),
        ("maybe", None),
        ("", None),
        (None, None),
    ],
)
def test_the_variable_is_read_as_sglangs_env_bool_reads_it(value, parsed):
    assert env_bool(value) is parsed


def test_a_value_sglang_does_not_read_is_not_taken_for_on():
    f = spec_flags(parse_launch_args(launch(env=f"{SPEC_V2}=maybe")), Version("0.5.9"))
    assert f.spec_v2 is False and "'maybe' in the launch command is not a boolean" in f.spec_v2_from
    f = spec_flags(parse_launch_args(launch(env=f"{SPEC_V2}={'x' * 30}")), Version("0.5.9"))
    assert (
        f.spec_v2_from
        == f"sglang 0.5.9's default ({SPEC_V2} {'x' * 20!r} in the launch command is not a boolean " + ("sglang reads)")
    )


@pytest.mark.parametrize(
    "version, on", [("0.5.9", False), ("0.5.10.post1", False), ("0.5.11", True), ("0.5.13rc1", True)]
)
def test_spec_v2_unset_is_the_releases_default(version, on):
    f = spec_flags(parse_launch_args(launch()), Version(version))
    assert f.spec_v2 is on and "default" in f.spec_v2_from


def test_the_launch_commands_assignment_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv(SPEC_V2, "1")
    assert spec_flags(parse_launch_args(launch()), Version("0.5.9")).spec_v2 is True  # inherited
    f = spec_flags(parse_launch_args(launch(env=f"env {SPEC_V2}=false")), Version("0.5.9"))
    assert f.spec_v2 is False and f.spec_v2_from == f"{SPEC_V2}=false in the launch command"


def test_a_wrapped_launch_keeps_its_assignments():
    la = parse_launch_args(f"eagle3-patches run -- {SPEC_V2}=yes python -m sglang.launch_server --tp 8")
    assert la.with_patches and la.env == {SPEC_V2: "yes"} and la.tp == 8


def test_the_doc_table_is_the_rule_table():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "doctor.md").read_text(encoding="utf-8")
    assert rules_table() in page
    for rule in RULES:
        assert f"| `{rule.code}` | {rule.severity} |" in page


# ------------------------------------------------------------------------------------------------ on the real sglang
def _spellings_parsed_by_sglang(argv: list[str]) -> dict:
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns, _ = parser.parse_known_args(argv)
    return {
        k: getattr(ns, k)
        for k in (
            "speculative_num_steps",
            "speculative_eagle_topk",
            "speculative_num_draft_tokens",
            "disable_overlap_schedule",
        )
    }


def test_the_flags_are_spelled_as_sglangs_parser_spells_them():
    argv = [*steps(5, 2, 9), "--disable-overlap-schedule", "--model-path", "m"]
    sglang = run_isolated(_spellings_parsed_by_sglang, argv)
    la = parse_launch_args(argv)
    assert (
        sglang
        == {
            "speculative_num_steps": la.num_steps,
            "speculative_eagle_topk": la.eagle_topk,
            "speculative_num_draft_tokens": la.num_draft_tokens,
            "disable_overlap_schedule": la.disable_overlap_schedule,
        }
        == {
            "speculative_num_steps": 5,
            "speculative_eagle_topk": 2,
            "speculative_num_draft_tokens": 9,
            "disable_overlap_schedule": True,
        }
    )


def _resolve(target: str, draft: str, cases: list) -> list:
    """Each (environment, ServerArgs overrides) resolved as the launcher resolves it: ("raised", type, message) or
    ("ok", steps, topk, draft tokens, disable_overlap_schedule)."""
    import os

    from eagle3_patches.testing import sglang_harness as h
    from eagle3_patches.testing.sglang_eras import current as era

    out = []
    for env, kw in cases:
        os.environ.pop(SPEC_V2, None)
        os.environ.update(env)
        try:
            sa = era().resolved(h.launcher_server_args(h.eagle3_server_args, target, draft, **kw))
        except Exception as exc:  # noqa: BLE001 - what sglang raises is the outcome
            out.append(("raised", type(exc).__name__, str(exc)))
            continue
        out.append(
            (
                "ok",
                sa.speculative_num_steps,
                sa.speculative_eagle_topk,
                sa.speculative_num_draft_tokens,
                sa.disable_overlap_schedule,
            )
        )
    return out


def _kw(n, k, d, disable_overlap=False):
    return dict(
        speculative_num_steps=n,
        speculative_eagle_topk=k,
        speculative_num_draft_tokens=d,
        disable_overlap_schedule=disable_overlap,
    )


#: name -> (environment, ServerArgs overrides): every combination the rules' claims are shown on
SGLANG_CASES = {
    "v2 topk4": ({SPEC_V2: "1"}, _kw(3, 4, 8)),
    "v2 topk1 no-overlap": ({SPEC_V2: "1"}, _kw(3, 1, 4, disable_overlap=True)),
    "topk4": ({}, _kw(3, 4, 8)),
    "topk1": ({}, _kw(3, 1, 4)),
    "topk4 past the tree": ({}, _kw(3, 4, 38)),
    "topk1 eight tokens": ({}, _kw(3, 1, 8)),
}


@pytest.fixture(scope="module")
def resolved(tiny):
    out = run_isolated(_resolve, str(tiny["kimi_k25"]), str(tiny["draft"]), list(SGLANG_CASES.values()))
    return dict(zip(SGLANG_CASES, out))


INSTALLED = sglang_version()


def in_range(code: str) -> bool:
    if INSTALLED is None:
        pytest.skip("sglang is not installed")
    return BY_CODE[code].applies(Version(str(INSTALLED)))


def test_sglang_refuses_topk_above_one_under_spec_v2_where_the_rule_says(resolved):
    outcome = resolved["v2 topk4"]
    if in_range("spec-v2-topk-refused"):
        assert outcome[0] == "raised" and "only supports topk = 1" in outcome[2]
    else:  # the later releases take it
        assert outcome[0] == "ok" and outcome[2] == 4, outcome


def test_sglang_ignores_disable_overlap_schedule_under_spec_v2_where_the_rule_says(resolved):
    outcome = resolved["v2 topk1 no-overlap"]
    assert outcome[0] == "ok", outcome
    assert outcome[4] is (not in_range("spec-overlap-forced-on"))  # in range: overlap back on; later: kept off


def test_sglang_turns_the_overlap_scheduler_off_for_topk_above_one_where_the_rule_says(resolved):
    tree, chain = resolved["topk4"], resolved["topk1"]
    assert tree[0] == chain[0] == "ok", (tree, chain)
    if in_range("spec-v1-fallback"):
        assert tree[4] is True and chain[4] is False
    else:  # topk does not decide the scheduler (off for both before spec v2 was the default; the same after)
        assert tree[4] == chain[4]


def test_sglang_starts_with_more_draft_tokens_than_the_tree_holds(resolved):
    if not in_range("spec-draft-tokens-exceed-tree"):
        pytest.skip(f"sglang {INSTALLED} is outside the rule's releases")
    assert resolved["topk4 past the tree"] == ("ok", 3, 4, 38, resolved["topk4"][4])  # accepted as given


def _tree(cases: list) -> list:
    """For each (steps, topk, draft tokens): the candidates sglang's draft tree holds, built step by step as the
    draft's forward builds it (``select_top_k_tokens``), and what ``organize_draft_results`` does with them."""
    import torch
    from sglang.srt.speculative.eagle_utils import organize_draft_results
    from sglang.srt.speculative.spec_utils import select_top_k_tokens

    torch.manual_seed(0)
    out = []
    for num_steps, topk, draft_tokens in cases:
        bs, vocab = 2, 64
        topk_p, topk_index = torch.softmax(torch.randn(bs, vocab), -1).topk(topk)
        hidden, scores, lists = torch.zeros(bs, 8), None, ([], [], [])
        for i in range(num_steps):
            _ids, hidden, scores, info = select_top_k_tokens(i, topk_p, topk_index, hidden, scores, topk)
            for acc, part in zip(lists, info):
                acc.append(part)
            topk_p, topk_index = torch.softmax(torch.randn(bs * topk, vocab), -1).topk(topk)
        pool = torch.cat(lists[0], dim=1).flatten(1).shape[1]
        try:
            organize_draft_results(*lists, draft_tokens)
            out.append((pool, "ok"))
        except RuntimeError as exc:
            out.append((pool, f"RuntimeError: {exc}"))
    return out


def test_sglangs_draft_tree_fails_past_the_bound_the_rule_computes():
    if not in_range("spec-draft-tokens-exceed-tree"):
        pytest.skip(f"sglang {INSTALLED} is outside the rule's releases")
    shapes = [(3, 4), (1, 8), (5, 2), (2, 3)]
    cases = [(n, k, d) for n, k in shapes for d in (k + (n - 1) * k * k + 1, k + (n - 1) * k * k + 2)]
    results = run_isolated(_tree, cases)
    for (n, k, d), (pool, outcome) in zip(cases, results):
        bound = spec_flags(parse_launch_args(launch(*steps(n, k, d))), Version(str(INSTALLED))).tree_size
        assert pool == bound
        assert (outcome == "ok") is (d - 1 <= bound), (n, k, d, outcome)


def test_sglang_sets_the_draft_tokens_to_steps_plus_one_with_topk_one(resolved):
    if not in_range("spec-draft-tokens-overridden"):
        pytest.skip(f"sglang {INSTALLED} is outside the rule's releases")
    assert resolved["topk1 eight tokens"][:4] == ("ok", 3, 1, 4)
    assert resolved["topk1"][:4] == ("ok", 3, 1, 4)
