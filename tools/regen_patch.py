#!/usr/bin/env python3
"""Regenerate one fork-path diff from an edited sglang tree, and checksums.json (maintainers).

    # 1. a tree at the state *after* the patch: the release + the series up to and including it
    python tools/make_fork_tree.py /tmp/edit --upto eagle3_draft_strict_loading
    # 2. edit /tmp/edit/sglang/srt/models/llama_eagle3.py (keep the `# eagle3-patches: <name>` marker)
    # 3. rewrite the diff from (release + earlier patches) -> edited file, and every checksum
    python tools/regen_patch.py eagle3_draft_strict_loading \\
        --edited /tmp/edit/sglang --pristine /tmp/sglang-0.5.9/sglang

    python tools/regen_patch.py --checksums-only --pristine PATH   # after editing a .patch by hand

The "before" side of a diff is never taken from the edited tree: it is the release's file
(--pristine, default the installed sglang when it is the unmodified release) with the
series' earlier patches applied, so a diff only ever contains its own change.  Each diff is
`<patch name>.patch`; `series` alone orders them.  A new patch (not yet in the series) needs
--file for every file it touches; its line goes into `series` where its registry `order` puts it
(before the first listed patch the registry orders after it).  Later patches of the same file
must still fit; the tool says which to regenerate if not.
Review the new diff (git diff patches/) before committing it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from eagle3_patches import fork  # noqa: E402
from eagle3_patches.errors import Eagle3Error  # noqa: E402
from eagle3_patches.registry import SOURCE_MARKER  # noqa: E402


def pristine_root(arg: str | None, series_dir: Path) -> Path:
    import json

    sums = (
        json.loads((series_dir / fork.CHECKSUMS_FILE).read_text())
        if (series_dir / fork.CHECKSUMS_FILE).is_file()
        else {}
    )
    root = Path(arg) if arg else fork.default_sglang_root()
    fork.check_sglang_root(root)
    version, source = fork.sglang_tree_version(root)
    wanted = sums.get("sglang_version")
    if version and wanted and version != wanted:
        raise fork.ForkError(f"eagle3-patches: {root} is sglang {version} ({source}), the series is for {wanted}")
    for path, digest in sums.get("pristine", {}).items():
        if fork.sha256((root / path).read_bytes()) != digest:
            raise fork.ForkError(
                f"eagle3-patches: {root / path} is not the released file (checksum differs); pass --pristine with an "
                f"unmodified sglang {wanted} (pip download --no-deps sglang=={wanted}; unzip the wheel)"
            )
    return root


def regen(name: str, edited: Path, pristine: Path, series_dir: Path, extra_files: list[str], version: str) -> Path:
    names = fork.read_series_names(series_dir)
    by_name = {fork.patch_name(n): n for n in names}
    filename = by_name.get(name)
    new_patch = filename is None
    if new_patch:
        if not extra_files:
            raise fork.ForkError(
                f"eagle3-patches: {name} is not in {series_dir / fork.SERIES_FILE}; a new patch needs --file"
            )
        filename = fork.patch_filename(name)
        successor = next_in_series(name, list(by_name))
        above = by_name[successor] if successor else None  # the file its line goes above (None: the end)
        names.insert(names.index(above) if above else len(names), filename)
    index = names.index(filename)
    current: dict[str, bytes] = {}
    own_files: list[str] = []
    for n in names[: index + 1]:
        diff_path = series_dir / n
        diffs = fork.parse_unified_diff(diff_path.read_text(encoding="utf-8"), n) if diff_path.is_file() else []
        for fd in diffs:
            if fd.path not in current:
                current[fd.path] = (pristine / fd.path).read_bytes()
            if n == filename:
                own_files.append(fd.path)
                continue  # the before side of the regenerated patch
            lines = current[fd.path].decode("utf-8").splitlines(keepends=True)
            try:
                current[fd.path] = "".join(fork.apply_hunks(lines, fd.hunks)).encode("utf-8")
            except fork.HunkMismatch as exc:
                raise fork.ForkError(
                    f"eagle3-patches: {n} {exc} does not fit {fd.path}; regenerate {n} first"
                ) from None
    files = list(dict.fromkeys(own_files + list(extra_files)))
    marker = SOURCE_MARKER.format(name=name)
    chunks = []
    for path in files:
        before = current.get(path) or (pristine / path).read_bytes()
        after = (edited / path).read_bytes()
        if marker.encode() not in after:
            raise fork.ForkError(
                f"eagle3-patches: {edited / path} lacks the marker comment `# {marker}`: the registry "
                "would patch at run time on top of the fork; add it next to the change"
            )
        if before == after:
            print(f"note: {path} is unchanged by {name}; left out of the diff", file=sys.stderr)
            continue
        chunks.append(fork.make_unified_diff(path, before, after))
    if not chunks:
        raise fork.ForkError(f"eagle3-patches: the edited tree does not change anything for {name}")
    out = series_dir / filename
    out.write_text("".join(chunks), encoding="utf-8")
    if new_patch:
        insert_in_series(series_dir, filename, above)
    fork.write_checksums(series_dir, fork.compute_checksums(series_dir, pristine, version))
    return out


def next_in_series(name: str, listed: list[str]) -> str | None:
    """The first of the series' patches ``listed`` that the registry orders after patch ``name`` (None: it goes last).
    ``name`` must be a patch of the registry (its ``order`` places it)."""
    import eagle3_patches

    registry = eagle3_patches.get_registry()
    if name not in registry:
        raise fork.ForkError(
            f"eagle3-patches: {name} is not a patch of the registry ({', '.join(registry.names())}); "
            "add its module under eagle3_patches/patches/ first: its `order` places it in the series"
        )
    order = registry.names()
    after = [n for n in listed if n in order and order.index(n) > order.index(name)]
    return min(after, key=order.index) if after else None


def insert_in_series(series_dir: Path, filename: str, before: str | None) -> None:
    """Put ``filename`` on its own line of ``series``, just above the line of ``before`` (None: at the end)."""
    path = series_dir / fork.SERIES_FILE
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    at = next((i for i, raw in enumerate(lines) if before and raw.split("#", 1)[0].strip() == before), None)
    if at is None:
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        lines.append(filename + "\n")
    else:
        lines.insert(at, filename + "\n")
    path.write_text("".join(lines), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="regen_patch.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("name", nargs="?", help="the registry patch name (e.g. eagle3_fc_guard)")
    parser.add_argument("--edited", type=Path, help="the edited sglang package dir, at the state after the patch")
    parser.add_argument(
        "--pristine", help="an unmodified sglang package dir of the pinned release (default: installed)"
    )
    parser.add_argument(
        "--series", default=fork.DEFAULT_SERIES, help=f"series name or directory (default {fork.DEFAULT_SERIES})"
    )
    parser.add_argument(
        "--file",
        action="append",
        default=[],
        metavar="REL",
        help="a file (relative to the sglang root, e.g. srt/models/x.py) the patch touches; repeatable",
    )
    parser.add_argument("--checksums-only", action="store_true", help="only recompute checksums.json")
    parser.add_argument(
        "--sglang-version", default=None, help="the release the series is for (default: from checksums.json)"
    )
    args = parser.parse_args(argv)
    try:
        series_dir = fork.find_series(args.series)
        pristine = pristine_root(args.pristine, series_dir)
        version = args.sglang_version or fork.sglang_tree_version(pristine)[0]
        if version is None:
            raise fork.ForkError("eagle3-patches: cannot tell the pristine tree's version; pass --sglang-version")
        if args.checksums_only:
            fork.write_checksums(series_dir, fork.compute_checksums(series_dir, pristine, version))
            print(f"wrote {series_dir / fork.CHECKSUMS_FILE}")
            return 0
        if not args.name or args.edited is None:
            parser.error("NAME and --edited are required (or --checksums-only)")
        out = regen(args.name, args.edited, pristine, series_dir, args.file, version)
        print(f"wrote {out} and {series_dir / fork.CHECKSUMS_FILE}; review with `git diff {out.parent}`")
        return 0
    except Eagle3Error as exc:
        print(str(exc), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
