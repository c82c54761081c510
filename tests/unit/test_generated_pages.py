"""The pages generated from real runs (docs/compat.md by ``tools/matrix.py``, docs/drift.md by
``tools/drift_report.py``) name every patch and instrument of the registries, and the releases they were run on
reach the newest checked release; where the code has outgrown a page, the test names the command that
regenerates it.  The run itself is not repeated: the page's names and releases are compared with the code's.
docs/patches.md, docs/doctor.md and docs/checkpoints.md are generated from the code alone and compared in full
(``tools/gen_docs.py --check``, tests/unit/test_patch_docs.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.version import Version

import eagle3_patches
from eagle3_patches.checkpoint.releases import NEWEST_CHECKED
from eagle3_patches.registry import Patch

ROOT = Path(__file__).resolve().parents[2]
COMPAT, DRIFT = ROOT / "docs" / "compat.md", ROOT / "docs" / "drift.md"
REGENERATE_COMPAT = (
    "rerun the matrix with this code (python tools/matrix.py), or render a run made with it "
    "(python tools/matrix.py --report-only)"
)
NAME = re.compile(r"`([a-z0-9_]+)`")


def everything() -> dict[str, Patch]:
    """Every patch and instrument, by name."""
    return {
        p.name: p for reg in (eagle3_patches.get_registry(), eagle3_patches.get_instruments()) for p in reg.patches()
    }


def _table(text: str, heading: str) -> list[list[str]]:
    """The cells of the rows of the first table after ``heading`` (header and rule left out)."""
    rows, started = [], False
    for line in text[text.index(heading) :].splitlines():
        if line.startswith("|"):
            started = True
            rows.append([c.strip() for c in line.strip("|").split("|")])
        elif started:
            break
    return rows[2:]


def _names_differ(page: str, shown: set[str], patches: dict[str, Patch], where: str, fix: str) -> list[str]:
    missing, gone = sorted(set(patches) - shown), sorted(shown - set(patches))
    out = []
    if missing:
        out.append(f"{page}: {where} names no {', '.join(missing)} (added since the page was generated): {fix}")
    if gone:
        out.append(f"{page}: {where} names {', '.join(gone)}, which the code no longer has: {fix}")
    return out


def _span_ends(cell: str) -> list[str]:
    """The releases at the ends of each run of ``0.5.9-0.5.12, 0.5.15`` (``-``: none)."""
    return [] if cell == "-" else [end for run in cell.split(", ") for end in run.split("-")]


def compat_problems(text: str, patches: dict[str, Patch], newest: Version = NEWEST_CHECKED) -> list[str]:
    page = "docs/compat.md"
    header = next(line for line in text.splitlines() if line.startswith("| sglang | transformers |"))
    columns = set(NAME.findall(header))
    out = _names_differ(page, columns, patches, "the table of patch states", REGENERATE_COMPAT)
    upstream = _table(text, "### Where each fix is upstream")
    out += _names_differ(
        page, {NAME.fullmatch(r[0]).group(1) for r in upstream}, patches, "the upstream table", REGENERATE_COMPAT
    )
    for name, _first, applied, *_ in upstream:
        patch = patches.get(name.strip("`"))
        outside = [v for v in _span_ends(applied) if patch is not None and not patch.covers(Version(v))]
        if outside:
            out.append(
                f"{page}: {name} is shown applied in {', '.join(outside)}, outside its range now "
                f"({patch.applies_to}): {REGENERATE_COMPAT}"
            )
    releases = [Version(row[0]) for row in _table(text, "| sglang | transformers |") if row and row[0][:1].isdigit()]
    if not releases or max(releases) < newest:
        out.append(
            f"{page}: the newest release run is {max(releases, default='none')}, the newest checked is {newest}: "
            f"{REGENERATE_COMPAT}"
        )
    return out


def drift_problems(text: str, patches: dict[str, Patch], newest: Version = NEWEST_CHECKED) -> list[str]:
    page = "docs/drift.md"
    command = re.search(r"^python tools/drift_report\.py .*$", text, re.M)
    fix = f"regenerate it ({command.group(0) if command else 'python tools/drift_report.py --output docs/drift.md'})"
    rows = _table(text, "| sglang object |")
    touched = {n for row in rows if len(row) > 2 for n in NAME.findall(row[2])}
    # the CPU profile's workarounds are touched there too: only a patch or instrument without a row is stale
    missing = sorted(set(patches) - touched)
    out = [f"{page}: no row names {', '.join(missing)} (added since the page was generated): {fix}"] if missing else []
    compared = re.search(r"^# Drift: sglang (\S+) -> (\S+)$", text, re.M)
    if compared is None or Version(compared.group(2)) < newest:
        out.append(
            f"{page}: compares up to {compared.group(2) if compared else 'no release'}, the newest checked "
            f"is {newest}: regenerate it (python tools/drift_report.py --new {newest} --output docs/drift.md)"
        )
    return out


def test_compat_md_names_every_patch_and_reaches_the_newest_checked_release():
    problems = compat_problems(COMPAT.read_text(encoding="utf-8"), everything())
    assert not problems, "\n".join(problems)


def test_drift_md_names_every_patch_and_compares_the_newest_checked_release():
    problems = drift_problems(DRIFT.read_text(encoding="utf-8"), everything())
    assert not problems, "\n".join(problems)


class _P(Patch):
    def __init__(self, name: str, applies_to: str = ""):
        from packaging.specifiers import SpecifierSet

        self.name, self.applies_to = name, SpecifierSet(applies_to)


COMPAT_PAGE = """# Compatibility
| sglang | transformers | `a` | `b` | suite |
|---|---|---|---|---|
| 0.5.9 | 4 | applied | applied | 1/0/0 |
| 0.5.13 | 4 | applied | not-applicable | 1/0/0 |

