"""Shipped data (the fork-path series, the docs) and `eagle3-patches docs` (in-process; the
install layouts themselves are in tests/packaging)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from eagle3_patches import _shipped, fork, settings
from eagle3_patches.cli import build_parser, docs_cmd, main
from eagle3_patches.fork import series as fork_series

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted(p.stem for p in (REPO / "docs").glob("*.md"))


# --------------------------------------------------------------------------- finding the data
def test_a_checkout_uses_its_own_top_level_directories():
    assert _shipped.shipped_dir(_shipped.SERIES_PACKAGE) == REPO / "patches"
    assert _shipped.shipped_dir(_shipped.DOCS_PACKAGE) == REPO / "docs"


def test_an_install_finds_the_package_data_with_importlib_resources(tmp_path, monkeypatch):
    package = tmp_path / "site" / "fake_shipped"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(_shipped, "_CHECKOUT", tmp_path / "not-a-checkout")
    monkeypatch.setitem(_shipped.TOP_LEVEL, "fake_shipped", "fake")
    assert _shipped.shipped_dir("fake_shipped") == package


def test_an_install_without_the_package_data_finds_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(_shipped, "_CHECKOUT", tmp_path)
    monkeypatch.setitem(_shipped.TOP_LEVEL, "eagle3_patches_no_such_data", "nope")
    assert _shipped.shipped_dir("eagle3_patches_no_such_data") is None


def test_the_series_dir_env_is_searched_first(tmp_path, monkeypatch):
    shutil.copytree(REPO / "patches" / fork.DEFAULT_SERIES, tmp_path / "custom")
    monkeypatch.setenv(fork.SERIES_DIR_ENV, str(tmp_path))
    settings.reload()
    assert fork.series_search_path() == [tmp_path, REPO / "patches"]
    assert fork.find_series("custom") == tmp_path / "custom"
    assert fork.find_series() == REPO / "patches" / fork.DEFAULT_SERIES


def test_missing_package_data_is_named_with_the_fix(monkeypatch):
    monkeypatch.delenv(fork.SERIES_DIR_ENV, raising=False)
    settings.reload()
    monkeypatch.setattr(fork_series, "shipped_dir", lambda package: None)
    with pytest.raises(
        fork.ForkError, match=r"package data eagle3_patches\.series \(missing from this install.*reinstall"
    ):
        fork.find_series()


# --------------------------------------------------------------------------- eagle3-patches docs
def test_docs_lists_every_page_with_its_title(capsys):
    assert main(["docs"]) == 0
    out = capsys.readouterr().out
    listed = re.findall(r"^  (\S+)  ", out, re.M)
    assert sorted(listed) == PAGES
    operators = out.index("for operators:")
    contributors = out.index("for contributors:")
    assert operators < contributors
    users = [n for n in listed if n in docs_cmd.USER_PAGES]
    assert users == [n for n in docs_cmd.USER_PAGES if n in PAGES] == listed[: len(users)]  # the operator's first
    for page in ("troubleshooting", "doctor", "upgrading"):
        assert out.index(f"  {page} ") < contributors
    for page in ("testing", "development", "architecture"):
        assert out.index(f"  {page} ") > contributors
    assert re.search(r"^  fork +The fork path: the patch set as diffs to sglang's source$", out, re.M)


@pytest.mark.parametrize("spelling", ["doctor", "doctor.md", "docs/doctor.md"])
def test_docs_prints_the_page(spelling, capsys):
    assert main(["docs", spelling]) == 0
    assert capsys.readouterr().out.rstrip("\n") == (REPO / "docs" / "doctor.md").read_text().rstrip("\n")


def test_an_unknown_page_exits_2_with_the_list(capsys):
    assert main(["docs", "doctr"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "no page 'doctr'" in captured.err and sorted(re.findall(r"^  (\S+)  ", captured.err, re.M)) == PAGES


def test_an_install_without_docs_says_so(monkeypatch, capsys):
    monkeypatch.setattr(docs_cmd, "shipped_dir", lambda package: None)
    assert main(["docs", "doctor"]) == 1
    assert "no documentation pages in this install (the package data eagle3_patches.docs)" in capsys.readouterr().err


def _all_help() -> str:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.choices and isinstance(a.choices, dict))
    return parser.format_help() + "".join(p.format_help() for p in subparsers.choices.values())


def test_every_docs_path_in_the_cli_help_says_how_to_read_it_installed():
    text = re.sub(r"\s+", " ", _all_help())
    mentioned = re.findall(r"docs/([\w-]+)\.md", text)
    assert {"doctor", "checkpoints", "troubleshooting"} <= set(mentioned)
    for page in mentioned:
        assert page in PAGES
        assert f"docs/{page}.md (installed: eagle3-patches docs {page})" in text
