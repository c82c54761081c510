"""The fork path: the diffs in patches/sglang-0.5.9 applied by eagle3_patches.fork.

Most tests work on a small tree holding only the files the series touches (plus the version
files), copied from the installed sglang 0.5.9; one test copies the whole package, applies
the series and asks the registry, in a fresh process whose sglang is the patched copy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import eagle3_patches
from eagle3_patches import fork
from eagle3_patches.fork import writing as fork_writing
from eagle3_patches.registry import SOURCE_MARKER

REPO = Path(__file__).resolve().parents[2]
SERIES = fork.load_series(fork.DEFAULT_SERIES)


#: the registry's fixes for the series' release, in registry order (instruments have no diff, nor runtime-only
#: patches, nor fixes for other releases such as layer_id_convention, 0.5.13+)
FIXES = fork.fork_series_names(eagle3_patches.get_registry().patches(), SERIES.sglang_version)


def _installed_root() -> Path:
    try:
        root = fork.default_sglang_root()
    except fork.ForkError as exc:
        pytest.skip(str(exc))
    for path, digest in SERIES.pristine.items():
        if fork.sha256((root / path).read_bytes()) != digest:
            pytest.skip(f"the installed sglang is not the pristine {SERIES.sglang_version} release ({path} differs)")
    return root


@pytest.fixture(scope="module")
def installed() -> Path:
    return _installed_root()


@pytest.fixture
def tree(tmp_path, installed) -> Path:
    """A small sglang tree: the touched files, version.py and _version.py, as released."""
    root = tmp_path / "sglang"
    for rel in [*SERIES.touched(), "version.py", "_version.py"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(installed / rel, root / rel)
    return root


def _cli(argv: list[str]) -> int:
    """`eagle3-patches apply ...` through the real CLI entry point (messages, exit codes)."""
    from eagle3_patches.cli import main

    return main(["apply", *argv])


# --------------------------------------------------------------------------- the series itself
def test_series_mirrors_the_registry_and_carries_the_markers():
    """``series`` alone orders the diffs: the registry's fork-series fixes, in registry order, each file named after
    its patch (the same check tests/unit/test_adding_a_patch.py makes on a copy with a patch added)."""
    assert FIXES  # the registry has fixes for the series' release
    assert fork.mirror_problems(SERIES, eagle3_patches.get_registry().patches()) == []
    assert [p.name for p in SERIES.patches] == FIXES
    assert [p.filename for p in SERIES.patches] == [f"{n}.patch" for n in FIXES]
    assert sorted(p.name for p in SERIES.directory.glob("*.patch")) == sorted(p.filename for p in SERIES.patches)
    import importlib

    for patch in SERIES.patches:
        module = importlib.import_module(f"eagle3_patches.patches.{patch.name}").PATCH.module
        rel = module.removeprefix("sglang.").replace(".", "/") + ".py"
        assert [f.path for f in patch.files] == [rel], patch.name  # the diff touches the patch's own module
        added = "".join(t for f in patch.files for h in f.hunks for tag, t in h.lines if tag == "+")
        assert f"# {SOURCE_MARKER.format(name=patch.name)}" in added
        assert "eagle3_patches" not in added.replace("eagle3-patches", "")  # no run-time dependency on the library
        assert "import eagle3_patches" not in added and "from eagle3_patches" not in added


@pytest.mark.parametrize(
    "damage, needle",
    [
        ("reordered", "the registry's fork-series fixes"),
        ("missing", "the registry's fork-series fixes"),
        ("numbered", "is named kimi_k25_eagle3_delegation.patch"),
        ("stray", "does not list: leftover.patch"),
        ("another file", "touches srt/elsewhere.py"),
        ("no marker", "does not add the marker comment"),
        ("imports", "uses eagle3_patches"),
    ],
)
def test_mirror_problems_name_what_is_off(tmp_path, damage, needle):
    import copy

    series = copy.deepcopy(SERIES)
    series.directory = tmp_path / SERIES.name
    shutil.copytree(SERIES.directory, series.directory)
    first = series.patches[0]
    marker = SOURCE_MARKER.format(name=first.name)
    if damage == "reordered":
        series.patches[:2] = series.patches[1::-1]
    elif damage == "missing":
        series.patches.pop()
    elif damage == "numbered":
        first.filename = f"01-{first.filename}"
    elif damage == "stray":
        (series.directory / "leftover.patch").write_text("")
    elif damage == "another file":
        first.files[0].path = "srt/elsewhere.py"
    elif damage == "no marker":
        for hunk in first.files[0].hunks:
            hunk.lines = [(tag, text.replace(marker, "a plain comment")) for tag, text in hunk.lines]
    elif damage == "imports":
        first.files[0].hunks[0].lines.append(("+", "from eagle3_patches.errors import Eagle3ConfigError\n"))
    problems = fork.mirror_problems(series, eagle3_patches.get_registry().patches())
    assert problems and all(isinstance(p, str) for p in problems)
    assert any(needle in p for p in problems), problems


def test_diffs_are_standard_unified_diffs_relative_to_the_package_root():
    for patch in SERIES.patches:
        text = (SERIES.directory / patch.filename).read_text()
        for f in patch.files:
            assert f"--- a/{f.path}\n+++ b/{f.path}\n" in text


# --------------------------------------------------------------------------- apply / check / revert
def test_check_lists_every_patch_applicable_and_writes_nothing(tree, capsys):
    before = fork.tree_digest(tree)
    assert _cli(["--sglang-root", str(tree), "--check"]) == 0
    out = capsys.readouterr().out
    for patch in SERIES.patches:
        assert f"{patch.filename}" in out and "would apply" in out
    assert f"dry run: {len(SERIES.touched())} file(s) would change" in out
    report = fork.apply_series(tree, check=True)
    assert [o.state for o in report.outcomes] == ["applicable"] * len(FIXES)
    assert fork.tree_digest(tree) == before


def test_the_json_report_is_the_whole_report_and_nothing_else(tree, capsys):
    """``--json`` prints one JSON document (no human lines before it): what a script reads back after applying."""
    import json

    assert _cli(["--sglang-root", str(tree), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got == {
        "root": str(tree),
        "series": SERIES.name,
        "mode": "apply",
        "sglang": SERIES.sglang_version,
        "patches": [
            {"name": n, "filename": p.filename, "state": "applied", "files": [f.path for f in p.files]}
            for n, p in zip(FIXES, SERIES.patches)
        ],
        "changed": sorted(SERIES.touched()),
        "recovered": [],
    }
    assert _cli(["--sglang-root", str(tree), "--check", "--revert", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["mode"], {o["state"] for o in got["patches"]}, got["changed"]) == (
        "check-revert",
        {"revertible"},
        sorted(SERIES.touched()),
    )


def test_apply_is_idempotent_and_revert_restores_every_byte(tree):
    pristine = fork.tree_digest(tree)
    first = fork.apply_series(tree)
    assert [o.state for o in first.outcomes] == ["applied"] * len(FIXES)
    assert sorted(first.changed) == sorted(SERIES.touched())
    for patch in SERIES.patches:
        for f in patch.files:
            assert SOURCE_MARKER.format(name=patch.name) in (tree / f.path).read_text()
    patched = fork.tree_digest(tree)

    again = fork.apply_series(tree)
    assert [o.state for o in again.outcomes] == ["already applied"] * len(FIXES)
    assert again.changed == []
    assert fork.tree_digest(tree) == patched
    assert [o.state for o in fork.apply_series(tree, check=True).outcomes] == ["already applied"] * len(FIXES)

    check_revert = fork.apply_series(tree, check=True, revert=True)
    assert [o.state for o in check_revert.outcomes] == ["revertible"] * len(FIXES)
    assert fork.tree_digest(tree) == patched

    reverted = fork.apply_series(tree, revert=True)
    assert [o.state for o in reverted.outcomes] == ["reverted"] * len(FIXES)
    assert fork.tree_digest(tree) == pristine
    assert [o.state for o in fork.apply_series(tree, revert=True).outcomes] == ["not applied"] * len(FIXES)
    assert fork.tree_digest(tree) == pristine


def test_partial_series_is_completed_and_reverted(tree):
    pristine = fork.tree_digest(tree)
    fork.apply_series(tree, upto="tp_allreduce_fusion_capture")
    states = [o.state for o in fork.apply_series(tree, check=True).outcomes]
    done = FIXES.index("tp_allreduce_fusion_capture") + 1
    assert states == ["already applied"] * done + ["applicable"] * (len(FIXES) - done)
    fork.apply_series(tree)
    fork.apply_series(tree, revert=True)
    assert fork.tree_digest(tree) == pristine


def test_the_gnu_patch_tool_gives_the_same_tree(tree, tmp_path):
    if shutil.which("patch") is None:
        pytest.skip("no patch binary")
    other = tmp_path / "other"
    shutil.copytree(tree, other)
    for patch in SERIES.patches:
        subprocess.run(["patch", "-s", "-p1", "-i", str(SERIES.directory / patch.filename)], cwd=other, check=True)
    fork.apply_series(tree)
    assert fork.tree_digest(tree) == fork.tree_digest(other)


def test_git_apply_and_quilt_read_the_same_series(tree, tmp_path):
    """The series is quilt's format (``series``: one diff a line, ``#`` comments) and ``git apply`` takes the diffs
    as they are: the same tree as this library's applier."""
    if shutil.which("git") is None:
        pytest.skip("no git binary")
    other = tmp_path / "other"
    shutil.copytree(tree, other)
    names = [
        line.strip()
        for line in (SERIES.directory / "series").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert names == [p.filename for p in SERIES.patches]
    for name in names:
        subprocess.run(["git", "apply", "-p1", str(SERIES.directory / name)], cwd=other, check=True)
    fork.apply_series(tree)
    assert fork.tree_digest(tree) == fork.tree_digest(other)


# --------------------------------------------------------------------------- refusals
def _touch_line(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1
    path.write_text(text.replace(old, new))


def test_a_touched_file_is_refused_naming_file_and_hunk(tree, capsys):
    target = tree / "srt/models/deepseek_v2.py"
    _touch_line(
        target,
        "        if not self.pp_group.is_last_rank:\n            return\n\n        if layer_ids is None:",
        "        if not self.pp_group.is_last_rank:  # local edit\n            return\n\n        if layer_ids is None:",
    )
    before = fork.tree_digest(tree)
    assert _cli(["--sglang-root", str(tree)]) == 1
    err = capsys.readouterr().err
    assert str(target) in err
    assert "; aux_capture_validation.patch hunk #4" in err and "Nothing was written" in err
    assert "Traceback" not in err
    assert fork.tree_digest(tree) == before  # not even the other, untouched files were patched
    with pytest.raises(fork.ForkError):
        fork.apply_series(tree, check=True)
    with pytest.raises(fork.ForkError, match="Nothing was reverted"):
        fork.apply_series(tree, revert=True)
    assert fork.tree_digest(tree) == before


def test_a_change_outside_the_hunks_is_refused_too(tree):
    target = tree / "srt/models/kimi_k25.py"
    _touch_line(
        target,
        "        pattern = MultiModalityDataPaddingPatternMultimodalTokens()\n",
        "        pattern = MultiModalityDataPaddingPatternMultimodalTokens()  # local edit\n",
    )
    before = fork.tree_digest(tree)
    with pytest.raises(fork.ForkError) as info:
        fork.apply_series(tree)
    assert str(target) in str(info.value) and "outside the lines the series touches" in str(info.value)
    assert fork.tree_digest(tree) == before


def test_another_release_is_refused(tree):
    version = tree / "_version.py"
    version.write_text(version.read_text().replace("'0.5.9'", "'0.5.10'"))
    with pytest.raises(fork.ForkError, match=r"series sglang-0.5.9 is for sglang 0.5.9, but .* is sglang 0.5.10"):
        fork.apply_series(tree)


def test_not_an_sglang_root_is_refused_with_a_hint(tree, tmp_path):
    with pytest.raises(fork.ForkError, match="did you mean --sglang-root"):
        fork.apply_series(tree.parent)
    with pytest.raises(fork.ForkError, match="no patch series 'nope'"):
        fork.apply_series(tree, "nope")


# --------------------------------------------------------------------------- atomicity
def test_a_failure_mid_write_leaves_the_tree_unchanged(tree, monkeypatch):
    before = fork.tree_digest(tree)
    calls = []

    def failing_replace(src, dst):
        calls.append(dst)
        if len(calls) == 3:
            raise OSError("disk full (simulated)")
        os.replace(src, dst)

    monkeypatch.setattr(fork_writing, "_replace", failing_replace)
    with pytest.raises(OSError, match="simulated"):
        fork.apply_series(tree)
    assert len(calls) == 3
    assert fork.tree_digest(tree) == before  # two files had been replaced: both restored; no leftovers


def test_a_run_killed_mid_write_is_undone_by_the_next_run(tree):
    before = fork.tree_digest(tree)
    script = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {str(REPO)!r})
        from eagle3_patches import fork
        from eagle3_patches.fork import writing as fork_writing
        calls = []
        def dying_replace(src, dst):
            calls.append(dst)
            if len(calls) == 3:
                os._exit(9)  # killed: no rollback runs
            os.replace(src, dst)
        fork_writing._replace = dying_replace  # the name write_atomically calls
        fork.apply_series({str(tree)!r})
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr
    assert (tree / fork.JOURNAL).is_file()
    assert fork.tree_digest(tree) != before  # half written, as a kill leaves it

    report = fork.apply_series(tree, check=True)  # any run, even a dry one, restores first
    assert len(report.recovered) == 2
    assert "recovered from an interrupted run" in "\n".join(report.lines())
    assert fork.tree_digest(tree) == before


# --------------------------------------------------------------------------- the diff engine
def test_make_and_apply_unified_diffs_round_trip():
    before = b"a\nb\nc\nd\ne\nf\ng\nh\ni\nj\nk\nl"
    after = b"a\nB\nc\nd\ne\nf\ng\nh\ni\nj\nk\nl\nm"
    text = fork.make_unified_diff("srt/x.py", before, after)
    assert "\\ No newline at end of file" in text
    [fd] = fork.parse_unified_diff(text)
    assert fd.path == "srt/x.py"
    lines = before.decode().splitlines(keepends=True)
    assert "".join(fork.apply_hunks(lines, fd.hunks)).encode() == after
    assert (
        "".join(fork.apply_hunks(after.decode().splitlines(keepends=True), fd.hunks, reverse=True)).encode() == before
    )
    shifted = ["0\n"] + lines
    with pytest.raises(fork.HunkMismatch):
        fork.apply_hunks(shifted, fd.hunks)
    assert "".join(fork.apply_hunks(shifted, fd.hunks, exact=False)).encode() == b"0\n" + after


def test_default_root_is_found_without_importing_sglang(installed):
    code = (
        "import sys; from eagle3_patches import fork; print(fork.default_sglang_root()); print('sglang' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    root, imported = proc.stdout.split()
    assert Path(root) == installed and imported == "False"


# --------------------------------------------------------------------------- maintainer tool
def test_regen_patch_reproduces_the_series(tree, tmp_path, installed):
    series_copy = tmp_path / "series-copy"
    shutil.copytree(SERIES.directory, series_copy)
    fork.apply_series(tree, upto="cuda_graph_capture_order")
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import regen_patch
    finally:
        sys.path.pop(0)
    rc = regen_patch.main(
        ["cuda_graph_capture_order", "--edited", str(tree), "--pristine", str(installed), "--series", str(series_copy)]
    )
    assert rc == 0
    for name in [*fork.read_series_names(SERIES.directory), fork.CHECKSUMS_FILE]:
        assert (series_copy / name).read_bytes() == (SERIES.directory / name).read_bytes(), name

    # an edit shows up in the regenerated diff and in the checksums; later patches still chain
    _touch_line(
        tree / "srt/model_executor/model_runner.py",
        "        ids = list(ids)\n",
        "        ids = list(ids)  # the configured ids, copied\n",
    )
    assert (
        regen_patch.main(
            [
                "cuda_graph_capture_order",
                "--edited",
                str(tree),
                "--pristine",
                str(installed),
                "--series",
                str(series_copy),
            ]
        )
        == 0
    )
    regenerated = (series_copy / "cuda_graph_capture_order.patch").read_text()
    assert "+        ids = list(ids)  # the configured ids, copied" in regenerated
    sums = json.loads((series_copy / fork.CHECKSUMS_FILE).read_text())
    assert sums["patches"]["cuda_graph_capture_order.patch"]["files"]["srt/model_executor/model_runner.py"][
        "after"
    ] == fork.sha256((tree / "srt/model_executor/model_runner.py").read_bytes())
    outcomes = fork.apply_series(tree, series_copy, check=True).outcomes
    assert outcomes[FIXES.index("cuda_graph_capture_order") + 1].state == "applicable"  # the next one


# --------------------------------------------------------------------------- the registry on a patched copy
@pytest.fixture(scope="module")
def fork_tree(tmp_path_factory, installed) -> Path:
    dest = tmp_path_factory.mktemp("fork-tree")
    sys.path.insert(0, str(REPO / "tools"))
    try:
        from make_fork_tree import make_fork_tree
    finally:
        sys.path.pop(0)
    make_fork_tree(dest, installed, out=lambda line: None)
    return dest


_STATUS = """
import json
from eagle3_patches import cpu
from support.releases import import_hooked_modules
cpu.activate()
import eagle3_patches, sglang
reg = eagle3_patches.get_registry()
eagle3_patches.apply()
import_hooked_modules()  # a module of later releases (the MLA draft's) is left out
print(json.dumps({"sglang": sglang.__file__, "states": {n: s.state.value for n, s in eagle3_patches.status().items()}}))
"""


@pytest.mark.sglang
def test_registry_reports_every_patch_in_source_on_the_patched_copy(fork_tree):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fork_tree), str(REPO), str(REPO / "tests")])}
    proc = subprocess.run([sys.executable, "-c", _STATUS], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["sglang"].startswith(str(fork_tree))
    assert {n: s for n, s in result["states"].items() if n in FIXES} == {name: "in-source" for name in FIXES}
    runtime_only = {p.name for p in eagle3_patches.get_registry().patches() if not p.in_fork_series}
    # nothing of the series patched at run time on top of the fork (a check of the library's own deployment may be)
    series = set(eagle3_patches.get_registry().names()) - runtime_only  # instruments are never in the series
    assert "applied" not in [s for n, s in result["states"].items() if n in series]
