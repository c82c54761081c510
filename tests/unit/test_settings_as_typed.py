"""Every setting read as an operator types it in a unit file, a shell or a Kubernetes manifest: surrounding spaces and
any case mean the same value, a blank value is unset, and a number outside its range or of the wrong kind is the
default and a problem (never a half-read value)."""

from __future__ import annotations

import pytest

from eagle3_patches import settings as S


def test_names_are_trimmed_and_blanks_dropped():
    assert S.names(" a , ,b;c ") == {"a", "b", "c"}
    assert S.read({S.DISABLE: " kimi_k25_eagle3_delegation , "}).disable == {"kimi_k25_eagle3_delegation"}


@pytest.mark.parametrize("raw", [" Force ", "FORCE", "force"])
def test_a_flags_extra_word_is_read_in_any_case_and_spacing(raw):
    s = S.read({S.CPU_PROFILE: raw})
    assert (s.cpu_profile, s.problems) == ("force", ())


def test_a_blank_flag_is_unset_so_its_default_holds():
    s = S.read({S.PLUGIN: "   ", S.WATCHDOG: " "})
    assert (s.plugin, s.watchdog, s.problems) == (True, True, ())


@pytest.mark.parametrize(
    "env, field, value",
    [
        ({S.PROBE: " /tmp/probe "}, "probe_path", "/tmp/probe"),
        ({S.APPLY: " all "}, "apply", "all"),
        ({S.ON_ERROR: "  "}, "on_error_explicit", False),
        ({S.LAYER_ID_CONVENTION: " input-of-layer "}, "layer_id_convention", "input-of-layer"),
        ({S.DUMP_DIR: " /data/dump "}, "dump_dir", "/data/dump"),
        ({S.DUMP_DIR: "   "}, "dump_dir", None),
        ({S.DUMP_LAYER_IDS: " 2,30,58 "}, "dump_layer_ids", "2,30,58"),
        ({S.SERIES_DIR: "  "}, "series_dir", None),
        ({S.WATCHDOG_WINDOW: "8"}, "watchdog_window", 8),
        ({S.WATCHDOG_WINDOW: " 300 "}, "watchdog_window", 300),
        ({S.WATCHDOG_WINDOW: "   "}, "watchdog_window", 200),
    ],
)
def test_values_are_read_trimmed_and_blank_is_unset(env, field, value):
    s = S.read(env)
    assert (getattr(s, field), s.problems) == (value, ())


@pytest.mark.parametrize(
    "env, field, default",
    [
        ({S.WATCHDOG_WINDOW: "2.5"}, "watchdog_window", 200),  # a whole number of verify steps
        ({S.WATCHDOG_THRESHOLD: "1"}, "watchdog_threshold", 1.05),  # above 1: 1.0 would never fire
        ({S.WATCHDOG_THRESHOLD: "65"}, "watchdog_threshold", 1.05),
    ],
)
def test_a_number_of_the_wrong_kind_or_range_is_the_default_and_a_problem(env, field, default):
    s = S.read(env)
    assert getattr(s, field) == default
    ((var, value),) = env.items()
    assert len(s.problems) == 1 and s.problems[0].startswith(f"{var}={value!r} is not ")


@pytest.mark.parametrize(
    "var, excluded, default",
    [
        # a gain fraction of 0 never warns and of 1 warns on a draft exactly as good as stated: both ends excluded
        ("WATCHDOG_EXPECTED_FRACTION", "0", 0.5),
        ("WATCHDOG_EXPECTED_FRACTION", "1", 0.5),
        ("WATCHDOG_EXPECTED_FRACTION", "1.0", 0.5),
        # an expected accept length of 1 is a draft that never helps: nothing to compare with
        ("EXPECTED_ACCEPT_LENGTH", "1", None),
        ("WATCHDOG_THRESHOLD", "1.0", 1.05),
    ],
)
def test_a_value_at_an_excluded_bound_is_the_default_and_a_problem_naming_the_bound(var, excluded, default):
    name = getattr(S, var)
    s = S.read({name: excluded})
    assert getattr(s, var.lower()) == default
    (problem,) = s.problems
    assert problem.startswith(f"{name}={excluded!r} is not ") and " < " in problem, problem


@pytest.mark.parametrize(
    "var, included, value",
    [
        ("WATCHDOG_EXPECTED_FRACTION", "0.999", 0.999),
        ("WATCHDOG_EXPECTED_FRACTION", "0.001", 0.001),
        ("EXPECTED_ACCEPT_LENGTH", "1.001", 1.001),
        ("EXPECTED_ACCEPT_LENGTH", "64", 64.0),  # a closed end: accepted
        ("EXPECTED_ACCEPT_TEMPERATURE", "0", 0.0),  # greedy: a closed end
        ("WATCHDOG_INTERVAL", "0", 0.0),  # every window: a closed end
    ],
)
def test_a_value_inside_its_range_or_at_a_closed_bound_is_read(var, included, value):
    s = S.read({getattr(S, var): included})
    assert (getattr(s, var.lower()), s.problems) == (value, ())


def test_unknown_names_are_judged_on_the_settings_given():
    given = S.read({S.DISABLE: "no_such_patch"})
    assert S.unknown_names({"real_patch"}, given) == {S.DISABLE: ["no_such_patch"]}
