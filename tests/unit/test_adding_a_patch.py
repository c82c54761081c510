"""Adding a patch is the checklist of docs/patches.md ("Adding a patch"), and nothing else.

A copy of the repository parts involved (the package, the fork series, docs/patches.md, the two tools the
checklist runs, the contract tests and ``pyproject.toml``, which makes the copy a checkout whose fork path reads
its own ``patches/``) goes through the checklist for a made-up fix, ``throwaway_fix``:

1. the patch module ``eagle3_patches/patches/throwaway_fix.py`` (with a preflight rule);
2. its tests (``tests/patches/test_throwaway_fix.py``) and its name in the snapshot of
   ``tests/unit/test_registry.py``;
3. its fork-path diff, written by the copy's ``tools/regen_patch.py``: ``throwaway_fix.patch`` (against a
   made-up sglang module), its line in ``series`` where its registry ``order`` puts it, ``checksums.json``;
4. its selftest check module ``eagle3_patches/selftest/checks/throwaway_fix.py``, its scenario beside the check;
5. the generated docs, by the copy's ``tools/gen_docs.py``.

With the module alone, the copy's contract tests (registry snapshot, fork series mirror, a check per patch, the
docs table) fail; after the checklist they pass, and exactly the checklist's files differ from the repository's,
as many steps and files as docs/patches.md states.
In a fresh interpreter on the copy: the registry lists the patch in its order, ``eagle3-patches status`` shows
it, ``eagle3-patches doctor`` runs its rule (a note where the launch runs under eagle3-patches), the fork series
mirrors the registry (:func:`eagle3_patches.fork.mirror_problems`, what tests/fork/test_fork.py checks), the
selftest finds its check, and the generated table of docs/patches.md has its row.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3_patches import fork

REPO = Path(__file__).resolve().parents[2]

THROWAWAY = '''"""throwaway_fix

Bug: a made-up one, to show what adding a patch takes.

What users see: nothing; it is made up.

What the patch changes: sets ``fixed`` on a module sglang never imports.

Releases: any.

Upstream probe: none.

Tests: tests/unit/test_adding_a_patch.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from packaging.specifiers import SpecifierSet

from ..diagnostic import ERROR, Diagnostics
from ..registry import Patch

if TYPE_CHECKING:
    from ..preflight import PatchSetup


class ThrowawayFix(Patch):
    name = "throwaway_fix"
    summary = "a made-up fix that only shows up"
    module = "sglang.srt.throwaway_module_that_is_never_imported"
    applies_to = SpecifierSet(">=0.5.8")
    order = 55

    def preflight(self, setup: PatchSetup):
        out = Diagnostics()
        if setup.algorithm == "EAGLE3":
            out.add(ERROR, "throwaway-bug", "the made-up bug would bite this launch", where="--speculative-algorithm",
                    fix="launch under eagle3-patches run")
        return out

    def patch(self, module, saver):
        saver.set(module, "fixed", True)


PATCH = ThrowawayFix()
'''

THROWAWAY_CHECK = '''"""throwaway_fix: its check and its scenario (the bug is made up: there is nothing to observe)."""

from __future__ import annotations

from ..base import Check, Finding, Skip


def observe(ctx) -> Finding:
    raise Skip("the bug is made up")  # a real check: ctx.observe(made_up_module_there), stock and patched


def made_up_module_there() -> bool:
    """The scenario, run by ``ctx.observe`` in a fresh process: sglang is imported here, after the patches."""
    import importlib.util

    return importlib.util.find_spec("sglang.srt.throwaway_module_that_is_never_imported") is not None


CHECKS: tuple[Check, ...] = (
    Check("throwaway_fix", "the made-up bug, observed nowhere", observe, patch="throwaway_fix"),
)
'''

THROWAWAY_TEST = '''"""throwaway_fix: its doctor rule."""

from types import SimpleNamespace

from eagle3_patches.patches.throwaway_fix import PATCH


def test_the_rule_flags_an_eagle3_launch_only():
    assert [d.code for d in PATCH.preflight(SimpleNamespace(algorithm="EAGLE3"))] == ["throwaway-bug"]
    assert list(PATCH.preflight(SimpleNamespace(algorithm="EAGLE"))) == []
