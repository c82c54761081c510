"""The maintainer side: a series' ``checksums.json``, chained from the release's files
(tools/regen_patch.py), the states of the touched files, and the digest of a whole tree."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .common import ForkError, sha256
from .diffs import HunkMismatch, apply_hunks, parse_unified_diff
from .series import CHECKSUMS_FILE, Series, patch_name, read_series_names


# --------------------------------------------------------------------------- maintainer side
def tree_states(series: Series, pristine: dict[str, bytes]) -> list[dict[str, bytes]]:
    """The touched files after 0, 1, ... n patches of ``series``, from the release's contents."""
    states = [dict(pristine)]
    current = dict(pristine)
    for patch in series.patches:
        for fd in patch.files:
            lines = current[fd.path].decode("utf-8").splitlines(keepends=True)
            try:
                current[fd.path] = "".join(apply_hunks(lines, fd.hunks)).encode("utf-8")
            except HunkMismatch as exc:
                raise ForkError(
                    f"eagle3-patches: {patch.filename} {exc} does not fit {fd.path} after the patches "
                    "before it; regenerate it"
                ) from None
        states.append(dict(current))
    return states


def compute_checksums(directory: Path, pristine_root: Path, sglang_version: str) -> dict:
    """checksums.json for the series in ``directory``, chaining its diffs from the release at ``pristine_root``."""
    names = read_series_names(directory)
    diffs = [(n, parse_unified_diff((directory / n).read_text(encoding="utf-8"), n)) for n in names]
    current: dict[str, bytes] = {}
    pristine: dict[str, str] = {}
    entries: dict[str, dict] = {}
    for filename, files in diffs:
        entry: dict[str, Any] = {"name": patch_name(filename), "files": {}}
        for fd in files:
            if fd.path not in current:
                data = (Path(pristine_root) / fd.path).read_bytes()
                current[fd.path] = data
                pristine[fd.path] = sha256(data)
            before = current[fd.path]
            try:
                after = "".join(apply_hunks(before.decode("utf-8").splitlines(keepends=True), fd.hunks)).encode("utf-8")
            except HunkMismatch as exc:
                raise ForkError(
                    f"eagle3-patches: {filename} {exc} does not fit {fd.path} after the patches before "
                    "it; regenerate that patch first"
                ) from None
            current[fd.path] = after
            entry["files"][fd.path] = {"before": sha256(before), "after": sha256(after)}
        entries[filename] = entry
    return {"sglang_version": sglang_version, "pristine": pristine, "patches": entries}


def write_checksums(directory: Path, data: dict) -> None:
    (Path(directory) / CHECKSUMS_FILE).write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def tree_digest(root: Path, ignore: Iterable[str] = ("__pycache__",)) -> dict[str, str]:
    """sha256 of every file under ``root`` (relative path -> digest), skipping ``ignore`` directories."""
    root = Path(root)
    digests = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ignore)
        for f in sorted(filenames):
            full = Path(dirpath) / f
            digests[str(full.relative_to(root))] = sha256(full.read_bytes())
    return digests
