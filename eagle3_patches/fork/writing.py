"""The atomic write of a run, and the recovery of a run killed during it.

Every file of a run is replaced, or none: the journal (the list of the files) is written first; every new
file is written to a temporary file next to its target; the originals are hard-linked (or, without hard
links, copied) to backups; only then are the temporaries renamed over the targets, through :data:`_replace`.
Any error rolls back; a run killed during the renames leaves its journal, and the next run (any mode,
``--check`` included) restores the backups (:func:`recover`) before doing anything else.

The interruption tests replace :data:`_replace` on this module (``eagle3_patches.fork.writing``): the name
the package re-exports is a copy, and setting it there changes nothing.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from .common import ForkError

JOURNAL = ".eagle3-patches-journal.json"
_TMP_SUFFIX = ".eagle3-patches-new"
_BAK_SUFFIX = ".eagle3-patches-orig"

#: os.replace, used for the renames of a run (a seam for the interruption tests)
_replace = os.replace


# --------------------------------------------------------------------------- writing
def _journal_path(root: Path) -> Path:
    return root / JOURNAL


def recover(root: Path) -> list[str]:
    """Finish the rollback of a run that was interrupted during its renames; the files restored."""
    root = Path(root)
    journal = _journal_path(root)
    if not journal.is_file():
        return []
    try:
        entries = json.loads(journal.read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError) as exc:
        raise ForkError(
            f"eagle3-patches: {journal} is left from an interrupted run but unreadable ({exc}); restore "
            f"the *{_BAK_SUFFIX} files next to the sglang sources by hand, then delete it"
        ) from None
    restored = []
    for path in entries:
        target = root / path
        bak = target.with_name(target.name + _BAK_SUFFIX)
        tmp = target.with_name(target.name + _TMP_SUFFIX)
        if bak.exists():
            if target.exists() and os.path.samefile(bak, target):
                bak.unlink()  # never replaced: the backup is a link to the original itself
            else:
                os.replace(bak, target)
                restored.append(path)
        if tmp.exists():
            tmp.unlink()
    journal.unlink()
    return restored


def write_atomically(root: Path, writes: dict[str, bytes]) -> None:
    """Replace every file of ``writes`` or none (see the module docstring)."""
    root = Path(root)
    staged: list[tuple[Path, Path, Path]] = []  # (target, tmp, bak)
    journal = _journal_path(root)
    done: list[tuple[Path, Path]] = []
    try:
        # the journal first: whatever a kill leaves behind (temporaries, backups, some renames)
        # is listed in it, and recover() undoes it
        with open(journal, "w", encoding="utf-8") as fh:
            json.dump({"files": list(writes)}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        for path, data in writes.items():
            target = root / path
            tmp = target.with_name(target.name + _TMP_SUFFIX)
            bak = target.with_name(target.name + _BAK_SUFFIX)
            staged.append((target, tmp, bak))
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, os.stat(target).st_mode & 0o7777)
        for target, _, bak in staged:
            if bak.exists():
                bak.unlink()
            try:
                os.link(target, bak)  # the original stays reachable until the journal is gone
            except OSError:  # a file system without hard links
                shutil.copy2(target, bak)
        for target, tmp, bak in staged:
            _replace(tmp, target)
            done.append((target, bak))
    except BaseException:
        for target, bak in reversed(done):
            os.replace(bak, target)
        for _target, tmp, bak in staged:
            for leftover in (tmp, bak):
                try:
                    leftover.unlink()
                except FileNotFoundError:
                    pass
        try:
            journal.unlink()
        except FileNotFoundError:
            pass
        raise
    journal.unlink()
    for _, _, bak in staged:
        bak.unlink()
    for target, _, _ in staged:
        _drop_bytecode(target)


def _drop_bytecode(target: Path) -> None:
    cache = target.parent / "__pycache__"
    if cache.is_dir():
        for pyc in cache.glob(f"{target.stem}.*.pyc"):
            try:
                pyc.unlink()
            except OSError:
                pass
