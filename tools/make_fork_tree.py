#!/usr/bin/env python3
"""Make a patched copy of sglang: DEST/sglang = the installed (or --source) sglang + the series.

    python tools/make_fork_tree.py /tmp/fork-tree
    PYTHONPATH=/tmp/fork-tree python -m pytest tests/patches ...   # mode (b): the fork shadows site-packages

With PYTHONPATH=DEST the patched copy shadows the installed sglang (package metadata still
comes from the installed dist-info, so the version is the same); eagle3_patches.apply() then
finds the marker of every patch in the source and reports each one `in-source`, changing
nothing at run time.  --upto NAME stops after one patch, named as in the registry (or by its diff's
file name, NAME.patch): a starting point for tools/regen_patch.py.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from eagle3_patches import fork  # noqa: E402
from eagle3_patches.errors import Eagle3Error  # noqa: E402


def make_fork_tree(
    dest: Path, source: Path | None = None, series: str = fork.DEFAULT_SERIES, upto: str | None = None, out=print
) -> Path:
    src = fork.check_sglang_root(source or fork.default_sglang_root())
    target = Path(dest) / "sglang"
    if target.exists():
        raise fork.ForkError(f"eagle3-patches: {target} exists already; remove it or choose another DEST")
    Path(dest).mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__"))
    try:
        fork.apply_series(target, series, upto=upto, out=out)
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make_fork_tree.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path)
    parser.add_argument("--source", type=Path, help="the sglang package dir to copy (default: the installed one)")
    parser.add_argument("--series", default=fork.DEFAULT_SERIES)
    parser.add_argument(
        "--upto",
        metavar="NAME",
        help="apply the series only up to and including this patch (its name, or its file NAME.patch)",
    )
    args = parser.parse_args(argv)
    try:
        target = make_fork_tree(args.dest, args.source, args.series, args.upto)
    except Eagle3Error as exc:
        print(str(exc), file=sys.stderr)
        return 1
    print(f"patched copy at {target}; use it with PYTHONPATH={args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
