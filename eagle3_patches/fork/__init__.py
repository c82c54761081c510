"""The fork path: apply the patch set to sglang's source as unified diffs.

``patches/<series>/`` holds one unified diff per registry patch (``<patch name>.patch``, paths relative
to the ``sglang/`` package root), a ``series`` file listing them in order (the registry's: each patch's
``order``) and ``checksums.json`` (the sha256 of every touched file before and after each patch).
The diffs are standard (GNU ``patch -p1`` and ``git apply`` give the same tree; ``series`` is quilt's
format), so any of those tools can apply them.  This package applies them itself because none of
them gives what a production image needs in one step (kept on purpose, not for speed):

* the sglang version (``_version.py`` or the installed dist-info) must be the pinned
  release, and every touched file must hash to a state the series knows (pristine, or
  after some of its patches): anything else is refused, naming the file and the first
  hunk that does not fit;
* idempotent: a patch whose files already hash to its "after" state is reported
  ``already applied`` and left alone; ``revert`` undoes only what is applied;
* atomic: every new file is written to a temporary file next to its target first; the
  originals are hard-linked to backups and a journal is written; only then are the
  temporaries renamed over the targets.  Any error rolls back; a run killed during the
  renames leaves its journal, and the next run (any mode, ``--check`` included) restores
  the backups before doing anything else.

Where the series is found: ``$EAGLE3_PATCHES_SERIES_DIR`` (a directory holding series
directories), then the shipped series: ``patches/`` at the root of a source checkout, or, in an
install, the package data ``eagle3_patches.series`` (the same directory, mapped into the wheel
by ``pyproject.toml``; found with ``importlib.resources``, see :mod:`eagle3_patches._shipped`).

Where things are: :mod:`.diffs` (the unified-diff engine: parse, apply at the recorded lines or at an
offset, make), :mod:`.series` (finding and reading a series, and how it mirrors the registry),
:mod:`.sglang_tree` (the sglang package directory and its release), :mod:`.writing` (the atomic write and
the recovery of an interrupted run), :mod:`.apply` (a run's plan and the entry point, :func:`apply_series`),
:mod:`.checksums` (the maintainer side: ``checksums.json`` and tree digests), :mod:`.common` (:class:`ForkError`
and the digest).  Every name is re-exported here: ``from eagle3_patches import fork; fork.apply_series(...)``.
A seam a test replaces (``_replace``, ``shipped_dir``, ``load_series``, ``default_sglang_root``) is replaced in
the submodule that calls it (:mod:`.writing`, :mod:`.series`, :mod:`.apply`): setting a name here changes
nothing for the code that calls it (``_replace`` is therefore not re-exported).
"""

from __future__ import annotations

from .apply import PatchOutcome, Plan, Report, apply_series, plan
from .checksums import compute_checksums, tree_digest, tree_states, write_checksums
from .common import ForkError, sha256
from .diffs import FileDiff, Hunk, HunkMismatch, apply_hunks, make_unified_diff, parse_unified_diff
from .diffs import _locate as _locate
from .series import (
    CHECKSUMS_FILE,
    DEFAULT_SERIES,
    SERIES_DIR_ENV,
    SERIES_FILE,
    PatchFile,
    Series,
    find_series,
    fork_series_names,
    load_series,
    mirror_problems,
    patch_filename,
    patch_name,
    read_series_names,
    series_search_path,
)
from .sglang_tree import check_sglang_root, default_sglang_root, sglang_tree_version
from .writing import _BAK_SUFFIX as _BAK_SUFFIX
from .writing import _TMP_SUFFIX as _TMP_SUFFIX
from .writing import JOURNAL, recover, write_atomically

__all__ = [
    "CHECKSUMS_FILE",
    "DEFAULT_SERIES",
    "JOURNAL",
    "SERIES_DIR_ENV",
    "SERIES_FILE",
    "FileDiff",
    "ForkError",
    "Hunk",
    "HunkMismatch",
    "PatchFile",
    "PatchOutcome",
    "Plan",
    "Report",
    "Series",
    "apply_hunks",
    "apply_series",
    "check_sglang_root",
    "compute_checksums",
    "default_sglang_root",
    "find_series",
    "fork_series_names",
    "load_series",
    "make_unified_diff",
    "mirror_problems",
    "parse_unified_diff",
    "patch_filename",
    "patch_name",
    "plan",
    "read_series_names",
    "recover",
    "series_search_path",
    "sglang_tree_version",
    "sha256",
    "tree_digest",
    "tree_states",
    "write_atomically",
    "write_checksums",
]
