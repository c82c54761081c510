"""The fork path: apply the patch set to sglang's source as unified diffs.

``patches/<series>/`` holds one unified diff per registry patch (``<patch name>.patch``, paths relative
to the ``sglang/`` package root), a ``series`` file listing them in order (the registry's: each patch's
``order``) and ``checksums.json`` (the sha256 of every touched file before and after each patch).
The diffs are standard (GNU ``patch -p1`` and ``git apply`` give the same tree; ``series`` is quilt's
format), so any of those tools can apply them.  This module applies them itself because none of
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
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import settings
from ._shipped import SERIES_PACKAGE, doc_pointer, shipped_dir
from .errors import Eagle3Error
from .registry import SOURCE_MARKER

DEFAULT_SERIES = "sglang-0.5.9"
SERIES_FILE = "series"
CHECKSUMS_FILE = "checksums.json"
JOURNAL = ".eagle3-patches-journal.json"
SERIES_DIR_ENV = settings.SERIES_DIR
_TMP_SUFFIX = ".eagle3-patches-new"
_BAK_SUFFIX = ".eagle3-patches-orig"

#: os.replace, used for the renames of a run (a seam for the interruption tests)
_replace = os.replace


class ForkError(Eagle3Error):
    """The series cannot be applied to (or reverted from) this sglang tree; nothing was changed."""


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


def default_sglang_root() -> Path:
    """The installed sglang package directory, found without importing sglang."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin or spec.origin in ("namespace", "built-in"):
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        if len(locations) == 1:
            return Path(locations[0])
        raise ForkError(
            "eagle3-patches: sglang is not installed in this Python environment; pass --sglang-root PATH "
            "(the sglang package directory: site-packages/sglang, or python/sglang in a git checkout)"
        )
    return Path(spec.origin).resolve().parent


def check_sglang_root(root: Path) -> Path:
    root = Path(root)
    if (root / "srt").is_dir() and (root / "version.py").is_file():
        return root
    for hint in (root / "python" / "sglang", root / "sglang"):
        if (hint / "srt").is_dir():
            raise ForkError(
                f"eagle3-patches: {root} is not the sglang package directory; did you mean --sglang-root {hint}?"
            )
    raise ForkError(
        f"eagle3-patches: {root} is not an sglang package directory (expected srt/ and version.py in it: "
        "site-packages/sglang, or python/sglang in a git checkout)"
    )


_VERSION_RE = re.compile(r"""^(?:__version__\s*=\s*)?version\s*=\s*['"]([^'"]+)['"]""", re.M)


def sglang_tree_version(root: Path) -> tuple[str | None, str]:
    """(version, where it was read) for the tree at ``root``; (None, why) when it records none."""
    generated = root / "_version.py"
    if generated.is_file():
        m = _VERSION_RE.search(generated.read_text(encoding="utf-8", errors="replace"))
        if m:
            return m.group(1), str(generated)
    for info in sorted(root.parent.glob("sglang-*.dist-info")):
        meta = info / "METADATA"
        if meta.is_file():
            for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip(), str(meta)
    return None, f"no {generated.name} and no sglang-*.dist-info next to {root}"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- unified diffs
@dataclass
class Hunk:
    old_start: int  # 1-based, as in the header
    old_len: int
    new_start: int
    new_len: int
    lines: list[tuple[str, str]]  # (tag ' ', '-', '+', text including its line ending)
    header: str

    def old(self) -> list[str]:
        return [t for tag, t in self.lines if tag in " -"]

    def new(self) -> list[str]:
        return [t for tag, t in self.lines if tag in " +"]


@dataclass
class FileDiff:
    path: str  # relative to the sglang package root
    hunks: list[Hunk]


_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def _strip_prefix(path: str) -> str:
    path = path.split("\t", 1)[0].strip()
    if path.startswith(("a/", "b/")):
        path = path[2:]
    return path


