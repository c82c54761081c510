"""``eagle3-patches apply``: put the patch set into sglang's source (the fork path), check, or revert.

Exit codes: 0 done (or, with ``--check``, everything applies / is applied already); 1 refused
(wrong release, a file that differs from the release, an inconsistent series): nothing written.
"""

from __future__ import annotations

import argparse
import json

from .. import fork


def add_parser(sub) -> None:
    p = sub.add_parser(
        "apply",
        help="apply the fork-path diffs to an sglang tree (checked, idempotent, atomic); --check, --revert",
        description="Apply the patch series (a unified diff for each patch of the fork series: those that change "
        "sglang's source, not the library's own checks) to sglang's source files. Refuses, changing nothing, unless "
        "the tree is the pinned sglang release (version and per-file checksums).",
        epilog="examples:\n"
        "  eagle3-patches apply --check      # what would change in the installed sglang; nothing written\n"
        "  eagle3-patches apply              # apply (idempotent, atomic)\n"
        "  eagle3-patches apply --revert --sglang-root ~/src/sglang/python/sglang\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--sglang-root",
        metavar="PATH",
        help="the sglang package directory (site-packages/sglang, or python/sglang in a git checkout); "
        "default: the installed sglang, found without importing it",
    )
    p.add_argument("--check", action="store_true", help="dry run: say what would change, write nothing")
    p.add_argument("--revert", action="store_true", help="remove the applied patches, restoring the release's files")
    p.add_argument(
        "--series",
        default=fork.DEFAULT_SERIES,
        metavar="NAME",
        help=f"the patch series (a shipped series name, or a directory); default {fork.DEFAULT_SERIES}",
    )
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.set_defaults(func=run)


def run(args) -> int:
    report = fork.apply_series(
        args.sglang_root,
        args.series,
        check=args.check,
        revert=args.revert,
        out=None if args.json else print,
    )
    if args.json:
        print(
            json.dumps(
                {
                    "root": str(report.root),
                    "series": report.series,
                    "mode": report.mode,
                    "sglang": report.version,
                    "patches": [vars(o) for o in report.outcomes],
                    "changed": report.changed,
                    "recovered": report.recovered,
                },
                # pragma: no mutate core/NumberReplacer: the indentation of `--json`'s document: a JSON reader ignores
                # it (the test reads the document back)
                indent=2,
            )
        )
    return 0
