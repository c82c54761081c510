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


def test_unknown_names_are_judged_on_the_settings_given():
    given = S.read({S.DISABLE: "no_such_patch"})
    assert S.unknown_names({"real_patch"}, given) == {S.DISABLE: ["no_such_patch"]}
