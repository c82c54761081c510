"""``eagle3-patches probe-report FILE_OR_DIR...``: summarise the diagnostic probe's records.

Exit status: 0 every hop has the width the draft expects, 1 a hop is wrong (the first one is
named with its likely cause), 2 usage error or unreadable probe files.
"""

from __future__ import annotations

import argparse
import sys

from .._shipped import doc_pointer

EPILOG = f"""\
examples:
  eagle3-patches run --probe /tmp/probe -- python -m sglang.launch_server ... --speculative-algorithm EAGLE3
  eagle3-patches probe-report /tmp/probe
  eagle3-patches probe-report /tmp/probe/probe-1234.jsonl --json

The probe writes one JSON line per process, hop (target_output, draft_input) and forward mode.
Symptoms, checks and fixes: {doc_pointer("troubleshooting")}.
"""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "probe-report",
        help="summarise the probe's records (eagle3-patches run --probe) and name the first wrong hop",
        description="Read the JSON lines the diagnostic probe wrote (one file per process) and name the first hop "
        "of the EAGLE-3 path whose width is wrong, with the likely cause.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("paths", nargs="+", metavar="FILE_OR_DIR", help="probe files, or directories of probe-<pid>.jsonl")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    from ..probe_report import ProbeReportError, report

    try:
        result = report(args.paths)
    except ProbeReportError as exc:
        print(f"eagle3-patches probe-report: {exc}", file=sys.stderr)
        return 2
    print(result.to_json() if args.json else result.format())
    return result.exit_code