### Where each fix is upstream, as the probe saw it

| patch | first release with the fix upstream | applied in | not-applicable in | other |
|---|---|---|---|---|
| `a` | none in this run | 0.5.9-0.5.13 | - | - |
| `b` | none in this run | 0.5.9 | 0.5.13 | - |
"""
DRIFT_PAGE = """# Drift: sglang 0.5.12 -> 0.5.13

python tools/drift_report.py --old 0.5.12 --new 0.5.13 --output docs/drift.md

| sglang object | module | touched by | 0.5.12 -> 0.5.13 |
|---|---|---|---|
| `f` | `sglang.m` | `a` (changes); `cpu_x` (changes) | changed |
| `g` | `sglang.m` | `b` (reads) | unchanged |
"""


def test_a_page_that_matches_the_code_is_silent():
    patches = {"a": _P("a"), "b": _P("b", "<0.5.13")}
    assert compat_problems(COMPAT_PAGE, patches, Version("0.5.13")) == []
    assert drift_problems(DRIFT_PAGE, patches, Version("0.5.13")) == []


@pytest.mark.parametrize(
    "patches, newest, expected",
    [
        ({"a": _P("a"), "b": _P("b"), "c": _P("c")}, "0.5.13", "names no c (added since"),
        ({"a": _P("a")}, "0.5.13", "names b, which the code no longer has"),
        ({"a": _P("a", "<0.5.13"), "b": _P("b")}, "0.5.13", "`a` is shown applied in 0.5.13, outside its range now"),
        ({"a": _P("a"), "b": _P("b")}, "0.5.14", "the newest release run is 0.5.13, the newest checked is 0.5.14"),
    ],
)
def test_compat_md_outgrown_by_the_code_is_named_with_the_command(patches, newest, expected):
    problems = compat_problems(COMPAT_PAGE, patches, Version(newest))
    assert any(expected in p for p in problems), problems
    assert all(p.startswith("docs/compat.md: ") and p.endswith(REGENERATE_COMPAT) for p in problems)


@pytest.mark.parametrize(
    "patches, newest, expected",
    [
        (
            {"a": _P("a"), "b": _P("b"), "c": _P("c")},
            "0.5.13",
            "no row names c (added since the page was generated): regenerate it (python tools/drift_report.py "
            "--old 0.5.12 --new 0.5.13 --output docs/drift.md)",
        ),
        ({"a": _P("a"), "b": _P("b")}, "0.5.14", "compares up to 0.5.13, the newest checked is 0.5.14"),
    ],
)
def test_drift_md_outgrown_by_the_code_is_named_with_the_command(patches, newest, expected):
    problems = drift_problems(DRIFT_PAGE, patches, Version(newest))
    assert any(expected in p for p in problems), problems
