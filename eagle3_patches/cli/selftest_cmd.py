"""``eagle3-patches selftest``: the upgrade regression check against the installed sglang, on this machine's device.

Exit status: 0 every check that could run passed (skipped ones say why), 1 a check failed (or sglang /
torch cannot be imported), 2 usage error.
"""

from __future__ import annotations

import argparse
import sys

from .._shipped import doc_pointer

EPILOG = f"""\
examples:
  eagle3-patches selftest                        # every check; a table, exit 0 / 1
  eagle3-patches selftest --json > selftest.json # for a deployment script
  eagle3-patches selftest --only cuda_graph_replay --only eagle3_fc_guard
  eagle3-patches selftest --attention-backend fa3 --dtype bfloat16   # on a GPU: what the server runs

Each check runs in its own processes, on stock sglang and with the patch set on, on tiny models built
locally (nothing is downloaded).  Without a CUDA device the CPU profile is used and the GPU checks are
skipped, each with its reason.  The procedure on an upgrade: {doc_pointer("upgrading")}.
"""


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < v <= 86400:
        raise argparse.ArgumentTypeError(f"must be in 0 < S <= 86400: {text}")
    return v


def _jobs(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1: {text!r}")
    return int(text)


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "selftest",
        help="after an upgrade: is each patch still needed, and does EAGLE-3 still work, on this sglang and device",
        description="The upgrade regression check: per patch, the bug on stock sglang and the behaviour with the patch "
        "set on; end to end on tiny models; on a CUDA device, CUDA graphs, the attention backend and dtype, TP 2.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", action="store_true", help="the report as JSON on stdout")
    p.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help="run only this check (a check name, or a patch name: its checks); repeatable, or comma separated",
    )
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=600.0,
        metavar="S",
        help="seconds one check may take before it fails (default 600)",
    )
    p.add_argument("--jobs", type=_jobs, default=1, metavar="N", help="checks run at once (default 1)")
    p.add_argument(
        "--attention-backend",
        metavar="NAME",
        help="CUDA: the attention backend your server runs (default: sglang's choice)",
    )
    p.add_argument("--dtype", metavar="DTYPE", help="CUDA: the dtype your server runs (default bfloat16)")
    p.add_argument("--list", action="store_true", help="list the checks and exit")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    from ..selftest import CHECKS
    from ..selftest.checks import uncovered
    from ..selftest.report import as_json, render
    from ..selftest.runner import run_selftest, select
    from ..terminal import escape_terminal

    if args.list:
        for c in CHECKS:
            needs = f" [needs {', '.join(c.needs)}]" if c.needs else ""
            print(f"{c.name:<34} {c.title}{needs}")
        for name, why in uncovered().items():
            print(f"{name:<34} (no check: {why})")
        return 0
    only = [n.strip() for item in (args.only or []) for n in item.split(",") if n.strip()]
    try:
        select(only)
    except KeyError as exc:
        print(
            f"eagle3-patches selftest: unknown check or patch {escape_terminal(exc.args[0])!s}; known checks: "
            f"{', '.join(c.name for c in CHECKS)}",
            file=sys.stderr,
        )
        return 2

    def progress(result, done: int, total: int) -> None:
        print(f"[{done}/{total}] {result.name}: {result.status} ({result.seconds:.1f}s)", file=sys.stderr, flush=True)

    report = run_selftest(
        only or None,
        timeout=args.timeout,
        jobs=args.jobs,
        attention_backend=args.attention_backend,
        dtype=args.dtype,
        progress=progress,
    )
    print(as_json(report) if args.json else render(report))
    return report["exit_code"]