def parse_unified_diff(text: str, source: str = "<diff>") -> list[FileDiff]:
    """Parse a unified diff (``--- a/X`` / ``+++ b/X`` headers, ``\\ No newline`` markers)."""
    lines = text.splitlines(keepends=True)
    files: list[FileDiff] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            new_path = _strip_prefix(lines[i + 1][4:])
            old_path = _strip_prefix(line[4:])
            path = new_path if new_path != "/dev/null" else old_path
            if path == "/dev/null" or os.path.isabs(path) or ".." in Path(path).parts:
                raise ForkError(f"eagle3-patches: {source}: unsupported path {path!r} in the diff header")
            files.append(FileDiff(path, []))
            i += 2
            continue
        m = _HUNK_RE.match(line)
        if m:
            if not files:
                raise ForkError(f"eagle3-patches: {source}:{i + 1}: hunk before any file header")
            old_len = int(m.group(2)) if m.group(2) is not None else 1
            new_len = int(m.group(4)) if m.group(4) is not None else 1
            hunk = Hunk(int(m.group(1)), old_len, int(m.group(3)), new_len, [], line.rstrip("\n"))
            i += 1
            seen_old = seen_new = 0
            while i < len(lines) and (seen_old < old_len or seen_new < new_len or lines[i].startswith("\\")):
                body = lines[i]
                if body.startswith("\\"):  # "\ No newline at end of file": the previous line has no ending
                    if hunk.lines:
                        tag, t = hunk.lines[-1]
                        hunk.lines[-1] = (tag, t.rstrip("\r\n"))
                    i += 1
                    continue
                kind = body[:1] if body[:1] in (" ", "-", "+") else (" " if body in ("\n", "\r\n") else None)
                if kind is None:
                    raise ForkError(f"eagle3-patches: {source}:{i + 1}: malformed hunk line {body!r}")
                text_ = body[1:] if body[:1] in (" ", "-", "+") else body
                hunk.lines.append((kind, text_))
                if kind in " -":
                    seen_old += 1
                if kind in " +":
                    seen_new += 1
                i += 1
            if seen_old != old_len or seen_new != new_len:
                raise ForkError(
                    f"eagle3-patches: {source}: hunk {hunk.header} has {seen_old} old and {seen_new} new "
                    f"line(s), its header says {old_len} and {new_len} (truncated, or edited by hand)"
                )
            files[-1].hunks.append(hunk)
            continue
        i += 1
    return files


class HunkMismatch(Exception):
    def __init__(self, index: int, hunk: Hunk):
        self.index, self.hunk = index, hunk
        super().__init__(f"hunk #{index + 1} ({hunk.header})")


def apply_hunks(lines: list[str], hunks: list[Hunk], *, reverse: bool = False, exact: bool = True) -> list[str]:
    """Apply ``hunks`` to ``lines`` (keepends); exact position unless ``exact`` is False (then offsets)."""
    out: list[str] = []
    pos = 0  # next line of ``lines`` not yet copied
    delta = 0
    for index, hunk in enumerate(hunks):
        old, new = (hunk.new(), hunk.old()) if reverse else (hunk.old(), hunk.new())
        start = (hunk.new_start if reverse else hunk.old_start) - 1
        if not old:  # pure insertion: the header's start is the line after which to insert
            start += 1
        expected = start + delta if not exact else start
        where = _locate(lines, old, expected, pos, exact)
        if where is None:
            raise HunkMismatch(index, hunk)
        out.extend(lines[pos:where])
        out.extend(new)
        pos = where + len(old)
        delta = where - start
    out.extend(lines[pos:])
    return out


def _locate(lines: list[str], block: list[str], expected: int, lower: int, exact: bool) -> int | None:
    def fits(at: int) -> bool:
        return lower <= at and at + len(block) <= len(lines) and lines[at : at + len(block)] == block

    expected = max(expected, 0)
    if fits(expected):
        return expected
    if exact:
        return None
    for offset in range(1, len(lines) + 1):
        for at in (expected - offset, expected + offset):
            if fits(at):
                return at
        if expected - offset < lower and expected + offset > len(lines):
            break
    return None


def make_unified_diff(path: str, before: bytes, after: bytes, context: int = 3) -> str:
    """A unified diff of one file, headers ``a/<path>`` / ``b/<path>`` (paths relative to the sglang root)."""
    a = before.decode("utf-8").splitlines(keepends=True)
    b = after.decode("utf-8").splitlines(keepends=True)
    out = []
    for line in difflib.unified_diff(a, b, f"a/{path}", f"b/{path}", n=context):
        if line.endswith("\n"):
            out.append(line)
        else:  # last line of a file without a final newline
            out.append(line + "\n\\ No newline at end of file\n")
    return "".join(out)


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


# --------------------------------------------------------------------------- planning
@dataclass
class PatchOutcome:
    name: str
    filename: str
    state: str  # "applicable", "applied", "already applied", "revertible", "reverted", "not applied"
    files: list[str]


