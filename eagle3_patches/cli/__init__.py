"""``eagle3-patches`` command line: run, status, doctor, selftest, convert, apply, probe-report, measure-accept,
bench, tune, docs.

User mistakes (:class:`~eagle3_patches.errors.Eagle3Error`) print a message (control
characters escaped) and exit 1; usage errors exit 2; an interrupt exits 128 + the signal
number (130 for Ctrl-C; ``convert`` turns SIGTERM and SIGHUP into the same cleanup);
nothing prints a traceback unless ``EAGLE3_PATCHES_DEBUG=1``.
"""

from __future__ import annotations

import argparse
import sys

from .. import settings
from ..errors import Eagle3Error
from ..version import __version__


class UsageError(Eagle3Error):
    """A command line that cannot be run as given: the subcommand's usage line, exit status 2 (argparse's)."""


def build_parser() -> argparse.ArgumentParser:
    from . import (
        apply_cmd,
        convert_cmd,
        docs_cmd,
        doctor_cmd,
        measure_accept_cmd,
        probe_report_cmd,
        run_cmd,
        selftest_cmd,
        status_cmd,
        tune_cmd,
    )

    parser = argparse.ArgumentParser(
        prog="eagle3-patches",
        description="Make EAGLE-3 speculative decoding work on stock SGLang for Kimi-K2.5 / DeepSeek-V3 targets.",
        epilog="documentation: eagle3-patches docs (the pages), eagle3-patches docs PAGE (one page)",
    )
    parser.add_argument("--version", action="version", version=f"eagle3-patches {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    # each module registers one subcommand; add new ones to this tuple
    from . import bench_cmd

    for module in (
        run_cmd,
        status_cmd,
        doctor_cmd,
        selftest_cmd,
        convert_cmd,
        apply_cmd,
        probe_report_cmd,
        measure_accept_cmd,
        bench_cmd,
        tune_cmd,
        docs_cmd,
    ):
        module.add_parser(sub)
    for subparser in sub.choices.values():
        subparser.set_defaults(parser=subparser)  # a subcommand's usage error shows its own usage line
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        args.parser.error(str(exc))  # argparse's usage line and exit status 2: it does not return
        raise AssertionError("unreachable") from None
    except Eagle3Error as exc:
        if settings.current().debug:
            raise
        from ..terminal import error_text

        print(error_text(exc), file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # SIGINT, or SIGTERM / SIGHUP where a command turns them into this
        return 128 + getattr(exc, "signum", 2)
