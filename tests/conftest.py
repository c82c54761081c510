"""Shared fixtures: tiny checkpoints built once per session (deterministic, no hub)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from eagle3_patches.testing import costs, tiny_models


@pytest.fixture(autouse=True)
def _settings_follow_the_environment():
    """eagle3_patches reads its EAGLE3_PATCHES_* settings once per process; a test that changes them
    calls ``settings.reload()``, and every test ends with the settings of the restored environment."""
    yield
    from eagle3_patches import settings

    settings.reload()


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> Path:
    """Where the tiny checkpoints live; EAGLE3_TINY_CACHE reuses them across runs."""
    cached = os.environ.get("EAGLE3_TINY_CACHE")
    return Path(cached) if cached else tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def tiny(tiny_root) -> dict[str, Path]:
    """Paths of the tiny DeepSeek-V3 / Kimi-K2.5 targets and EAGLE-3 drafts (see tiny_models.build_all)."""
    return tiny_models.build_all(tiny_root)


@pytest.fixture(scope="session")
def run_check(tiny_root):
    """``run_check(name)``: the selftest check ``name`` (eagle3_patches/selftest/checks/) run on CPU against the
    installed sglang, once per session; its :class:`~eagle3_patches.selftest.Result`.  The behavioural tests assert
    on it, so what ``eagle3-patches selftest`` checks is what CI proves.  A check that cannot run here skips the
    test with the check's own reason."""
    from support.releases import sglang_version

    from eagle3_patches.selftest import BY_NAME, SKIPPED, Context, Device, execute

    context = Context(tiny_root, Device("cpu"), sglang_version())
    results: dict = {}

    def run(name: str):
        if name not in results:
            results[name] = execute(BY_NAME[name], context)
        if results[name].status == SKIPPED:
            pytest.skip(f"selftest check {name}: {results[name].reason}")
        return results[name]

    return run


def _sglang_source_is_forked() -> bool:
    """True when the importable sglang carries the fork-path diffs (mode (b), docs/fork.md)."""
    import importlib.util

    spec = importlib.util.find_spec("sglang")  # locates the package without importing it
    if spec is None or spec.origin is None:
        return False
    kimi = Path(spec.origin).parent / "srt" / "models" / "kimi_k25.py"
    return kimi.is_file() and "eagle3-patches: kimi_k25_eagle3_delegation" in kimi.read_text()


def pytest_collection_modifyitems(config, items):
    """In fork mode, tests of stock behaviour and of the runtime-patching mechanism do not apply."""
    if not _sglang_source_is_forked():
        return
    reasons = {
        "stock": "asserts stock sglang 0.5.9 behaviour; this sglang carries the fork-path diffs",
        "runtime_only": "asserts the runtime-patching mechanism; this sglang carries the fork-path diffs",
    }
    for item in items:
        for mark, reason in reasons.items():
            if item.get_closest_marker(mark):
                item.add_marker(pytest.mark.skip(reason=reason))


_FIGURES: list[str] = []


@pytest.fixture
def other_value():
    """``other_value(setting)``: a value of an ``EAGLE3_PATCHES_*`` declaration (``settings.DECLARED``) other than its
    default, as the variable is written."""
    from eagle3_patches import settings

    def value(s: settings.Setting) -> str:
        if isinstance(s, settings.Flag):
            return "0" if s.default else "1"
        if isinstance(s, settings.Word):
            return next(w for w in s.words if w != s.default)
        if isinstance(s, settings.Number):
            return str(s.lo + 1)
        return "input-of-layer" if s.var == settings.LAYER_ID_CONVENTION else "x"

    return value


@pytest.fixture
def figure():
    """``figure("...")`` records a measured figure; all of them are printed in pytest's summary (CI logs)."""
    return _FIGURES.append


def pytest_terminal_summary(terminalreporter):
    if _FIGURES:
        terminalreporter.section("measured figures")
        for line in _FIGURES:
            terminalreporter.write_line(line)


# -- where the time goes: EAGLE3_TEST_COSTS (eagle3_patches/testing/costs.py, tools/test_costs.py) -------------
def pytest_runtest_logreport(report):
    costs.record("test", test=report.nodeid, phase=report.when, seconds=round(report.duration, 3))


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    with costs.timed("fixture", fixture=fixturedef.argname, scope=fixturedef.scope):
        yield