@dataclass
class Plan:
    root: Path
    series: Series
    revert: bool
    version: str | None
    version_source: str
    outcomes: list[PatchOutcome] = field(default_factory=list)
    writes: dict[str, bytes] = field(default_factory=dict)  # path -> new content
    originals: dict[str, bytes] = field(default_factory=dict)
    recovered: list[str] = field(default_factory=list)

    @property
    def changes(self) -> bool:
        return bool(self.writes)


def _describe(root: Path, path: str) -> str:
    return str(root / path)


def plan(root: Path, series: Series, *, revert: bool = False) -> Plan:
    root = check_sglang_root(Path(root))
    version, source = sglang_tree_version(root)
    if version is not None and version != series.sglang_version:
        raise ForkError(
            f"eagle3-patches: the series {series.name} is for sglang {series.sglang_version}, but {root} is sglang "
            f"{version} (read from {source}); nothing was changed. Use the series for that release, or the runtime "
            "patches (`eagle3-patches run`), which probe the installed release."
        )
    result = Plan(root, series, revert, version, source)
    contents: dict[str, bytes] = {}
    levels: dict[str, int] = {}
    for path in series.touched():
        file = root / path
        if not file.is_file():
            raise ForkError(
                f"eagle3-patches: {_describe(root, path)} does not exist; {root} is not a complete sglang "
                f"{series.sglang_version} tree; nothing was changed"
            )
        data = file.read_bytes()
        result.originals[path] = data
        contents[path] = data
        digest = sha256(data)
        states = [s for _, s in series.chain(path)]
        if digest not in states:
            _refuse_unknown(root, series, path, data, revert)
        levels[path] = states.index(digest)

    ordered = list(reversed(series.patches)) if revert else series.patches
    for patch in ordered:
        applied_files: list[FileDiff] = []
        pending_files: list[FileDiff] = []
        for fd in patch.files:
            position = [n for n, _ in series.chain(fd.path)].index(patch.name)
            (applied_files if levels[fd.path] >= position else pending_files).append(fd)
        names = [fd.path for fd in patch.files]
        if not revert:
            if not pending_files:
                result.outcomes.append(PatchOutcome(patch.name, patch.filename, "already applied", names))
                continue
            for fd in pending_files:
                contents[fd.path] = _transform(root, patch, fd, contents[fd.path], reverse=False)
            result.outcomes.append(PatchOutcome(patch.name, patch.filename, "applicable", names))
        else:
            if not applied_files:
                result.outcomes.append(PatchOutcome(patch.name, patch.filename, "not applied", names))
                continue
            for fd in applied_files:
                contents[fd.path] = _transform(root, patch, fd, contents[fd.path], reverse=True)
            result.outcomes.append(PatchOutcome(patch.name, patch.filename, "revertible", names))
    if revert:
        result.outcomes.reverse()
    result.writes = {p: c for p, c in contents.items() if c != result.originals[p]}
    return result


def _transform(root: Path, patch: PatchFile, fd: FileDiff, data: bytes, *, reverse: bool) -> bytes:
    lines = data.decode("utf-8").splitlines(keepends=True)
    try:
        new = "".join(apply_hunks(lines, fd.hunks, reverse=reverse)).encode("utf-8")
    except HunkMismatch as exc:  # the checksum matched, so the series itself is inconsistent
        raise ForkError(
            f"eagle3-patches: {patch.filename} {exc} does not fit {_describe(root, fd.path)} although its "
            "checksum matches: the series is inconsistent (regenerate it with tools/regen_patch.py)"
        ) from None
    want = patch.checksums[fd.path]["before" if reverse else "after"]
    if sha256(new) != want:
        raise ForkError(
            f"eagle3-patches: {patch.filename} applied to {_describe(root, fd.path)} does not give the "
            "recorded checksum: the series is inconsistent (regenerate it with tools/regen_patch.py)"
        )
    return new


