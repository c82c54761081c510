"""The patch series: where it is found, reading it (its ``series`` file, its diffs and ``checksums.json``),
and how it mirrors the registry.

Where a series is found: ``$EAGLE3_PATCHES_SERIES_DIR`` (a directory holding series directories), then the
shipped series (the package data ``eagle3_patches.series``; see :mod:`eagle3_patches.fork`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .. import settings
from .._shipped import SERIES_PACKAGE, shipped_dir
from ..registry import SOURCE_MARKER
from .common import ForkError
from .diffs import FileDiff, parse_unified_diff

DEFAULT_SERIES = "sglang-0.5.9"
SERIES_FILE = "series"
CHECKSUMS_FILE = "checksums.json"
SERIES_DIR_ENV = settings.SERIES_DIR


# --------------------------------------------------------------------------- locating things
def series_search_path() -> list[Path]:
    paths = []
    env = settings.current().series_dir
    if env:
        paths.append(Path(env))
    shipped = shipped_dir(SERIES_PACKAGE)
    if shipped is not None:
        paths.append(shipped)
    return paths


def find_series(name: str = DEFAULT_SERIES) -> Path:
    """The directory of series ``name`` (holding ``series`` and ``checksums.json``)."""
    candidate = Path(name)
    if candidate.is_absolute() or os.sep in name:
        if (candidate / SERIES_FILE).is_file():
            return candidate
        raise ForkError(f"eagle3-patches: {candidate} is not a patch series directory (no {SERIES_FILE} file in it)")
    search = series_search_path()
    tried = []
    for base in search:
        d = base / name
        tried.append(str(d))
        if (d / SERIES_FILE).is_file():
            return d
    if shipped_dir(SERIES_PACKAGE) is None:
        tried.append(f"the package data {SERIES_PACKAGE} (missing from this install of eagle3-patches: reinstall it)")
    known = sorted({p.name for base in search if base.is_dir() for p in base.iterdir() if (p / SERIES_FILE).is_file()})
    raise ForkError(
        f"eagle3-patches: no patch series {name!r}; looked in {', '.join(tried)}"
        + (f"; known series: {', '.join(known)}" if known else "")
        + f" (set {SERIES_DIR_ENV} to a directory holding series directories)"
    )


# --------------------------------------------------------------------------- the series
@dataclass
class PatchFile:
    filename: str  # <name>.patch
    name: str  # the registry patch name
    files: list[FileDiff]
    checksums: dict[str, dict[str, str]]  # path -> {"before": sha, "after": sha}


@dataclass
class Series:
    name: str
    directory: Path
    sglang_version: str
    patches: list[PatchFile]
    pristine: dict[str, str]  # path -> sha256 of the release's file

    def touched(self) -> list[str]:
        seen: list[str] = []
        for p in self.patches:
            for f in p.files:
                if f.path not in seen:
                    seen.append(f.path)
        return seen

    def chain(self, path: str) -> list[tuple[str | None, str]]:
        """[(patch name or None for the release, sha256)] of ``path``'s states, in series order."""
        states: list[tuple[str | None, str]] = [(None, self.pristine[path])]
        for p in self.patches:
            if path in p.checksums:
                states.append((p.name, p.checksums[path]["after"]))
        return states


def read_series_names(directory: Path) -> list[str]:
    names = []
    for raw in (directory / SERIES_FILE).read_text(encoding="utf-8").splitlines():
        # pragma: no mutate core/NumberReplacer `2`: only the text before the first `#` is kept: splitting at more
        # leaves the first piece the same
        line = raw.split("#", 1)[0].strip()
        if line:
            names.append(line)
    return names


def patch_name(filename: str) -> str:
    """The patch a diff file is named after: ``<name>.patch`` (:func:`patch_filename`).  A leading ``NN-`` is
    dropped too, so a series written when the files were numbered still reads (a registry name never starts
    with a digit)."""
    return re.sub(r"^\d+-", "", filename).removesuffix(".patch")


