"""A run: its plan (what each patch's state is, which files change, or why the tree is refused) and the
entry point, :func:`apply_series`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .._shipped import doc_pointer
from .common import ForkError, sha256
from .diffs import FileDiff, HunkMismatch, apply_hunks
from .series import DEFAULT_SERIES, PatchFile, Series, load_series
from .sglang_tree import check_sglang_root, default_sglang_root, sglang_tree_version
from .writing import recover, write_atomically


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
        todo, nothing_to_do, to_do = (
            (applied_files, "not applied", "revertible") if revert else (pending_files, "already applied", "applicable")
        )
        if not todo:
            result.outcomes.append(PatchOutcome(patch.name, patch.filename, nothing_to_do, names))
            continue
        for fd in todo:
            contents[fd.path] = _transform(root, patch, fd, contents[fd.path], reverse=revert)
        result.outcomes.append(PatchOutcome(patch.name, patch.filename, to_do, names))
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
    # pragma: no mutate eagle3/IgnoreArgument `not False:`: in a revert the plan (`plan(..., revert=True)`) gives each
    # patch `not applied` or `revertible`, never `applicable`, so the loop that marks `applicable` patches `applied`
    # finds none to mark: the same report
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