def _refuse_unknown(root: Path, series: Series, path: str, data: bytes, revert: bool) -> None:
    """The file is in none of the states the series knows: name the first hunk that does not fit."""
    misfit = _first_misfit(series, path, data.decode("utf-8", errors="replace").splitlines(keepends=True))
    if misfit:
        detail = f"; {misfit} does not fit it (neither its old nor its new text is there, even at an offset)"
    else:
        detail = (
            "; every hunk of the series fits, so it was changed outside the lines the series touches "
            "(a local edit, or another sglang build)"
        )
    raise ForkError(
        f"eagle3-patches: {_describe(root, path)} differs from sglang {series.sglang_version} as released and from "
        f"every state the series {series.name} produces (sha256 {sha256(data)[:16]}...){detail}. Nothing was "
        + ("reverted" if revert else "written")
        + ". Reinstall sglang (pip install --force-reinstall --no-deps sglang=="
        + f"{series.sglang_version}) or check out the release tag, then run again; to carry local edits, "
        "regenerate the series with tools/regen_patch.py."
    )


def _first_misfit(series: Series, path: str, lines: list[str]) -> str | None:
    """The first hunk of ``path``'s diffs that fits neither way at any offset ("<file> hunk #N (...)"), or None."""
    current = lines
    for patch, fd in ((p, fd) for p in series.patches for fd in p.files if fd.path == path):
        try:  # already applied here?
            apply_hunks(current, fd.hunks, reverse=True, exact=False)
            continue  # keep the patched text: later patches of the file build on it
        except HunkMismatch:
            pass
        try:
            current = apply_hunks(current, fd.hunks, exact=False)
        except HunkMismatch as exc:
            return f"{patch.filename} {exc}"
    return None


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


# --------------------------------------------------------------------------- the entry point
@dataclass
class Report:
    root: Path
    series: str
    mode: str  # "check", "apply", "revert", "check-revert"
    version: str | None
    version_source: str
    outcomes: list[PatchOutcome]
    changed: list[str]
    recovered: list[str]

    def lines(self) -> list[str]:
        out = []
        if self.recovered:
            out.append(f"recovered from an interrupted run: restored {', '.join(self.recovered)}")
        version = self.version or "unrecorded"
        out.append(
            f"sglang {version} at {self.root} ({self.version_source if self.version else 'identified by checksums'})"
        )
        verbs = {"applicable": "would apply", "revertible": "would revert"}  # a dry run's states; a run's are its own
        for o in self.outcomes:
            verb = verbs.get(o.state, o.state)
            out.append(f"  {o.filename:<40} {verb:<16} {', '.join(o.files)}")
        if self.mode in ("check", "check-revert"):
            out.append(
                f"dry run: {len(self.changed)} file(s) would change" if self.changed else "dry run: nothing to change"
            )
        else:
            out.append(f"{len(self.changed)} file(s) changed" if self.changed else "nothing changed")
        return out


def apply_series(
    sglang_root: str | Path | None = None,
    series: str | Path = DEFAULT_SERIES,
    *,
    check: bool = False,
    revert: bool = False,
    upto: str | None = None,
    out: Callable[[str], None] | None = None,
) -> Report:
    """Apply (or, with ``revert``, remove) the series on the sglang tree at ``sglang_root``.

    ``check``: plan only, write nothing (an interrupted earlier run is still recovered first).
    ``upto``: only the series' patches up to and including this one (a patch name or file name).
    Raises :class:`ForkError` (nothing changed) when the tree is not what the series expects.
    """
    root = check_sglang_root(Path(sglang_root) if sglang_root is not None else default_sglang_root())
    loaded = load_series(series)
    if upto is not None:
        last = next((i for i, p in enumerate(loaded.patches) if upto in (p.name, p.filename)), None)
        if last is None:
            raise ForkError(
                f"eagle3-patches: no patch {upto!r} in the series {loaded.name}: "
                + ", ".join(p.filename for p in loaded.patches)
            )
        loaded.patches = loaded.patches[: last + 1]
    recovered = recover(root)
    p = plan(root, loaded, revert=revert)
    if not check and p.writes:
        try:
            write_atomically(root, p.writes)
        except PermissionError as exc:
            raise ForkError(
                f"eagle3-patches: cannot write in {root} ({exc}); nothing was changed. Run as the owner "
                f"of the sglang installation (or apply to a copy, see {doc_pointer('fork')})"
            ) from None
    mode = ("check-revert" if revert else "check") if check else ("revert" if revert else "apply")
    if not check and not revert:
        for o in p.outcomes:
            if o.state == "applicable":
                o.state = "applied"
    if not check and revert:
        for o in p.outcomes:
            if o.state == "revertible":
                o.state = "reverted"
    report = Report(root, loaded.name, mode, p.version, p.version_source, p.outcomes, sorted(p.writes), recovered)
    if out is not None:
        for line in report.lines():
            out(line)
    return report


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