def patch_filename(name: str) -> str:
    """The file of patch ``name``'s diff in a series directory."""
    return f"{name}.patch"


def load_series(name_or_dir: str | Path = DEFAULT_SERIES) -> Series:
    directory = find_series(str(name_or_dir))
    try:
        sums = json.loads((directory / CHECKSUMS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ForkError(
            f"eagle3-patches: {directory / CHECKSUMS_FILE} is missing or unreadable ({exc}); "
            "regenerate it with tools/regen_patch.py --checksums-only"
        ) from None
    patches = []
    for filename in read_series_names(directory):
        path = directory / filename
        if not path.is_file():
            raise ForkError(f"eagle3-patches: {directory / SERIES_FILE} lists {filename}, which is not in {directory}")
        files = parse_unified_diff(path.read_text(encoding="utf-8"), str(path))
        entry = sums.get("patches", {}).get(filename)
        if entry is None or set(entry.get("files", {})) != {f.path for f in files}:
            raise ForkError(
                f"eagle3-patches: {directory / CHECKSUMS_FILE} does not describe {filename} "
                "(regenerate it with tools/regen_patch.py --checksums-only)"
            )
        patches.append(PatchFile(filename, entry.get("name") or patch_name(filename), files, entry["files"]))
    return Series(directory.name, directory, sums["sglang_version"], patches, dict(sums["pristine"]))


# --------------------------------------------------------------------------- the series and the registry
def fork_series_names(patches: Iterable, version: str) -> list[str]:
    """The patches a series for sglang ``version`` carries, in order: those of ``patches`` (a registry's, in its
    order) that are in the fork series (``in_fork_series``) and whose range covers ``version``."""
    from packaging.version import Version

    return [p.name for p in patches if p.in_fork_series and p.covers(Version(version))]


def mirror_problems(series: Series, patches: Iterable) -> list[str]:
    """How ``series`` fails to mirror the registry ``patches`` (empty when it mirrors it): ``series`` lists exactly
    :func:`fork_series_names` for its release, in that order, each diff named :func:`patch_filename`, and its
    directory holds no other diff; each diff touches its patch's own sglang module only, leaves the patch's
    marker comment there and does not use eagle3_patches (a patched sglang runs without the library)."""
    patches = list(patches)
    wanted = fork_series_names(patches, series.sglang_version)
    listed = [p.name for p in series.patches]
    problems = []
    if listed != wanted:
        problems.append(
            f"{series.directory / SERIES_FILE} lists {listed}; the registry's fork-series fixes for "
            f"sglang {series.sglang_version}, in registry order, are {wanted}"
        )
    listed_files = {p.filename for p in series.patches}
    stray = sorted(f.name for f in series.directory.glob("*.patch") if f.name not in listed_files)
    if stray:
        problems.append(f"{series.directory} holds diffs its {SERIES_FILE} does not list: {', '.join(stray)}")
    modules = {p.name: p.module for p in patches}
    for patch in series.patches:
        if patch.filename != patch_filename(patch.name):
            problems.append(f"{patch.filename}: the diff of {patch.name} is named {patch_filename(patch.name)}")
        if patch.name not in modules:
            continue  # not a registry patch: named above
        rel = modules[patch.name].removeprefix("sglang.").replace(".", "/") + ".py"
        touched = [f.path for f in patch.files]
        if touched != [rel]:
            problems.append(f"{patch.filename} touches {', '.join(touched)}; {patch.name} patches {rel} only")
        added = "".join(t for f in patch.files for h in f.hunks for tag, t in h.lines if tag == "+")
        marker = f"# {SOURCE_MARKER.format(name=patch.name)}"
        if marker not in added:
            problems.append(f"{patch.filename} does not add the marker comment `{marker}`")
        if "eagle3_patches" in added.replace("eagle3-patches", ""):
            problems.append(f"{patch.filename} uses eagle3_patches: a patched sglang must run without the library")
    return problems