'''

#: the made-up sglang module the patch targets, as released and as the fork-path diff leaves it
TARGET = "srt/throwaway_module_that_is_never_imported.py"
RELEASED = b"def fixed():\n    return False\n"
FIXED = b"def fixed():\n    return True  # eagle3-patches: throwaway_fix\n"

#: the repository's parts the checklist reads or writes (copied; tools/ and tests/ only the files it runs)
PARTS = [
    "eagle3_patches",
    "patches",
    "docs/patches.md",
    "docs/doctor.md",  # gen_docs regenerates its example report too
    "docs/checkpoints.md",  # and its table of draft kinds and layouts
    "docs/settings.md",  # and its table of settings
    "pyproject.toml",
    "tools/regen_patch.py",
    "tools/gen_docs.py",
    "tests/conftest.py",
    "tests/support",
    "tests/unit/conftest.py",
    "tests/unit/test_registry.py",
    "tests/unit/test_adding_a_patch.py",
    "tests/unit/test_patch_docs.py",
    "tests/fork/test_fork.py",
    "tests/selftest/test_selftest.py",
]

#: the repository's tests that hold a patch to the checklist, each with the step that makes it pass
CONTRACT = {
    "tests/unit/test_registry.py::test_production_registries_declare_every_patch_and_instrument": "the snapshot",
    "tests/unit/test_registry.py::test_every_preflight_rule_is_typed_against_what_it_may_read": None,
    "tests/fork/test_fork.py::test_series_mirrors_the_registry_and_carries_the_markers": "the diff",
    "tests/fork/test_fork.py::test_diffs_are_standard_unified_diffs_relative_to_the_package_root": None,
    "tests/selftest/test_selftest.py::test_every_patch_is_observed_by_a_check_or_says_why": "the check module",
    "tests/selftest/test_selftest.py::test_a_patchs_checks_are_the_module_named_after_it_found_by_listing_the_package": None,  # noqa: E501
    "tests/selftest/test_selftest.py::test_list_names_every_check_and_every_patch_without_one": None,
    "tests/unit/test_adding_a_patch.py::test_the_committed_patch_table_is_what_the_registries_say": "the docs",
    "tests/unit/test_patch_docs.py::test_the_committed_page_is_what_the_registries_and_the_docstrings_say": "the docs",
    "tests/unit/test_patch_docs.py::"
    "test_every_patch_and_instrument_module_documents_itself_with_the_required_labels[throwaway_fix]": None,
    "tests/unit/test_patch_docs.py::test_the_files_a_docstring_names_exist[throwaway_fix]": None,
}

CHILD = """
import json, pickle, sys
import eagle3_patches
from eagle3_patches import fork
from eagle3_patches.doctor import doctor
from eagle3_patches.cli import status_cmd
from eagle3_patches.patch_docs import patch_table, with_table
from eagle3_patches.selftest import checks
from eagle3_patches.selftest.checks import throwaway_fix as check_module
names = eagle3_patches.get_registry().names()
status = status_cmd.resolve_status()
plain = doctor(sys.argv[1], launch=["python", "-m", "sglang.launch_server", "--speculative-algorithm", "EAGLE3"])
under = doctor(sys.argv[1], launch=["eagle3-patches", "run", "--", "python", "-m", "sglang.launch_server",
                                    "--speculative-algorithm", "EAGLE3"])
pick = lambda r: [(f.severity, f.what) for f in r.findings if f.code == "throwaway-bug"]
series = fork.load_series()
page = open(sys.argv[2], encoding="utf-8").read()
print(json.dumps({"names": names, "status": {p["name"]: p["state"] for p in status["patches"]},
                  "plain": pick(plain), "under": pick(under), "table": patch_table(),
                  "file": eagle3_patches.__file__, "series_dir": str(series.directory),
                  "series": [p.filename for p in series.patches],
                  "mirror": fork.mirror_problems(series, eagle3_patches.get_registry().patches()),
                  "checks": [[c.name, c.patch] for c in checks.CHECKS], "by_name": sorted(checks.BY_NAME),
                  "uncovered": sorted(checks.uncovered()), "docs_fresh": with_table(page) == page,
                  "scenario_travels": pickle.loads(pickle.dumps(check_module.made_up_module_there))
                  is check_module.made_up_module_there}))
"""


#: the checklist's steps and the files each one changes, as the test below makes them
STEPS = {
    "the patch module": ["eagle3_patches/patches/throwaway_fix.py"],
    "its tests and the snapshot": ["tests/patches/test_throwaway_fix.py", "tests/unit/test_registry.py"],
    "the fork-path diff": [
        "patches/sglang-0.5.9/throwaway_fix.patch",
        "patches/sglang-0.5.9/series",
        "patches/sglang-0.5.9/checksums.json",
    ],
    "the selftest check and its scenario": ["eagle3_patches/selftest/checks/throwaway_fix.py"],
    "the generated docs": ["docs/patches.md"],
}


def _stated_steps_and_files() -> tuple[int, int]:
    """The numbers of steps and files docs/patches.md's checklist states ("is N steps and M files")."""
    import re

    page = (REPO / "docs" / "patches.md").read_text(encoding="utf-8")
    found = re.search(r"Adding a fix is (\d+) steps and (\d+) files", page)
    assert found, "docs/patches.md no longer states its checklist's count"
    return int(found[1]), int(found[2])


def _digests(root: Path) -> dict[str, str]:
    return fork.tree_digest(root, ignore=("__pycache__", ".pytest_cache"))


def _run(argv: list[str], cwd: Path, copy: Path) -> subprocess.CompletedProcess:
    """A fresh interpreter on the copy (the tools put the copy's root first on sys.path themselves): nothing of
    this checkout's environment but PATH."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=600, cwd=cwd, env=env)


def _contract_failures(copy: Path, tmp_path: Path) -> set[str]:
    """The contract tests that fail in the copy (its own pytest, its own package)."""
    import xml.etree.ElementTree as ET

    tests = list(CONTRACT) + (["tests/patches/test_throwaway_fix.py"] if (copy / "tests/patches").is_dir() else [])
    report = tmp_path / "report.xml"
    proc = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", *tests, "--junitxml", str(report)], copy, copy)
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]  # ran; 1: some failed
    cases = list(ET.parse(report).iter("testcase"))
    assert len(cases) == len(tests), proc.stdout[-3000:]  # each one ran (the patch's own test file has one test)
    return {
        f"{case.get('classname').replace('.', '/')}.py::{case.get('name')}"
        for case in cases
        if case.find("failure") is not None or case.find("error") is not None
    }


def _pristine_release(tmp_path: Path) -> Path:
    """An sglang package directory holding the released files the series touches (from the installed sglang, which
    must be the release) and the made-up module: what regen_patch.py chains the diffs from."""
    series = fork.load_series(REPO / "patches" / fork.DEFAULT_SERIES)
    try:
        installed = fork.default_sglang_root()
    except fork.ForkError as exc:
        pytest.skip(str(exc))
    root = tmp_path / "pristine" / "sglang"
    for rel in [*series.pristine, "version.py", "_version.py"]:
        if not (installed / rel).is_file():
            pytest.skip(f"the installed sglang has no {rel}")
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(installed / rel, root / rel)
    for rel, digest in series.pristine.items():
        if fork.sha256((root / rel).read_bytes()) != digest:
            pytest.skip(f"the installed sglang is not the pristine {series.sglang_version} release ({rel} differs)")
    (root / TARGET).write_bytes(RELEASED)
    return root


def test_adding_a_patch_is_the_checklist_and_nothing_else(tmp_path, tiny):
    pristine = _pristine_release(tmp_path)
    copy = tmp_path / "repo"
    for part in PARTS:
        src, dst = REPO / part, copy / part
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dst)
    before = _digests(copy)
    series_dir = copy / "patches" / fork.DEFAULT_SERIES
    series_lines = (series_dir / fork.SERIES_FILE).read_text().splitlines()

    # 1. the patch module: the repository's contract tests now name what else it takes
    (copy / "eagle3_patches/patches/throwaway_fix.py").write_text(THROWAWAY)
    failing = _contract_failures(copy, tmp_path)
    assert failing == {test for test, step in CONTRACT.items() if step}, failing

    # 2. its tests, and its name in the snapshot, in registry order (order 55)
    (copy / "tests/patches").mkdir()
    (copy / "tests/patches/test_throwaway_fix.py").write_text(THROWAWAY_TEST)
    snapshot = copy / "tests/unit/test_registry.py"
    text, before_it = snapshot.read_text(), '    "mla_draft_strict_loading",\n'
    assert text.count(before_it) == 1
    snapshot.write_text(text.replace(before_it, before_it + '    "throwaway_fix",\n'))
    # 3. its fork-path diff, by the copy's own tool
    edited = tmp_path / "edited" / "sglang"
    (edited / TARGET).parent.mkdir(parents=True)
    (edited / TARGET).write_bytes(FIXED)
    tool = _run(
        [
            str(copy / "tools/regen_patch.py"),
            "throwaway_fix",
            "--file",
            TARGET,
            "--edited",
            str(edited),
            "--pristine",
            str(pristine),
        ],
        tmp_path,
        copy,
    )
    assert tool.returncode == 0, tool.stderr[-3000:]
    assert (series_dir / "throwaway_fix.patch").read_text() == fork.make_unified_diff(TARGET, RELEASED, FIXED)
    new_lines = (series_dir / fork.SERIES_FILE).read_text().splitlines()
    at = series_lines.index("eagle3_fc_guard.patch")  # the first the registry orders after it
    assert new_lines == series_lines[:at] + ["throwaway_fix.patch"] + series_lines[at:]
    # 4. its selftest check
    (copy / "eagle3_patches/selftest/checks/throwaway_fix.py").write_text(THROWAWAY_CHECK)
    # 5. the generated docs
    docs = _run([str(copy / "tools/gen_docs.py")], tmp_path, copy)
    assert docs.returncode == 0, docs.stderr[-3000:]

    assert _contract_failures(copy, tmp_path) == set()
    after = _digests(copy)
    changed = {path for path in before.keys() | after.keys() if before.get(path) != after.get(path)}
    assert (len(STEPS), len(changed)) == _stated_steps_and_files(), "docs/patches.md states another count"
    assert changed == {path for paths in STEPS.values() for path in paths}

    out = _run(["-c", CHILD, str(tiny["deepseek_v3"]), str(copy / "docs/patches.md")], tmp_path, copy)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["file"].startswith(str(copy))
    names = got["names"]
    assert names.index("eagle3_draft_strict_loading") < names.index("throwaway_fix") < names.index("eagle3_fc_guard")
    assert got["status"]["throwaway_fix"] in ("pending", "not-applicable")  # its module is never imported
    assert got["plain"] == [["error", "the made-up bug would bite this launch"]]
    assert got["under"] and got["under"][0][0] == "info" and "throwaway_fix" in got["under"][0][1]
    assert "| `throwaway_fix` | a made-up fix that only shows up |" in got["table"] and got["docs_fresh"]
    assert Path(got["series_dir"]).resolve() == series_dir.resolve()  # the copy's own series
    assert got["mirror"] == [] and "throwaway_fix.patch" in got["series"]
    assert "throwaway_fix" in got["by_name"] and "throwaway_fix" not in got["uncovered"]
    assert got["scenario_travels"]  # the scenario beside its check reaches the isolated process as it is
    patches = [patch for _, patch in got["checks"]]
    assert (
        patches.index("eagle3_draft_strict_loading") < patches.index("throwaway_fix") < patches.index("eagle3_fc_guard")
    )


def test_the_committed_patch_table_is_what_the_registries_say():
    from eagle3_patches.patch_docs import with_table

    page = (Path(__file__).resolve().parents[2] / "docs" / "patches.md").read_text(encoding="utf-8")
    assert with_table(page) == page, "docs/patches.md is stale: run python tools/gen_docs.py"
