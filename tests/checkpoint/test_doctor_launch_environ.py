"""The launch's environment decides every verdict that depends on the patch set or a setting: the command's own
assignments (``EAGLE3_PATCHES_DISABLE=... eagle3-patches run -- ...``), what ``eagle3-patches run --disable`` sets,
and the doctor's environment only as the launch inherits it."""

from __future__ import annotations

import shlex

import pytest

from eagle3_patches.diagnostic import ERROR, WARNING
from eagle3_patches.doctor import doctor


def kimi(tiny, *, env: str = "", run: str = "eagle3-patches run -- ", algorithm: str = "EAGLE3") -> str:
    flags = [
        "--model-path",
        str(tiny["kimi_k25"]),
        "--speculative-algorithm",
        algorithm,
        "--speculative-draft-model-path",
        str(tiny["draft"]),
    ]
    return f"{env} {run}python -m sglang.launch_server {shlex.join(flags)}".strip()


def judged(tiny, **kw):
    return doctor(launch=kimi(tiny, **kw), sglang_version="0.5.9")


def test_a_patch_disabled_in_front_of_eagle3_patches_run_is_judged_missing(tiny):
    """``EAGLE3_PATCHES_DISABLE=kimi_k25_eagle3_delegation eagle3-patches run -- ...``: that server runs without the
    delegation, whatever the doctor's own environment says."""
    assert judged(tiny).ok
    r = judged(tiny, env="EAGLE3_PATCHES_DISABLE=kimi_k25_eagle3_delegation")
    assert "kimi-k25-delegation" in r.codes(ERROR) and r.exit_code == 1, r.format()


def test_a_patch_disabled_with_run_disable_is_judged_missing(tiny):
    r = judged(tiny, run="eagle3-patches run --disable kimi_k25_eagle3_delegation -- ")
    assert "kimi-k25-delegation" in r.codes(ERROR), r.format()
    r = judged(tiny, run="eagle3-patches run --only eagle3_fc_guard -- ")
    assert "kimi-k25-delegation" in r.codes(ERROR), r.format()


def test_the_doctors_environment_counts_as_the_launch_inherits_it(tiny, monkeypatch):
    monkeypatch.setenv("EAGLE3_PATCHES_DISABLE", "kimi_k25_eagle3_delegation")
    assert "kimi-k25-delegation" in judged(tiny).codes(ERROR)
    # the command's own assignment wins over what it inherits: blank is unset
    assert judged(tiny, env="EAGLE3_PATCHES_DISABLE=").ok


def test_upgrade_algorithm_set_in_front_of_the_launch_is_a_warning_not_an_error(tiny):
    code = "algorithm-eagle-with-eagle3-draft"
    assert code in judged(tiny, algorithm="EAGLE").codes(ERROR)
    r = judged(tiny, algorithm="EAGLE", env="EAGLE3_PATCHES_UPGRADE_ALGORITHM=1")
    assert code in r.codes(WARNING) and code not in r.codes(ERROR), r.format()


@pytest.mark.parametrize(("env", "loaded"), [({}, True), ({"EAGLE3_PATCHES_PLUGIN": "0"}, False)])
def test_the_plugin_switched_off_in_the_launchs_environment_is_not_loaded(env, loaded):
    import importlib.metadata

    from eagle3_patches.checkpoint.releases import facts
    from eagle3_patches.plugin import ENTRY_POINT, GROUP, loaded_here

    if ENTRY_POINT not in {ep.name for ep in importlib.metadata.entry_points(group=GROUP)}:
        pytest.skip("eagle3-patches is not installed here with its plugin entry point")
    assert loaded_here(facts("0.5.23"), env)[0] is loaded


def test_without_a_launch_environment_the_plugin_is_judged_by_this_processs(monkeypatch):
    import importlib.metadata

    from eagle3_patches.checkpoint.releases import facts
    from eagle3_patches.plugin import ENTRY_POINT, GROUP, loaded_here

    if ENTRY_POINT not in {ep.name for ep in importlib.metadata.entry_points(group=GROUP)}:
        pytest.skip("eagle3-patches is not installed here with its plugin entry point")
    monkeypatch.setenv("EAGLE3_PATCHES_PLUGIN", "0")
    assert loaded_here(facts("0.5.23"))[0] is False
    assert loaded_here(facts("0.5.23"), {})[0] is True  # a launch environment given is the one judged


def test_run_only_or_disable_without_a_name_is_a_usage_error():
    from eagle3_patches.checkpoint.launch_args import LaunchArgsError, parse_launch_args

    with pytest.raises(LaunchArgsError, match="`eagle3-patches run --disable` without a patch name"):
        parse_launch_args(["eagle3-patches", "run", "--disable"])
    la = parse_launch_args("eagle3-patches run --probe --only=a --only b --disable c -- python -m sglang.launch_server")
    assert (la.run_only, la.run_disable, la.with_patches) == (["a", "b"], ["c"], True)
