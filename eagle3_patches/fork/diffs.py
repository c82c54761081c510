"""The diff engine: parse unified diffs, apply their hunks (at the recorded lines, or at an offset), and
make them."""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .common import ForkError


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
    # pragma: no mutate core/NumberReplacer `2`: only the text before the first tab is kept: splitting at more tabs
    # leaves the first piece the same
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
            # pragma: no mutate core/NumberReplacer `3`: the header is `+++ ` followed by the path: cutting 3 characters
            # leaves the space, which `_strip_prefix` strips before looking at the path
            new_path = _strip_prefix(lines[i + 1][4:])
            # pragma: no mutate core/NumberReplacer `3`: the header is `+++ ` followed by the path: cutting 3 characters
            # leaves the space, which `_strip_prefix` strips before looking at the path for `--- `
            old_path = _strip_prefix(line[4:])
            path = new_path if new_path != "/dev/null" else old_path
            if path == "/dev/null" or os.path.isabs(path) or ".." in Path(path).parts:
                raise ForkError(f"eagle3-patches: {source}: unsupported path {path!r} in the diff header")
            files.append(FileDiff(path, []))
            # pragma: no mutate core/NumberReplacer `1`: the line after a `--- ` header is its `+++ ` line, which is
            # neither a `--- ` header nor a hunk header: the loop steps over it by one anyway
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
    # pragma: no mutate core/NumberReplacer `(0`: offset 0 tries `expected` twice more, which `fits` refused just before
    # the loop
    for offset in range(1, len(lines) + 1):
        for at in (expected - offset, expected + offset):
            if fits(at):
                return at
        # pragma: no mutate core/ReplaceComparisonOperator_Gt_GtE: `_locate`'s stop: the candidate at `lower` was tried
        # in this very iteration, before the test; every later one above is below `lower` and cannot fit, so stopping
        # one iteration sooner finds the same , below the block: the candidate at `len(lines)` was tried in this
        # iteration; every later one starts past the end
        # pragma: no mutate core/ReplaceComparisonOperator_Lt_LtE: `_locate`'s stop: the candidate at `lower` was tried
        # in this very iteration, before the test; every later one above is below `lower` and cannot fit, so stopping
        # one iteration sooner finds the same
        # pragma: no mutate eagle3/DropGuard: without the stop the loop runs to its end and returns `None` as the
        # `break` does (only slower): every later candidate is below `lower` or past the end
        if expected - offset < lower and expected + offset > len(lines):
            # pragma: no mutate core/ReplaceBreakWithContinue: `_locate`'s stop: once both sides are past `lower` and
            # the end, every remaining candidate fails `fits`, so running the loop to its end returns `None` as the
            # `break` does (only slower)
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
