"""Settings: every EAGLE3_PATCHES_* variable read in one place, once; nothing misread in silence."""

from __future__ import annotations

import logging

import pytest

import eagle3_patches
from eagle3_patches import settings


def test_one_spelling_of_on_and_off():
    for raw in ("1", "true", "YES", " on "):
        assert settings.parse_flag(raw) is True
    for raw in (None, "", "0", "False", "no", "OFF"):
        assert settings.parse_flag(raw) is False
    assert settings.parse_flag("enabled") is None


def test_a_value_not_understood_is_reported_and_treated_as_off(caplog):
    with caplog.at_level(logging.WARNING, logger="eagle3_patches"):
        s = settings.reload(
            {settings.UPGRADE_ALGORITHM: "enabled", settings.ON_ERROR: "explode", settings.DUMP_SHARD_TOKENS: "-5"}
        )
    assert not s.upgrade_algorithm and s.on_error == "warn" and s.dump_shard_tokens == 4096
    assert len(s.problems) == 3
    assert "EAGLE3_PATCHES_UPGRADE_ALGORITHM='enabled'" in caplog.text and "'explode'" in caplog.text


def test_settings_are_read_once_until_reloaded(monkeypatch):
    monkeypatch.setenv(settings.UPGRADE_ALGORITHM, "1")
    assert settings.reload().upgrade_algorithm
    monkeypatch.setenv(settings.UPGRADE_ALGORITHM, "0")
    assert settings.current().upgrade_algorithm  # read once
    assert not settings.reload().upgrade_algorithm


@pytest.mark.parametrize(
    "raw, probe, path",
    [("", False, None), ("0", False, None), ("1", True, None), ("on", True, None), ("/tmp/p", True, "/tmp/p")],
)
def test_probe_setting(raw, probe, path):
    s = settings.reload({settings.PROBE: raw})
    assert (s.probe, s.probe_path) == (probe, path)


def test_a_misspelt_patch_name_in_disable_is_named_not_ignored(monkeypatch, caplog):
    monkeypatch.setenv(settings.DISABLE, "eagle3_fc_gaurd,eagle3_algorithm_guard")
    settings.reload()
    assert settings.unknown_names(eagle3_patches.known_names()) == {settings.DISABLE: ["eagle3_fc_gaurd"]}
    with caplog.at_level(logging.WARNING, logger="eagle3_patches"):
        eagle3_patches.apply([])  # selects nothing: only the settings are checked
    assert "EAGLE3_PATCHES_DISABLE names unknown patch(es) eagle3_fc_gaurd" in caplog.text


def test_correct_names_raise_no_warning(monkeypatch, caplog):
    monkeypatch.setenv(settings.DISABLE, "eagle3_fc_guard")
    monkeypatch.setenv(settings.ENABLE, "hidden_state_dump")
    settings.reload()
    with caplog.at_level(logging.WARNING, logger="eagle3_patches"):
        eagle3_patches.apply([])
    assert settings.unknown_names(eagle3_patches.known_names()) == {}
    assert "unknown patch" not in caplog.text


def test_nothing_outside_settings_reads_the_environment_for_eagle3_patches():
    """One place per setting: no other library module reads EAGLE3_PATCHES_* from os.environ."""
    import pathlib
    import re

    root = pathlib.Path(eagle3_patches.__file__).parent
    pattern = re.compile(r"os\.environ(\.get)?\(?\[?[^)\]]*EAGLE3_PATCHES_")
    offenders = []
    for path in root.rglob("*.py"):
        if path.name == "settings.py" or "testing" in path.parts:
            continue
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines, 1):
            # the one exception: the bootstrap's fallback where the library itself cannot be imported, said on the
            # line of the read or on the `except` line above it
            if pattern.search(line) and not any("the library itself cannot be imported" in s for s in lines[i - 2 : i]):
                offenders.append(f"{path.relative_to(root)}:{i}: {line.strip()}")
    assert offenders == [], offenders
